"""Process-group setup from torchrun's environment, with timeouts so a dead peer fails fast."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as td


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


def setup(cfg) -> DistInfo:
    """Read RANK/WORLD_SIZE/LOCAL_RANK (set by torchrun), pick the device, init the process group."""
    from recipes.comm import backend_class

    os.environ.update(backend_class(cfg.comm.backend).process_env(cfg))  # horovod: derived from horovodrun's
    rank = _env_int("RANK", 0)
    world = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", 1)
    want = cfg.run.device
    if want == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("run.device: 'cuda' requested but no CUDA device is available")
    use_cuda = want == "cuda" or (want == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        threads = cfg.run.threads or max(1, (os.cpu_count() or 1) // local_world)
        torch.set_num_threads(threads)
    if world > 1 and not td.is_initialized():
        backend = cfg.dist.backend
        if backend == "auto":
            backend = "nccl" if use_cuda else "gloo"
        timeout = datetime.timedelta(seconds=cfg.dist.timeout_s)
        td.init_process_group(
            backend=backend,
            timeout=timeout,
            device_id=device if use_cuda else None,
            **_elastic_store(rank, world, timeout),
        )
    return DistInfo(rank, world, local_rank, local_world, device)


def _elastic_store(rank: int, world: int, timeout: datetime.timedelta) -> dict:
    """Under torchrun, a store namespace of its own for every generation of workers.

    The agents' store outlives a restart, and with several agents (multi-node) the workers of a new round could
    read the addresses the dead round's workers left there (gloo: "connection refused"). Each worker takes a
    ticket from a counter in the agents' store; tickets [g*world, (g+1)*world) form generation g.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_ADDR" not in os.environ:
        return {}
    store = td.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=world,
                        is_master=False, timeout=timeout)  # fmt: skip
    ticket = store.add("dawnbench/worker_tickets", 1) - 1
    generation = ticket // world
    return {"store": td.PrefixStore(f"dawnbench/gen{generation}", store), "rank": rank, "world_size": world}


def teardown() -> None:
    if td.is_initialized():
        td.destroy_process_group()


def all_reduce_sum(values: list[float], dist: DistInfo) -> list[float]:
    """Sum a few numbers over ranks (float64 so that image counts stay exact)."""
    t = torch.tensor(values, dtype=torch.float64)
    if dist.enabled:
        if td.get_backend() == "nccl":
            t = t.to(dist.device)
        td.all_reduce(t)
    return t.cpu().tolist()


def broadcast_object(obj, dist: DistInfo):
    if not dist.enabled:
        return obj
    box = [obj]
    td.broadcast_object_list(box, src=0)
    return box[0]


def all_gather_object(obj, dist: DistInfo) -> list:
    if not dist.enabled:
        return [obj]
    out = [None] * dist.world_size
    td.all_gather_object(out, obj)
    return out
