"""What the tests share besides fixtures: the repository root, the tiny run's config, and the command builders and
process helpers for runs in subprocesses (torchrun, horovodrun, the launcher's two local hosts)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
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
