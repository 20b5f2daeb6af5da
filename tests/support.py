"""What the tests share besides fixtures: the repository root, the tiny run's config, the command builders and
process helpers for runs in subprocesses (torchrun, horovodrun, the launcher's two local hosts), and the
auto-tuner's test driver."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from recipes.config import load_config  # noqa: E402

TINY_CONFIG = ROOT / "tests" / "tiny.yaml"


def _dotted(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in tree.items():
        if isinstance(v, dict):
            out += _dotted(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}")
    return out


# tests/tiny.yaml's values (not its phases or run name) as `key=value` arguments for train.py from another config.
TINY_OVERRIDES = [
    o
    for o in _dotted({k: v for k, v in yaml.safe_load(TINY_CONFIG.read_text()).items() if k != "extends"})
    if not o.startswith(("phases=", "run.name="))
]


def tiny_config(root: Path, out_dir: Path, *overrides: str):
    """tests/tiny.yaml (trains in seconds on CPU: resnet10t at 32 px, 2 epochs) on dataset `root`."""
    return load_config(TINY_CONFIG, [f"data.root={root}", f"run.out_dir={out_dir}", *overrides])


def input_args(cfg) -> dict:
    """What `data.create_input(cfg.data, dist, ...)` takes from the rest of the config, as the trainer passes it."""
    return {"phases": cfg.phases, "seed": cfg.run.seed, "channels_last": cfg.run.channels_last, "amp": cfg.run.amp}


def input_from(cfg, dist, **kw):
    """`data.create_input` for a whole config, called as the trainer calls it."""
    from data import create_input

    return create_input(cfg.data, dist, **input_args(cfg), **kw)


def run_context(cfg):
    """The same as the `run` argument of a pipeline class built directly (`DaliPipeline(cfg.data, dist, run, ...)`)."""
    from data import RunContext

    return RunContext(**input_args(cfg))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quiet_env(**extra: str) -> dict:
    """The environment of a subprocess run: one thread per process, unbuffered output."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


def torchrun_argv(nproc: int, *args: str, max_restarts: int | None = None) -> list[str]:
    """`torchrun --nproc-per-node nproc [--max-restarts N] <args>` on a free loopback port."""
    restarts = ["--max-restarts", str(max_restarts)] if max_restarts is not None else []
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        *restarts,
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        *args,
    ]


def torchrun(nproc: int, args: list[str], timeout: float = 600, env: dict | None = None, cwd: Path = ROOT):
    """Run `torchrun --nproc-per-node nproc <args>` for real; returns the CompletedProcess."""
    full_env = quiet_env(**(env or {}))
    return subprocess.run(
        torchrun_argv(nproc, *args), cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def torchrun_cmd(max_restarts: int, *train_args: str) -> list[str]:
    """train.py under torchrun with two local ranks."""
    return torchrun_argv(2, "train.py", *train_args, max_restarts=max_restarts)


def wait_for_step(run_dir: Path, proc: subprocess.Popen, step: int, timeout: float = 300) -> None:
    """Wait until the run in `run_dir` (started as `proc`) has done `step` optimizer steps (its progress.json);
    AssertionError with the job's output if it ends first, or when `timeout` seconds pass."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            if json.loads((run_dir / "progress.json").read_text())["step"] >= step:
                return
        except (OSError, ValueError, KeyError):
            pass
        if proc.poll() is not None:
            raise AssertionError(f"the job ended before step {step}: {(proc.stderr or proc.stdout).read()[-3000:]}")
        time.sleep(0.02)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def rank_results(out: Path, nproc: int, output: str) -> list[dict]:
    """The `rank<r>.json` each rank of a worker (tests/comm_worker.py, tests/train_worker.py) wrote in `out`;
    AssertionError with `output` (the processes' output) for a rank that wrote none, or with a rank's exception."""
    results = []
    for r in range(nproc):
        f = out / f"rank{r}.json"
        assert f.is_file(), f"rank {r} wrote nothing:\n{output}"
        results.append(json.loads(f.read_text()))
        assert "exception" not in results[-1], results[-1]["exception"]
    return results


def start_torchrun(max_restarts: int, *train_args: str) -> subprocess.Popen:
    """train.py under torchrun with two local ranks, started in the background in a session of its own (so that a
    test can signal a worker, then kill what is left with os.killpg)."""
    return subprocess.Popen(
        torchrun_cmd(max_restarts, *train_args),
        cwd=ROOT,
        env=quiet_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out.append(int(d.name))
    return out


def worker_pid(root: int, rank: int) -> int | None:
    """The train.py process of `rank` among the descendants of `root` (None: not started yet)."""
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            env = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            env = []
        if f"RANK={rank}".encode() in env and pid != root:
            if b"train.py" in (Path("/proc") / str(pid) / "cmdline").read_bytes():
                return pid
        todo.extend(_children(pid))
    return None


def two_local_hosts(tmp_path: Path) -> Path:
    """A hostfile naming two 'hosts' on this machine (the launcher's local transport)."""
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("# two 'hosts' on this machine\nhost-a addr=127.0.0.1\nhost-b addr=127.0.0.1\n")
    return hostfile


def _netlab_missing() -> str | None:
    if not (ROOT / "scripts" / "netlab.py").is_file():
        return "scripts/netlab.py (the network lab, issue 5) is not in this tree"
    from scripts import netlab

    return netlab.available()


NETLAB_MISSING = _netlab_missing()


def _horovod_missing() -> str | None:
    from recipes.comm.horovod_backend import INSTALL_HINT

    try:
        import horovod.torch  # noqa: F401
    except ImportError as e:
        return f"horovod is not installed ({e}): {INSTALL_HINT}"
    if shutil.which("horovodrun", path=str(Path(sys.executable).parent)) is None:
        return "horovodrun is not next to this Python"
    return None


HOROVOD_MISSING = _horovod_missing()
needs_horovod = pytest.mark.skipif(HOROVOD_MISSING is not None, reason=str(HOROVOD_MISSING))


def horovodrun(np_: int, args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    bindir = Path(sys.executable).parent
    cmd = [str(bindir / "horovodrun"), "--gloo", "-np", str(np_), "-H", f"localhost:{np_}", sys.executable, *args]
    env = quiet_env(PATH=f"{bindir}:{os.environ['PATH']}")
    env.pop("RANK", None)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def tuner(space, start, **kw):
    """A `recipes.comm.tuner.AutoTuner` over `space` from `start`; short windows unless `kw` says otherwise."""
    from recipes.comm.tuner import AutoTuner

    args = {"max_candidates": 2, "warmup_steps": 0, "steps_per_window": 1, "windows": 1, "method": "grid"} | kw
    return AutoTuner(space, start, **args)


def drive_tuner(t, cost, outlier_every: int = 0) -> tuple[list, int]:
    """Run the tuner `t` to the end the way the backend does (rank 0 proposes, everyone begins), each step taking
    `cost(settings)` seconds (plus 100 s every `outlier_every` steps); returns the settings in force at every step
    and the number of steps."""
    seen, steps = [], 0
    while not t.done:
        seen.append(t.current)
        seconds = cost(t.current)
        steps += 1
        if outlier_every and steps % outlier_every == 0:
            seconds += 100.0  # e.g. the first step after validation
        if t.record(seconds):
            nxt = t.propose()
            if nxt is None:
                t.done = True
            else:
                t.begin(nxt)
    return seen, steps


def trap_host_reads(monkeypatch) -> None:
    """Make every host read of a tensor (item, tolist, bool, float, numpy, cpu, ...) raise until monkeypatch.undo():
    a step that runs under it never waits on the device."""

    def trap(name):
        def raising(*args, **kwargs):
            raise AssertionError(f"host sync inside the step: Tensor.{name}")

        return raising

    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy", "cpu"):
        monkeypatch.setattr(torch.Tensor, name, trap(name))


# -- run directories written by hand (scripts/compare_runs.py) ----------------------------------------------------


def _fake_config(backend: str, epochs: int = 2, **extra) -> dict:
    cfg = {
        "run": {"name": f"r-{backend}", "out_dir": "runs", "seed": 0},
        "data": {"root": "/data/imagenet", "workers": 4},
        "optim": {"name": "sgd", "lr": 0.4},
        "comm": {"backend": backend, "autotune": backend == "multistream", "network": "10gbit"},
        "phases": [{"epochs": epochs, "image_size": 32, "batch_size": 8}],
    }
    for key, value in extra.items():
        section, name = key.split("__")
        cfg[section][name] = value
    return cfg


def _fake_history(epochs: int) -> list[dict]:
    return [
        {"epoch": e, "train_seconds": 10.0 * e, "wall_seconds": 12.0 * e, "top1": 20.0 * e, "top5": 40.0 * e,
         "images_per_s": 100.0, "val_count": 48}
        for e in range(1, epochs + 1)
    ]  # fmt: skip


def fake_run_dir(path, backend: str, *, epochs: int = 2, finished: bool = True, **extra):
    """A run directory as train.py leaves it (config.yaml, meta.json, dawnbench.tsv, summary.json unless not
    `finished`), written by hand for scripts/compare_runs.py's tests."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(_fake_config(backend, epochs, **extra)))
    (path / "meta.json").write_text(json.dumps({"world_size": 2}))
    history = _fake_history(epochs)
    tsv = "epoch\thours\ttop1\ttop5\n" + "".join(
        f"{r['epoch']}\t{r['train_seconds'] / 3600:.6f}\t{r['top1']:.2f}\t{r['top5']:.2f}\n" for r in history
    )
    (path / "dawnbench.tsv").write_text(tsv)
    if not finished:
        return path
    settings = {"bucket_mb": 8, "streams": 2, "slices": 1} if backend == "multistream" else {}
    comm = {"backend": backend, "steps": 20, "comm_seconds": 0.4, "wait_seconds": None, "bytes": 100,
            "settings": settings}  # fmt: skip
    summary = {
        "epochs": epochs, "steps": 20, "world_size": 2, "wall_seconds": 12.0 * epochs,
        "train_seconds": 10.0 * epochs, "images_per_s": 100.0, "final_top1": history[-1]["top1"],
        "final_top5": history[-1]["top5"], "val_count": 48, "val_excluded": 2, "comm_backend": backend,
        "comm": comm, "history": history,
    }  # fmt: skip
    (path / "summary.json").write_text(json.dumps(summary))
    return path
