"""Process-group setup from torchrun's environment, with timeouts so a dead peer fails fast."""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as td

from base.errors import DeviceError, TrainingError


@dataclass
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise RuntimeError(f"environment variable {name}={value!r}: expected an integer") from None


class ProcessSettings:
    """The process-wide settings a run changes (environment variables such as NCCL_LAUNCH_ORDER_IMPLICIT, torch's CPU
    thread count, deterministic algorithms), taken before `setup` and put back by `restore()` when the run ends, so
    that a caller training again in the same process (tests/train_worker.py's runs in turn, the tests) starts each
    run as a fresh process would."""

    def __init__(self):
        self.environ = dict(os.environ)
        self.threads = torch.get_num_threads()
        self.deterministic = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        )

    def restore(self) -> None:
        for name in set(os.environ) - set(self.environ):
            del os.environ[name]
        for name, value in self.environ.items():
            if os.environ.get(name) != value:
                os.environ[name] = value
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        enabled, warn_only = self.deterministic
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def setup(cfg, *, env: Mapping[str, str]) -> DistInfo:
    """Read RANK/WORLD_SIZE/LOCAL_RANK (set by torchrun), pick the device, init the process group.

    `env`: the allreduce backend's process environment (`recipes.comm.process_env(cfg.comm)`: horovod derives torchrun's
    variables from horovodrun's, the NCCL backends their socket settings), set before anything is read. The backends
    sit above this module (they use its collectives), so the caller asks them and hands the answer in."""
    os.environ.update(env)
    rank = _env_int("RANK", 0)
    world = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", 1)
    want = cfg.run.device
    if want == "cuda" and not torch.cuda.is_available():
        raise DeviceError("run.device: 'cuda' requested but no CUDA device is available")
    use_cuda = want == "cuda" or (want == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        # Every phase trains at one fixed shape: cuDNN picks the fastest convolution algorithm once per shape.
        torch.backends.cudnn.benchmark = True
    else:
        device = torch.device("cpu")
        threads = cfg.run.threads or max(1, (os.cpu_count() or 1) // local_world)
        torch.set_num_threads(threads)
    if (world > 1 or cfg.comm.engage_single_rank) and not td.is_initialized():
        backend = cfg.dist.backend
        if backend == "auto":
            backend = "nccl" if use_cuda else "gloo"
        timeout = datetime.timedelta(seconds=cfg.dist.timeout_s)
        # comm.engage_single_rank without torchrun: one process needs no rendezvous, an in-process store does
        alone = (
            {"store": td.HashStore(), "rank": 0, "world_size": 1}
            if world == 1 and "MASTER_ADDR" not in os.environ
            else {}
        )
        td.init_process_group(
            backend=backend,
            timeout=timeout,
            device_id=device if use_cuda else None,
            **(alone or _elastic_store(rank, world, timeout)),
        )
    return DistInfo(rank, world, local_rank, local_world, device)


def _elastic_store(rank: int, world: int, timeout: datetime.timedelta) -> dict:
    """Under torchrun, a store namespace of its own for every generation of workers.

    The agents' store outlives a restart, and with several agents (multi-node) the workers of a new round could
    read the addresses the dead round's workers left there (gloo: "connection refused"). The namespace is the
    rendezvous round that started this generation (`generation_id`): every worker of a generation derives the
    same one without writing anything, so a worker that dies early cannot put the next generation out of step.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_ADDR" not in os.environ:
        return {}
    store = td.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=world, is_master=False, timeout=timeout
    )
    return {"store": td.PrefixStore(f"dawnbench/{generation_id(timeout)}", store), "rank": rank, "world_size": world}


# Set by every torchrun agent in the rendezvous store (c10d, at --rdzv-endpoint) once a round is complete and
# before its workers start: `torch.rendezvous.<run id>.<round>/torchelastic/role_info/<agent rank>`.
_ROUND_KEY = "torch.rendezvous.{run_id}.{round}/torchelastic/role_info/0"
_ROUND_GAP = 64  # rounds that closed without starting workers (a node joined and left) leave no key


def rendezvous_endpoint() -> tuple[str, int] | None:
    """torchrun's --rdzv-endpoint: DAWNBENCH_RDZV_ENDPOINT (the launcher sets it), else the agent's command line.

    The workers' own store (MASTER_ADDR:MASTER_PORT) is a different server that outlives the rounds and holds
    no round number; the rendezvous store does.
    """
    ep = os.environ.get("DAWNBENCH_RDZV_ENDPOINT")
    if not ep:
        try:
            argv = open(f"/proc/{os.getppid()}/cmdline", "rb").read().decode(errors="replace").split("\0")
        except OSError:
            return None
        for i, a in enumerate(argv):
            if a in ("--rdzv-endpoint", "--rdzv_endpoint") and i + 1 < len(argv):
                ep = argv[i + 1]
            elif a.startswith(("--rdzv-endpoint=", "--rdzv_endpoint=")):
                ep = a.split("=", 1)[1]
    if not ep:
        return None
    host, _, port = ep.rpartition(":")
    if not host or not port.isdigit():
        return (ep, 29400)  # torchrun's default port
    return (host.strip("[]"), int(port))


def rendezvous_round(store, run_id: str) -> int | None:
    """The newest complete rendezvous round of `run_id` in the rendezvous store; None when none is found.

    While a worker of round R lives, round R+1 cannot complete: it needs every agent, and an agent stops its
    own workers before it joins the next round. So the newest round with workers is this worker's own.
    """
    found, misses, r = None, 0, 0
    while misses < _ROUND_GAP:
        if store.check([_ROUND_KEY.format(run_id=run_id, round=r)]):
            found, misses = r, 0
        else:
            misses += 1
        r += 1
    return found


def generation_id(timeout: datetime.timedelta) -> str:
    """`round<R>` from the c10d rendezvous round, else `restart<N>` from the agent's own restart count.

    TORCHELASTIC_RESTART_COUNT alone is not enough with several agents: it counts the restarts of *this* agent
    (a healthy agent restarts its workers for a peer's failure without counting it), so agents disagree.
    """
    run_id, ep = os.environ.get("TORCHELASTIC_RUN_ID"), rendezvous_endpoint()
    if run_id and ep:
        try:
            rdzv = td.TCPStore(ep[0], ep[1], is_master=False, timeout=timeout, wait_for_workers=False)
            r = rendezvous_round(rdzv, run_id)
        except (RuntimeError, ValueError):  # not a c10d store there (static rendezvous): no rounds
            r = None
        if r is not None:
            return f"round{r}"
    return f"restart{_env_int('TORCHELASTIC_RESTART_COUNT', 0)}"


GLOO_WORKER = "pt_gloo_runloop"  # the name torch gives a gloo process group's worker threads


def teardown() -> None:
    """Destroy every process group, then wait until no gloo worker thread is still freeing a collective.

    A gloo worker thread frees a collective's tensors after `wait()` has returned, and freeing a tensor that
    Python also knew takes the GIL. If the process is already finalizing, the thread is ended while it asks for
    the GIL and the whole process aborts ("terminate called without an active exception") after its work is
    done. Destroying a group joins its threads only once nothing holds the group (torch's DDP keeps its group
    alive, and a reference cycle can too), so `wait_for_gloo_workers` waits for every gloo thread instead."""
    if not td.is_initialized():
        return
    td.destroy_process_group()
    wait_for_gloo_workers()


def abort_process_groups() -> None:
    """Abort every process group without waiting for its work: NCCL aborts its communicators, which ends kernels
    still waiting for a dead peer (a replayed collective nothing watches). Used right before a TrainingError; a
    backend that cannot abort (gloo raises) is left to the process's exit."""
    if not td.is_initialized():
        return
    try:
        td.distributed_c10d._abort_process_group()
    except (RuntimeError, ValueError, NotImplementedError):
        pass  # the error that follows names the wait; the exit tears the group down


def wait_for_gloo_workers(timeout_s: float = 2.0, tasks: Path = Path("/proc/self/task")) -> bool:
    """Sleep (the GIL free) until every gloo worker thread of this process sleeps, twice in a row: a thread
    still freeing a collective either runs or, with the GIL free, is woken to take it, so two quiet looks 10 ms
    apart mean each waits for new work. True once quiet; False after `timeout_s` (never an error: the caller is
    exiting), or at once where the kernel lists no threads (not Linux)."""
    if not tasks.is_dir():
        return False
    deadline, quiet = time.monotonic() + timeout_s, 0
    while time.monotonic() < deadline:
        time.sleep(0.01)
        quiet = quiet + 1 if all(state == "S" for state in _thread_states(tasks, GLOO_WORKER)) else 0
        if quiet == 2:
            return True
    return False


def _thread_states(tasks: Path, name: str) -> list[str]:
    """The scheduler state letter (R, S, D, ...) of each of this process's threads called `name`."""
    out = []
    for task in tasks.iterdir():
        try:
            if (task / "comm").read_text().strip() == name:
                out.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):
            continue  # a thread that ended meanwhile
    return out


def all_reduce_sum(values: list[float], dist: DistInfo) -> list[float]:
    """Sum a few numbers over ranks (float64 so that image counts stay exact)."""
    t = torch.tensor(values, dtype=torch.float64)
    if dist.enabled:
        if td.get_backend() == "nccl":
            t = t.to(dist.device)
        with collective_guard("all-reduce of run figures"):
            td.all_reduce(t)
    return t.cpu().tolist()


def broadcast_object(obj, dist: DistInfo, src: int = 0):
    if not dist.enabled:
        return obj
    box = [obj]
    with collective_guard(f"broadcast from rank {src}"):
        td.broadcast_object_list(box, src=src)
    return box[0]


def broadcast_bytes(data: bytes | None, src: int, dist: DistInfo) -> bytes:
    """Send `data` (given on rank `src`, None elsewhere) to every rank as one uint8 tensor; returns it everywhere."""
    if not dist.enabled:
        return data
    device = dist.device if td.get_backend() == "nccl" else torch.device("cpu")
    size = torch.tensor([len(data) if dist.rank == src else 0], dtype=torch.int64, device=device)
    with collective_guard(f"broadcast of a file from rank {src}"):
        td.broadcast(size, src=src)
        if dist.rank == src:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
        else:
            buf = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
        td.broadcast(buf, src=src)
    return data if dist.rank == src else buf.cpu().numpy().tobytes()


def all_gather_object(obj, dist: DistInfo) -> list:
    if not dist.enabled:
        return [obj]
    out = [None] * dist.world_size
    with collective_guard("all-gather between ranks"):
        td.all_gather_object(out, obj)
    return out


_PEER_FAILURE = ("timed out", "timeout", "connection closed", "connection reset", "broken pipe", "peer")


@contextmanager
def collective_guard(what: str, step: int | None = None, timeout_s: float | None = None):
    """Turn a collective's timeout or lost connection into an error that names the collective (and the step)."""
    try:
        yield
    except RuntimeError as e:
        text = str(e).lower()
        if isinstance(e, TrainingError) or not any(k in text for k in _PEER_FAILURE):
            raise
        first = str(e).strip().splitlines()[0][:300]
        when = "" if step is None else f" at step {step}"
        limit = "" if timeout_s is None else f" (dist.timeout_s={timeout_s:g})"
        raise TrainingError(f"{what}{when} failed: a peer is dead or hung{limit}; underlying error: {first}") from e


def failed_ranks(failed: bool, dist: DistInfo | None, what: str, step: int, timeout_s: float) -> list[int]:
    """The ranks on which `failed` is true, agreed by every rank through one watched all_reduce (a per-rank flag
    vector): every rank gets the same list, or the collective's timeout (`dist.timeout_s`) names a dead peer."""
    if dist is None or not td.is_initialized() or td.get_world_size() == 1:
        return [0] if failed else []
    flags = torch.zeros(td.get_world_size(), device=dist.device)
    flags[td.get_rank()] = 1.0 if failed else 0.0
    with collective_guard(what, step, timeout_s):
        td.all_reduce(flags, op=td.ReduceOp.MAX)
        return [i for i, f in enumerate(flags.tolist()) if f]
