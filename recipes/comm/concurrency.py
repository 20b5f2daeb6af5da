"""`comm.concurrency`: whether multistream's K communicators may have collectives in flight at the same time.

The rule (docs/allreduce.md, "Concurrency", with its sources): collectives on several communicators may overlap
only if (1) every rank issues them in the same order, and (2) nothing can make one rank wait for a collective
that another rank has not started. (1) holds by construction: one thread issues every slice in plan order on
every rank. (2) is where transports differ:
- gloo: a collective runs on its group's own threads and TCP connections and blocks no other group, so (2) holds.
- NCCL: a collective is a kernel that spins until its peers arrive; two communicators' kernels can deadlock when
  they become resident in different orders on different ranks. NCCL >= 2.26 orders the kernels of all
  communicators of one device by host launch order when NCCL_LAUNCH_ORDER_IMPLICIT=1 (with CUDA >= 12.3 they
  still run concurrently: each starts once the previous one has started, so every rank starts them in the same
  order). The settings below take that guarantee away (or are not covered by it), so `overlap` refuses them
  and `auto` falls back to `serialize`, saying why.

`decide` is a pure function of what it is given (tests pass fake environments and versions); `probe` reads the
real process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from base.errors import ConfigError

MIN_NCCL = (2, 26, 0)  # first NCCL with NCCL_LAUNCH_ORDER_IMPLICIT
MIN_LAUNCH_ORDER_CUDA = 12030  # below it (driver or runtime) NCCL's implicit order waits for completion: serial
MIN_GRAPH_NCCL = (2, 27, 3)  # first NCCL that keeps the implicit launch order inside a CUDA graph ...
MIN_GRAPH_DRIVER = 12090  # ... with a CUDA 12.9 driver or newer
ORDER_ENV = "NCCL_LAUNCH_ORDER_IMPLICIT"
MPS_PIPE_DEFAULT = "/tmp/nvidia-mps"
CONCURRENCY = ("auto", "overlap", "serialize")


@dataclass(frozen=True)
class Facts:
    """What the decision depends on, read once at start-up (`probe`)."""

    transport: str  # the process group's backend: nccl or gloo
    env: dict  # the environment variables that matter (os.environ at the time)
    nccl_version: tuple[int, int, int] | None = None
    cuda_driver: int | None = None  # e.g. 12080
    cuda_runtime: int | None = None
    mps: bool = False  # an MPS control daemon's pipe directory exists


@dataclass(frozen=True)
class Decision:
    mode: str  # overlap | serialize
    why: str  # one line for the log


def unsafe_reasons(f: Facts) -> list[str]:
    """Why overlapping NCCL communicators would not be safe under `f` (empty: the rule holds)."""
    if f.transport != "nccl":
        return []
    out = []
    if f.nccl_version is not None and tuple(f.nccl_version) < MIN_NCCL:
        out.append(f"NCCL {'.'.join(map(str, f.nccl_version))} has no {ORDER_ENV} (needs >= 2.26)")
    if f.env.get(ORDER_ENV, "") != "1":
        out.append(f"{ORDER_ENV}={f.env.get(ORDER_ENV, '(unset)')} (must be 1: the backend sets it unless you did)")
    if f.env.get("CUDA_DEVICE_MAX_CONNECTIONS", "").strip() == "1":
        out.append(
            "CUDA_DEVICE_MAX_CONNECTIONS=1 (every stream shares one hardware queue, so a waiting kernel stalls the "
            "communicators queued behind it)"
        )
    if f.mps:
        out.append("CUDA MPS is active (kernels of other processes share the SMs, outside NCCL's launch order)")
    mode = f.env.get("NCCL_LAUNCH_MODE", "").strip().upper()
    if mode and mode != "PARALLEL":
        out.append(f"NCCL_LAUNCH_MODE={mode} (implicit launch ordering is documented for PARALLEL only)")
    if f.cuda_driver is not None and f.cuda_runtime is not None:
        if min(f.cuda_driver, f.cuda_runtime) < MIN_LAUNCH_ORDER_CUDA:
            out.append(
                f"CUDA {min(f.cuda_driver, f.cuda_runtime)} < 12030: NCCL orders communicators by completion "
                "there, so they would not overlap anyway"
            )
    return out


def graph_serial_reasons(f: Facts) -> list[str]:
    """Why collectives on several NCCL communicators captured in one CUDA graph would run one after another under
    `f` (empty: they overlap as they do eagerly). Inside a capture NCCL keeps its implicit launch order only from
    NCCL 2.27.3 with a CUDA 12.9 driver; before, it orders them by completion (NCCL src/enqueue.cc
    getImplicitOrder)."""
    if f.transport != "nccl":
        return []
    out = []
    if f.nccl_version is not None and tuple(f.nccl_version) < MIN_GRAPH_NCCL:
        out.append(f"NCCL {'.'.join(map(str, f.nccl_version))} < 2.27.3 serializes communicators in a graph")
    if f.cuda_driver is not None and f.cuda_driver < MIN_GRAPH_DRIVER:
        out.append(f"CUDA driver {f.cuda_driver} < 12090 serializes communicators in a graph")
    return out


def decide(requested: str, f: Facts) -> Decision:
    """The mode to run: `overlap` only where the rule holds; `overlap` asked for where it does not is a
    ConfigError (one line), `auto` falls back to `serialize` and says why."""
    if requested not in CONCURRENCY:
        raise ConfigError(f"comm.concurrency: expected one of {', '.join(CONCURRENCY)}, got {requested!r}")
    if requested == "serialize":
        return Decision("serialize", "serialize (asked for): one collective in flight over all communicators")
    reasons = unsafe_reasons(f)
    if not reasons:
        why = (
            "gloo groups run on their own threads and connections"
            if f.transport != "nccl"
            else f"NCCL orders the communicators' kernels by launch ({ORDER_ENV}=1)"
        )
        return Decision("overlap", f"overlap ({requested}): {why}")
    if requested == "overlap":
        raise ConfigError(
            f"comm.concurrency=overlap: concurrent NCCL communicators are not safe here: {'; '.join(reasons)}. "
            "Use comm.concurrency=serialize (or auto, which falls back to it)"
        )
    return Decision("serialize", f"serialize (auto fell back): {'; '.join(reasons)}")


DRIVER_BRANCH = {MIN_LAUNCH_ORDER_CUDA: "R545", MIN_GRAPH_DRIVER: "R575"}  # the first Linux driver of CUDA 12.3, 12.9


def driver_conditions() -> list[str]:
    """What multistream on NCCL needs of the driver, for `train.py --plan` (the driver is read only at start-up)."""
    return [
        f"multistream on NCCL: the K communicators overlap only with NCCL >= 2.26 and a CUDA 12.3 driver or newer "
        f"({DRIVER_BRANCH[MIN_LAUNCH_ORDER_CUDA]}+); on an older driver (R535, common on V100 fleets) "
        "comm.concurrency=auto falls back to serialize: one collective in flight and a host round trip per slice, "
        "so the K connections never carry data together (`scripts/predict.py --driver VERSION` predicts the step "
        "so). Advice: a driver of R545 or newer before a multi-node run",
        f"run.cuda_graph with multistream: a captured step keeps the communicators overlapping only with NCCL >= "
        f"2.27.3 and a CUDA 12.9 driver ({DRIVER_BRANCH[MIN_GRAPH_DRIVER]}+); on older ones the step stays eager "
        "(StepRunner where K cannot change)",
    ]


def _branch(driver: str | None) -> int | None:
    try:
        return int(str(driver).split(".")[0])
    except ValueError:
        return None


def driver_serializes(driver: str | None) -> bool:
    """True where comm.concurrency=auto falls back to serialize on NCCL for this driver (older than R545, CUDA
    12.3): what the time model counts (recipes/timemodel/estimate.py backends)."""
    branch = _branch(driver)
    return branch is not None and branch < 545


def driver_fallback(driver: str | None) -> list[str]:
    """What a host's NVIDIA kernel driver (e.g. '535.183.01') costs multistream on NCCL, with the advice: below
    R545 (CUDA 12.3) comm.concurrency=auto falls back to serialize; below R575 (CUDA 12.9) a captured step's
    communicators run one at a time. [] for a newer driver or none."""
    branch = _branch(driver)
    if branch is None:
        return []
    out = []
    if driver_serializes(driver):
        out.append(
            f"driver {driver} (R{branch}) is older than R545 (CUDA 12.3): multistream's comm.concurrency=auto falls "
            "back to serialize there, one collective in flight and a host round trip per slice; install R545 or "
            "newer for the K connections to carry data together"
        )
    if branch < 575:
        out.append(
            f"driver {driver} (R{branch}) is older than R575 (CUDA 12.9): a captured step would run multistream's "
            "communicators one at a time, so the step stays eager (run.cuda_graph)"
        )
    return out


def agree(requested: str, facts: list[Facts], hosts: list[str]) -> tuple[Decision, list[str]]:
    """The mode every rank runs and why captured collectives would serialize, from every rank's facts (all-gathered
    at start-up, so each rank computes the same answer): the most conservative of the ranks' own decisions, naming
    the host (and rank) whose facts made it, where the ranks differ. Hosts that decided alone would issue
    mismatched collectives on the same communicators. `overlap` asked for where any rank is unsafe: a ConfigError
    naming that host."""
    decisions = []
    for r, f in enumerate(facts):
        try:
            decisions.append(decide(requested, f))
        except ConfigError as e:
            raise ConfigError(f"{e} (on {hosts[r]}, rank {r})") from None
    serial = [r for r, d in enumerate(decisions) if d.mode == "serialize"]
    if not serial:
        decision = decisions[0]
    elif len(serial) == len(decisions):
        decision = decisions[serial[0]]
    else:
        r = serial[0]
        others = len(decisions) - len(serial)
        decision = Decision(
            "serialize",
            f"{decisions[r].why} (on {hosts[r]}, rank {r}; {others} other rank(s) could overlap, and every rank "
            "serializes with it)",
        )
    graph: list[str] = []
    reasons = [graph_serial_reasons(f) for f in facts]
    for r, own in enumerate(reasons):
        for why in own:
            where = "" if all(why in o for o in reasons) else f" (on {hosts[r]}, rank {r})"
            if not any(g.startswith(why) for g in graph):
                graph.append(why + where)
    return decision, graph


def process_env(requested: str, environ=os.environ) -> dict[str, str]:
    """What multistream sets before the process group exists: NCCL's implicit launch order, unless the user
    set the variable (their value wins; `decide` then judges it)."""
    if requested == "serialize" or ORDER_ENV in environ:
        return {}
    return {ORDER_ENV: "1"}


def cuda_driver_version(lib: str = "libcuda.so.1") -> int | None:
    """The CUDA version the installed driver supports (e.g. 13000), from the driver API's `cuDriverGetVersion`;
    None where the driver library cannot be loaded. (torch exposes no public call for it; its private
    `torch._C._cuda_getDriverVersion` is absent from torch 2.11 and later CUDA builds, found on an H200.)"""
    import ctypes

    try:
        get = ctypes.CDLL(lib).cuDriverGetVersion
    except (OSError, AttributeError):
        return None
    version = ctypes.c_int(0)
    return version.value if get(ctypes.byref(version)) == 0 else None


def probe(transport: str) -> Facts:
    """The facts of this process (call after the process group exists)."""
    import torch

    keys = (ORDER_ENV, "CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_LAUNCH_MODE", "CUDA_MPS_PIPE_DIRECTORY")
    env = {k: os.environ[k] for k in keys if k in os.environ}
    if transport != "nccl":
        return Facts(transport, env)
    nccl = tuple(torch.cuda.nccl.version())
    driver = cuda_driver_version() if torch.cuda.is_available() else None
    major, minor = (int(x) for x in (torch.version.cuda or "0.0").split(".")[:2])
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", MPS_PIPE_DEFAULT))
    mps = (pipe / "control").exists() or "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in os.environ
    return Facts(transport, env, nccl, driver, major * 1000 + minor * 10, mps)
