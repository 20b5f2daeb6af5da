"""What the tests share besides fixtures: the repository root, the tiny run's config, the command builders and
process helpers for runs in subprocesses (torchrun, horovodrun, the launcher's two local hosts), and the
auto-tuner's test driver."""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from base import registry  # noqa: E402
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


@functools.cache
def started(*argv: str, cwd: Path = ROOT) -> tuple[int, str]:
    """(exit code, stdout and stderr) of a command started from the repository root as a user types it. Each
    distinct command starts once per test session: the docs' commands and the entry points share their `--help`."""
    env = quiet_env()
    env.pop("PYTHONPATH", None)  # a user's shell has none: with the root on it, a script's missing bootstrap hides
    p = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    return p.returncode, p.stdout + p.stderr


def start_all(commands, cwd: Path = ROOT) -> None:
    """Start every command at once (a thread per subprocess, as many as the machine has cores, at least 4): each
    is a Python start-up that imports torch, so in series they would take a second or two apiece."""
    with ThreadPoolExecutor(max(4, os.cpu_count() or 1)) as pool:
        list(pool.map(lambda argv: started(*argv, cwd=cwd), sorted(set(commands))))


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
    if not (ROOT / "lab" / "netlab.py").is_file():
        return "lab/netlab.py (the network lab, issue 5) is not in this tree"
    from lab import netlab

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


# The plug-ins a test runs every one of, from their records: the backends torchrun starts (Horovod's horovodrun has
# its own tests), and the input pipelines over data.root's folders (synthetic makes its own batches).
TORCHRUN_BACKENDS = [n for n, r in registry.ALLREDUCE_BACKENDS.items() if r.launcher == "torchrun"]
FOLDER_PIPELINES = [n for n, r in registry.INPUT_PIPELINES.items() if r.reads_folders]

# The contract of an optimizer a test builds by hand (base/registry.py's records are the trainer's): torch's
# unfused optimizers have no found_inf, so the step decides on the host.
HOST_DECIDES = registry.Optimizer("made_up_torch_unfused", "", (), skips_on_device=False)


# The smallest network with the parts a compiled training step must handle (a convolution, BatchNorm with its
# running statistics, a classifier): compile tests take seconds instead of resnet10t's minutes of inductor.
TWO_LAYER = registry.Model("made_up_two_layer", "made_up_two_layer", "conv-BN-linear")


def _two_layer(pretrained: bool = False, num_classes: int = 1000, drop_rate: float = 0.0, **_) -> torch.nn.Module:
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(drop_rate),
        nn.Linear(8, num_classes),
    )


def register_two_layer(monkeypatch) -> str:
    """TWO_LAYER as a model.name for this test: a record, a name the schema accepts (configs and the checkpoint's
    config load with it) and a network timm builds by name, as models/factory.py asks."""
    from typing import Literal

    import timm.models

    from recipes.config import schema

    if not timm.models.is_model(TWO_LAYER.arch):
        _two_layer.__name__ = TWO_LAYER.arch
        timm.models.register_model(_two_layer)
    monkeypatch.setitem(registry.MODELS, TWO_LAYER.name, TWO_LAYER)
    monkeypatch.setattr(schema, "ModelName", Literal[tuple(registry.MODELS)])
    return TWO_LAYER.name


def optim_record(optimizer: torch.optim.Optimizer) -> registry.Optimizer:
    """The record of an optimizer built in a test: torch's fused SGD is `sgd`, LayerAdaptiveSGD `lars`, an unfused
    torch optimizer `HOST_DECIDES`."""
    from recipes.lars import LayerAdaptiveSGD

    if isinstance(optimizer, LayerAdaptiveSGD):
        return registry.OPTIMIZERS["lars"]
    if isinstance(optimizer, torch.optim.SGD) and optimizer.defaults.get("fused"):
        return registry.OPTIMIZERS["sgd"]
    if optimizer.defaults.get("fused"):
        raise AssertionError(f"no record for fused {type(optimizer).__name__}: build one in the test")
    return HOST_DECIDES


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


# -- a CPU stand-in for CUDA graphs (recipes/steps.py GraphStep's capture path) --------------------------------------


class FakeCudaGraphs:
    """torch.cuda's graph, stream, event and pool API on the CPU, keeping what a capture freezes.

    A capture runs the body once under a dispatch mode that records every aten op with its arguments and computes
    nothing that outlives it: the tensors the body wrote are put back afterwards, as a capture runs no kernel. A host
    read inside the capture raises, as CUDA refuses it on a capturing stream. A replay runs the recorded ops again on
    the same tensors (the graph's fixed addresses), with every Python number baked in at capture: a learning rate
    left a float is frozen, a 0-dim tensor is read afresh. Memory pools follow the caching allocator's rule: a pool
    whose graphs are all gone but which still holds a live block cannot be captured into again; a library workspace
    made by the first matmul on the shared capture stream (cuBLAS's) is such a block. `fail_capture` makes captures
    raise. A capture refuses `.item()`, `.tolist()` and `.numpy()` (each a device-to-host copy).

    Streams order work as CUDA's do: a stream remembers the tensors it wrote (in-place writes under
    `torch.cuda.stream(s)`), and until another stream has called `wait_stream(s)` those tensors hold NaN there (the
    stale bytes a real read could see; integer tensors are only remembered), so a read without the wait shows up as a
    non-finite value. Events complete when `tail()` says the work enqueued before their record has finished
    (always, unless a test sets `tail`): `query()` answers at once, `synchronize()` blocks until then (for at most
    `block_s`, then raises, where a real one would block for good). Counts: streams made, captures, replays, events
    waited for (seen complete by `query` or `synchronize`)."""

    def __init__(self, written, fail_capture: bool = False):
        self.written = written  # () -> the tensors a step may write (parameters, buffers, optimizer state, scaler)
        self.fail_capture = fail_capture
        self.streams = 0
        self.captured: list[tuple] = []
        self.replays = 0
        self.synced = 0
        self.pools: dict[int, dict] = {}  # the allocator's live pools: id -> {"graphs": n, "blocks": [weakref]}
        self.workspaces: dict[int, torch.Tensor] = {}  # a library's workspace per stream (cuBLAS's)
        self.capture_stream = object()  # torch.cuda.graph's default capture stream: one for every capture
        self.tail = lambda: True  # () -> whether the work enqueued so far has finished (a test may hold it back)
        self.block_s = 60.0  # how long a stand-in `Event.synchronize` blocks on unfinished work before it raises
        self.main = self.current = None  # the default stream, and the thread's current one (set by `install`)

    def install(self, setattr) -> None:
        """Replace torch.cuda's names (`setattr`: monkeypatch.setattr, undone by the test)."""
        fake = self

        class Stream:
            def __init__(self, device=None, counted=True):
                fake.streams += counted
                self.unsynced: dict[int, tuple] = {}  # id -> (tensor it wrote, the value written) not yet waited for

            def wait_stream(self, other):
                if other is not self:
                    other._publish()

            def _publish(self) -> None:
                """Another stream has waited for this one: what it wrote is visible (the values come back)."""
                with torch.no_grad():
                    for t, value in self.unsynced.values():
                        t.copy_(value)
                self.unsynced.clear()

        class Event:
            def __init__(self, *a, **kw):
                self.done, self.seen = (lambda: True), False

            def record(self, stream=None):
                self.done = fake.tail

            def query(self):
                if self.done() and not self.seen:
                    self.seen = True
                    fake.synced += 1
                return self.seen

            def synchronize(self):
                deadline = time.monotonic() + fake.block_s
                while not self.query():
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"stand-in Event.synchronize: work unfinished after {fake.block_s:g} s")
                    time.sleep(0.01)

        class CUDAGraph:
            def __init__(self):
                self.tape, self.pool = [], None

            def replay(self):
                fake.replays += 1
                with torch.no_grad():
                    for func, args, kwargs, out in self.tape:
                        result = func(*args, **kwargs)
                        _refill(func, args, out, result)

            def __del__(self):
                if self.pool is not None:
                    fake._release(self.pool)

        setattr(torch.cuda, "Stream", Stream)
        setattr(torch.cuda, "Event", Event)
        self.main = self.current = Stream(counted=False)
        setattr(torch.cuda, "current_stream", lambda device=None: fake.current)
        setattr(torch.cuda, "stream", lambda s: _OnStream(fake, s))
        setattr(torch.cuda, "CUDAGraph", CUDAGraph)
        setattr(torch.cuda, "graph_pool_handle", lambda: fake._new_pool())
        setattr(torch.cuda, "graph", lambda graph, pool=None, **kw: _Capture(fake, graph, pool))

    def _new_pool(self) -> int:
        self.pool_ids = getattr(self, "pool_ids", 0) + 1
        self.pools[self.pool_ids] = {"graphs": 0, "blocks": []}
        return self.pool_ids

    def _release(self, pid: int) -> None:
        pool = self.pools.get(pid)
        if pool is None:
            return
        pool["graphs"] -= 1
        if pool["graphs"] == 0 and not any(r() is not None for r in pool["blocks"]):
            del self.pools[pid]  # every block freed: empty_cache returns the pool

    def _begin(self, pid: int | None) -> int:
        import gc

        gc.collect()  # torch.cuda.graph calls empty_cache first: free what can be freed
        for p in [p for p, v in self.pools.items() if v["graphs"] == 0]:
            if not any(r() is not None for r in self.pools[p]["blocks"]):
                del self.pools[p]
        if pid is None:
            pid = self._new_pool()
        elif pid in self.pools and self.pools[pid]["graphs"] == 0:
            raise RuntimeError("it->second->use_count > 0 INTERNAL ASSERT FAILED (CUDACachingAllocator.cpp)")
        elif pid not in self.pools:
            self.pools[pid] = {"graphs": 0, "blocks": []}
        self.pools[pid]["graphs"] += 1
        return pid


class _OnStream:
    """`with torch.cuda.stream(s)`: `s` is current; it sees its own earlier writes, and the tensors written in place
    inside hold NaN for every other stream until one waits for `s` (FakeCudaGraphs' stream rule)."""

    def __init__(self, fake: FakeCudaGraphs, stream):
        self.fake, self.stream = fake, stream

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        fake, stream = self.fake, self.stream
        written = self.written = {}
        self.prev, fake.current = fake.current, stream
        stream._publish()  # a stream reads what it wrote itself

        class Writes(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                for t in _written_args(func, args, kwargs):
                    written[id(t)] = t
                return out

        self.mode = Writes()
        self.mode.__enter__()
        return stream

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        self.fake.current = self.prev
        with torch.no_grad():
            for t in self.written.values():
                self.stream.unsynced[id(t)] = (t, t.detach().clone())
                if t.is_floating_point():
                    t.fill_(float("nan"))
        return False


def _written_args(func, args, kwargs) -> list[torch.Tensor]:
    """The tensors an aten op writes in place (its schema's mutable arguments)."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        value = kwargs.get(a.name) if a.kwarg_only or i >= len(args) else args[i]
        for t in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(t, torch.Tensor):
                out.append(t)
    return out


def _refill(func, args, out, result) -> None:
    """Put a replayed op's result where the capture's output lives (a graph writes the same addresses)."""
    if func._schema.is_mutable or func.overloadpacket in _NO_KERNEL:
        return  # in place: it wrote its argument again; an allocation runs no kernel
    outs = out if isinstance(out, (list, tuple)) else [out]
    results = result if isinstance(result, (list, tuple)) else [result]
    for o, r in zip(outs, results, strict=True):
        if isinstance(o, torch.Tensor) and o.data_ptr() != r.data_ptr():
            o.copy_(r)


_NO_KERNEL = (
    torch.ops.aten.empty,
    torch.ops.aten.empty_like,
    torch.ops.aten.empty_strided,
    torch.ops.aten.new_empty,
    torch.ops.aten.new_empty_strided,
)
_MATMULS = (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm)


def _refused(name: str):
    def read(self, *a, **kw):
        raise RuntimeError(f"operation not permitted when stream is capturing (Tensor.{name}: a host read)")

    return read


class _Capture:
    """`with torch.cuda.graph(graph, pool=...)`: records the body's aten ops into `graph.tape`."""

    def __init__(self, fake: FakeCudaGraphs, graph, pool):
        self.fake, self.graph, self.pool = fake, graph, pool

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        fake, graph = self.fake, self.graph
        pid = fake._begin(self.pool)
        graph.pool = pid
        blocks = fake.pools[pid]["blocks"]
        self.before = [(t, t.detach().clone()) for t in fake.written()]
        if fake.fail_capture:
            raise RuntimeError("CUDA error: out of memory (stand-in capture failure)")

        class Record(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func is torch.ops.aten._local_scalar_dense.default:
                    raise RuntimeError("operation not permitted when stream is capturing (a host read of a tensor)")
                if func.overloadpacket in _MATMULS and id(fake.capture_stream) not in fake.workspaces:
                    ws = torch.empty(8)  # the library's workspace, from this capture's pool, kept for good
                    fake.workspaces[id(fake.capture_stream)] = ws
                    blocks.append(weakref.ref(ws))
                out = func(*args, **kwargs)
                graph.tape.append((func, args, kwargs, out))
                for t in out if isinstance(out, (list, tuple)) else [out]:
                    if isinstance(t, torch.Tensor):
                        blocks.append(weakref.ref(t))
                return out

        self.mode = Record()
        self.mode.__enter__()
        self.host_reads = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy")}
        for name in self.host_reads:  # no aten op: refused by name, as CUDA refuses the copy they make
            setattr(torch.Tensor, name, _refused(name))
        return self

    def __exit__(self, *exc):
        for name, real in self.host_reads.items():
            setattr(torch.Tensor, name, real)
        self.mode.__exit__(*exc)
        with torch.no_grad():  # a capture ran no kernel: what the body wrote is as it was
            for t, b in self.before:
                t.copy_(b)
        if exc[0] is None:
            self.fake.captured.append(len(self.graph.tape))
        return False


class NoComm:
    """A step's allreduce backend with nothing to reduce (one process): what StepRunner and GraphStep call on it."""

    def on_step_end(self, step, log=None):
        return None
