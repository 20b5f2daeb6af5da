"""What a benchmark's `--json PATH` writes: its measurements with the command, date, machine, torch version and
commit that produced them, so that a table in the docs can be regenerated and checked against its file
(docs/data/README.md lists them)."""

from __future__ import annotations

import os
import platform
import shlex
import sys
import time
from pathlib import Path

from base.errors import RunDirError
from base.writer import check_target, to_json, write_output

ROOT = Path(__file__).resolve().parents[2]


def add_json_arg(ap) -> None:
    ap.add_argument("--json", default="", metavar="PATH", help="also write every measurement to this JSON file")


def check_json(path: str) -> None:
    """Refuse an unwritable --json target before minutes of measuring (one line, exit status 2)."""
    if path:
        try:
            check_target(path, "--json")
        except RunDirError as e:
            sys.exit(f"error: {e}")


def commit() -> str:
    """The checkout's commit (12 hex digits), '+dirty' when tracked files differ from it (what ran is then not
    exactly that commit); `unknown` outside git."""
    from recipes.rundir.outputs import git_commit  # imports torch: not at the top, so that a script's --help is quick

    full = git_commit(ROOT)
    if full == "unknown":
        return full
    return full.removesuffix("-dirty")[:12] + ("+dirty" if full.endswith("-dirty") else "")


def cpu_model() -> tuple[str, bool]:
    """The CPU's model name and whether it has AVX-512 (CPU kernels, hence timings and rounding, differ without it)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), False
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "")
    return name or platform.machine(), " avx512f" in info


def write_json(path: str, module: str, argv: list[str] | None, results: dict) -> None:
    """Write `results` with what produced them; `argv` is the script's arguments (sys.argv[1:] when None)."""
    if not path:
        return
    import torch  # here, not at the top: a benchmark's --help starts without it

    args = sys.argv[1:] if argv is None else argv
    cpu, avx512 = cpu_model()
    doc = {
        "command": f"python -m {module} {shlex.join(args)}".strip(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "torch": torch.__version__,
        "commit": commit(),
        "machine": {
            "cpus": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "processor": cpu,
            "avx512": avx512,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "load_average": list(os.getloadavg()),
        },
        "results": results,
    }
    try:
        write_output(path, to_json(doc), "--json")
    except RunDirError as e:
        sys.exit(f"error: {e}")
    print(f"\njson: {path}")
