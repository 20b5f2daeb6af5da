"""One reader, one writer, enforced: every file the project's code writes goes through base/writer.py, and every
file it reads through base/reader.py, except the calls named in `EXCEPTIONS`, each with its reason.

The test walks the syntax tree of train.py, evaluate.py and each module in base/, recipes/, data/, scripts/, lab/ and
models/, and lists each call that writes a file (`open` for writing, `os.open`, `write_text`, `write_bytes`, `savefig`,
`json.dump`, `torch.save`, `shutil.copy*`/`move`, `os.replace`/`rename`/`link`/`symlink`, `Path.rename`,
`symlink_to`) or reads one (`open` for reading, `read_text`, `read_bytes`, `json.load`, `torch.load`, `np.load`,
`tarfile.open`, `zipfile.ZipFile`, `Image.open`, `loadmat`). A call outside the guarded modules fails the test
unless its function is named below; an exception whose function no longer makes such a call fails it too, so the
list stays true. Code that writes or reads beside the guarded paths is how planted links, FIFOs and devices got
past the checks before: review did not hold that line, this test does.
"""

from __future__ import annotations

import ast
from pathlib import Path

from support import ROOT

GUARDED = {"base/reader.py": "the one reader", "base/writer.py": "the one writer"}

_RUN_DIR = "the run directory's own writer package (no link followed, temp file and rename, checked by the lock)"
_PROC = "reads the kernel's /proc or /sys files, never a path a user gives"
_IMAGES = "the image writer: images are streamed to a temp file opened O_EXCL | O_NOFOLLOW and renamed"
_ARCHIVE = "reads a user's archive or image with its own library; members and sizes are checked as they are read"
_REPO = "a developer tool that regenerates a file of this repository (docs, presets) from its sources"
_GPU = "the GPU acceptance check reads the results and logs of the runs it started, in the work folder it made"
_OWN_LOGS = "reads the log files this tool itself wrote, in the run's launch/ folder"

# (file, function) -> why that function reads or writes a file itself. '<module>' is the module's top level.
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("recipes/rundir/checkpoint_files.py", "_digest"): "hashes a checkpoint in chunks (torch.load reads it next)",
    ("recipes/rundir/checkpoint_files.py", "_replace_verified"): _RUN_DIR,
    ("recipes/rundir/checkpoint_files.py", "save_atomic"): _RUN_DIR + ": torch.save streams into the temp file",
    ("recipes/rundir/checkpoint_files.py", "load"): "torch.load(weights_only=True) of a checkpoint, then checked",
    ("recipes/rundir/checkpoint_files.py", "to_bytes"): "torch.save into a BytesIO (a checkpoint sent to a rank)",
    ("recipes/rundir/checkpoint_files.py", "from_bytes"): "torch.load(weights_only=True) of bytes from a rank",
    ("recipes/rundir/checkpoint_files.py", "save_step_checkpoint"): _RUN_DIR + ": checkpoint.pt's hard link",
    ("recipes/rundir/checkpoint_files.py", "set_aside"): _RUN_DIR + ": another run's checkpoint moved aside",
    ("recipes/rundir/checkpoint_files.py", "run_of"): "torch.load(weights_only=True) to learn a checkpoint's run",
    ("recipes/rundir/checkpoint_files.py", "check_writable"): _RUN_DIR + ": the write probe, a new dot file",
    ("recipes/rundir/directory.py", "RunLock.acquire"): _RUN_DIR + ": the lock file (flock), opened O_NOFOLLOW",
    ("recipes/rundir/directory.py", "archive"): _RUN_DIR + ": a finished run's files moved to previous/<run id>/",
    ("recipes/rundir/directory.py", "_share_groups"): _RUN_DIR + ": each rank's share token, a new dot file",
    ("recipes/rundir/writer.py", "figure_bytes"): "savefig into a BytesIO (the bytes then go through write_output)",
    ("recipes/comm/tuner.py", "cache_store"): "the tuner cache: a temp file opened O_EXCL | O_NOFOLLOW, renamed",
    ("recipes/dawnbench.py", "write_entry"): "reads back the entry and table it has just written, to copy them",
    ("recipes/distributed.py", "rendezvous_endpoint"): _PROC,
    ("lab/netlab_flows.py", "established"): _PROC,
    # make install runs it before the project is known to import (the Dockerfile copies it alone): stdlib only
    ("scripts/check_install.py", "read_requirement_file"): "the reader's rules in the standard library, before install",
    ("recipes/distributed.py", "_thread_states"): _PROC,
    ("recipes/environment.py", "_driver"): _PROC,
    ("recipes/evaluation/latency.py", "describe_hardware"): _PROC,
    ("data/check.py", "open_image"): _ARCHIVE,
    ("data/check.py", "quick_problem"): _ARCHIVE,
    ("data/check.py", "inspect_file"): _ARCHIVE,
    ("data/labels.py", "devkit_blacklist_bytes"): _ARCHIVE,
    ("data/labels.py", "read_devkit"): _ARCHIVE,
    ("data/download.py", "_write_atomic"): _IMAGES,
    ("data/download.py", "extract_train"): _ARCHIVE,
    ("data/download.py", "extract_val"): _ARCHIVE,
    ("data/download.py", "_kaggle_tree"): _ARCHIVE,
    ("data/download.py", "_kaggle_zip"): _ARCHIVE,
    ("data/download.py", "place_kaggle"): _ARCHIVE,
    ("data/download.py", "from_download"): _ARCHIVE,
    ("data/prepare.py", "_resize_one"): _IMAGES,
    ("data/prepare.py", "sort_val"): "moves the user's own validation images into class folders (os.replace)",
    ("lab/bench_allreduce.py", "worker"): "a worker's result file in the bench's private temp folder",
    ("lab/bench_allreduce.py", "hvd_worker"): "a worker's result file in the bench's private temp folder",
    ("lab/bench_allreduce.py", "_run_torch"): "reads its workers' result files from its private temp folder",
    ("lab/bench_allreduce.py", "_run_horovod"): "reads its workers' result files from its temp folder",
    ("scripts/bench/bench_input.py", "cpu_seconds"): _PROC,
    ("scripts/bench/bench_input.py", "ensure_data"): "reads the sample.json that make_sample wrote for it",
    ("scripts/bench/bench_input.py", "dataset_line"): _ARCHIVE,
    ("scripts/bench/record.py", "cpu_model"): _PROC,
    ("scripts/gen_config_reference.py", "main"): _REPO,
    ("scripts/gen_presets.py", "readme_with"): _REPO,
    ("scripts/gen_presets.py", "main"): _REPO,
    ("scripts/gpu_check/gpu_check_env.py", "read_driver"): _PROC,
    ("scripts/gpu_check/gpu_check_env.py", "_children"): _PROC,
    ("scripts/gpu_check/gpu_check_env.py", "_alive"): _PROC,
    ("scripts/gpu_check/gpu_check_env.py", "run_logged"): "a child's output streamed into its log (Popen needs a file)",
    ("scripts/gpu_check/gpu_check_runs.py", "check_allreduce"): _GPU,
    ("scripts/gpu_check/gpu_check_runs.py", "_tuner_lines"): _GPU,
    ("scripts/gpu_check/gpu_check_runs.py", "judge_run"): _GPU,
    ("scripts/gpu_check/gpu_check_runs.py", "check_eval"): _GPU,
    ("scripts/horovod_toolkit.py", "_link_tree"): "links the toolkit's own build tree in a folder it creates",
    ("scripts/horovod_toolkit.py", "assemble"): "links the toolkit's own build tree in a folder it creates",
    ("scripts/launcher/linkprobe.py", "network_figures"): _OWN_LOGS,
    ("scripts/launcher/guard.py", "_process_table"): _PROC,
    ("scripts/launcher/job.py", "_Host._copy"): "appends a host's output to its log, opened O_APPEND | O_NOFOLLOW",
    ("scripts/launcher/netprobe.py", "main"): "the probe's figures: a temp file opened O_EXCL | O_NOFOLLOW, renamed",
    ("recipes/trainer.py", "Trainer.fit"): "checkpointer.save(step): the run directory's own checkpoint manager",
    ("recipes/trainer.py", "Trainer.train_one_epoch"): "checkpointer.save(step): the run directory's own manager",
    ("recipes/logger.py", "RunLogger.__init__"): "TensorBoard's own event writer, in the run directory the lock holds",
    ("lab/netlab.py", "NetLab._hosts_file"): "writes /etc/netns/<ns>/hosts of a namespace the lab creates",
}

# `.save(` is PIL's Image.save (and np.save / torch.save by another name; images are encoded in memory by
# base.writer.encoded); `to_csv`, `savez`, `tofile`, `savetxt` and `SummaryWriter(` write files too: each call of
# these names is listed, so a new writing library is seen.
_WRITE_ATTRS = {"write_text", "write_bytes", "savefig", "rename", "symlink_to", "hardlink_to", "save", "savez"}
_WRITE_ATTRS |= {"savez_compressed", "savetxt", "tofile", "to_csv", "to_parquet", "to_pickle", "imwrite"}
_READ_ATTRS = {"read_text", "read_bytes"}
_CALLS = {"json.dump", "json.load", "torch.save", "torch.load", "np.save", "np.load", "numpy.load", "pickle.dump"}
_CALLS |= {"pickle.load", "os.open", "os.replace", "os.rename", "os.link", "os.symlink", "tarfile.open"}
_CALLS |= {"zipfile.ZipFile", "Image.open", "scipy.io.loadmat", "loadmat", "SummaryWriter", "tensorboard.SummaryWriter"}
_CALLS |= {"gzip.open", "bz2.open", "lzma.open", "sqlite3.connect", "shelve.open", "h5py.File"}
_SHUTIL = {"copy", "copy2", "copyfile", "copytree", "move", "copyfileobj"}
_GUARDED_PREFIXES = ("reader.", "base.reader.", "writer.", "base.writer.")


def _dotted(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    return ""


def _mode(call: ast.Call, position: int) -> str | None:
    for kw in call.keywords:
        if kw.arg == "mode" and isinstance(kw.value, ast.Constant):
            return kw.value.value
    if len(call.args) > position and isinstance(call.args[position], ast.Constant):
        return call.args[position].value
    return None


def _access(call: ast.Call) -> str | None:
    """What file access `call` is ('write open(w)', 'read read_text', ...), or None."""
    name = _dotted(call.func)
    last = name.rsplit(".", 1)[-1]
    if name.startswith(_GUARDED_PREFIXES):
        return None
    if name in ("open", "io.open") or (last == "open" and isinstance(call.func, ast.Attribute) and name not in _CALLS):
        if name not in ("open", "io.open") and name.startswith(("os.", "tarfile.", "zipfile.", "Image.", "gzip.")):
            return None
        mode = _mode(call, 1 if name in ("open", "io.open") else 0)
        if not isinstance(mode, str):
            mode = "r"
        return f"{'write' if any(c in mode for c in 'wax+') else 'read'} open({mode})"
    if name in _CALLS:
        return name
    if name == "torch.onnx.export" and (len(call.args) > 2 or any(kw.arg == "f" for kw in call.keywords)):
        return "write torch.onnx.export"  # given a path, it writes the file itself (without one it returns a program)
    if name.startswith("shutil.") and last in _SHUTIL:
        return name
    if isinstance(call.func, ast.Attribute) and last in _WRITE_ATTRS:
        return f"write {last}"
    if isinstance(call.func, ast.Attribute) and last in _READ_ATTRS:
        return f"read {last}"
    return None


def file_accesses(source: str, filename: str) -> list[tuple[str, int, str]]:
    """(function, line, access) for every call in `source` that reads or writes a file itself."""
    out: list[tuple[str, int, str]] = []
    scope: list[str] = []

    class Visitor(ast.NodeVisitor):
        def _scoped(self, node):
            scope.append(node.name)
            self.generic_visit(node)
            scope.pop()

        visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

        def visit_Call(self, node: ast.Call):
            access = _access(node)
            if access is not None:
                out.append((".".join(scope) or "<module>", node.lineno, access))
            self.generic_visit(node)

    Visitor().visit(ast.parse(source, filename))
    return out


def scanned_files(root: Path) -> list[Path]:
    files = [root / "train.py", root / "evaluate.py"]
    for pkg in ("base", "recipes", "data", "scripts", "models", "lab"):
        files += sorted((root / pkg).rglob("*.py"))
    return files


def unguarded(root: Path) -> dict[tuple[str, str], list[str]]:
    """{(file, function): ['line N: access', ...]} of every access outside the guarded modules."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in scanned_files(root):
        rel = path.relative_to(root).as_posix()
        if rel in GUARDED:
            continue
        for function, line, access in file_accesses(path.read_text(), rel):
            found.setdefault((rel, function), []).append(f"line {line}: {access}")
    return found


def test_no_module_reads_or_writes_a_file_beside_the_reader_and_the_writer():
    found = unguarded(ROOT)
    beside = [f"{f}:{fn}: {', '.join(v)}" for (f, fn), v in sorted(found.items()) if (f, fn) not in EXCEPTIONS]
    assert not beside, (
        "files read or written beside base/reader.py and base/writer.py (use them, or name the function in "
        "EXCEPTIONS with its reason):\n  " + "\n  ".join(beside)
    )


def test_every_exception_is_still_needed_and_has_a_reason():
    found = unguarded(ROOT)
    stale = [f"{f}:{fn}" for f, fn in sorted(EXCEPTIONS) if (f, fn) not in found]
    assert not stale, "exceptions whose function no longer reads or writes a file itself:\n  " + "\n  ".join(stale)
    assert all(len(reason) >= 20 for reason in EXCEPTIONS.values())


def test_the_walk_finds_each_kind_of_access_in_an_offending_module(tmp_path):
    """What the walk must see (a temporary module under recipes/ that writes and reads beside the guarded paths)."""
    (tmp_path / "recipes").mkdir()
    (tmp_path / "train.py").write_text("")
    (tmp_path / "evaluate.py").write_text("")
    (tmp_path / "recipes" / "offender.py").write_text(
        "import json, os, shutil\n"
        "from pathlib import Path\n"
        "from base import reader\n"
        "def save(p, d):\n"
        "    Path(p).write_text(d)\n"
        "    with open(p, 'a') as f:\n"
        "        json.dump(d, f)\n"
        "    os.replace(p, p + '.old')\n"
        "    shutil.copy(p, p + '.bak')\n"
        "class Plot:\n"
        "    def draw(self, fig, p):\n"
        "        fig.savefig(p)\n"
        "def load(p):\n"
        "    reader.read_text(p, what='x')\n"  # guarded: not listed
        "    return open(p).read() + Path(p).read_bytes().decode()\n"
        "def images(img, arr, frame, p):\n"
        "    img.save(p, quality=90)\n"
        "    np.savez(p, a=arr)\n"
        "    frame.to_csv(p)\n"
        "    SummaryWriter(p)\n"
        "    torch.onnx.export(img, (arr,), p)\n"
        "    torch.onnx.export(img, (arr,), dynamo=True)\n"  # returns the program: writes nothing
    )
    found = unguarded(tmp_path)
    assert found == {
        ("recipes/offender.py", "save"): [
            "line 5: write write_text",
            "line 6: write open(a)",
            "line 7: json.dump",
            "line 8: os.replace",
            "line 9: shutil.copy",
        ],
        ("recipes/offender.py", "Plot.draw"): ["line 12: write savefig"],
        ("recipes/offender.py", "load"): ["line 15: read open(r)", "line 15: read read_bytes"],
        ("recipes/offender.py", "images"): [
            "line 17: write save",
            "line 18: write savez",
            "line 19: write to_csv",
            "line 20: SummaryWriter",
            "line 21: write torch.onnx.export",
        ],
    }
