"""`comm.backend: ddp`: PyTorch DistributedDataParallel, the reference backend.

DDP's own allreduce runs through a comm hook (the default one: average, then allreduce of each bucket) wrapped
to time the step's communication window: from the first bucket handed over to the last bucket's average being
ready (the future's callback). `wait_seconds` is not measured here: DDP waits for its buckets inside backward.

The strongest plain-DDP baseline: with NCCL, `comm.nccl_preset` and the `comm.nccl_*` keys set NCCL's multi-flow
variables on every rank before the process group exists (recipes/comm/ncclenv.py); with gloo, `comm.gloo_devices`
N > 1 gives DDP a process group of its own with N TCP devices on the same interface (GLOO_SOCKET_IFNAME listed N
times): ProcessGroupGloo then runs successive collectives on successive devices, each with its own connections,
so DDP's buckets travel on N flows.

`comm.backend: ddp_bf16` is the same DDP with torch's bf16 compression hook: each bucket is divided by the world size,
cast to bf16, allreduced and cast back, so it sends half DDP's bytes and each average keeps 8 bits of mantissa (its
record states the wire dtype and the tolerance against DDP that this costs).
"""

from __future__ import annotations

import datetime
import os
import warnings

import torch.distributed as td
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from base import registry
from recipes.comm import ncclenv
from recipes.comm.base import BackendDefaults, StepWindow
from recipes.comm.stats import CommStats


class DDPBackend(BackendDefaults):
    name = "ddp"
    hook = staticmethod(default_hooks.allreduce_hook)  # DDP's default: divide by the world size, allreduce

    def __init__(self, comm, dist, **named):
        super().__init__(comm, dist, **named)
        self.window = StepWindow(dist.device)
        self._bytes = 0

    @classmethod
    def process_env(cls, comm) -> dict[str, str]:
        return {**super().process_env(comm), **ncclenv.process_env(comm, log=ncclenv.rank0_print)}

    def prepare(self, model: nn.Module, optimizer):
        if self.dist.world_size == 1 and not self.comm_cfg.engage_single_rank:
            return model, optimizer  # nothing to reduce; DDP would only add hooks
        device_ids = [self.dist.device.index] if self.dist.device.type == "cuda" else None
        group = None
        if self.comm_cfg.gloo_devices > 1 and td.get_backend() == "gloo":
            group = gloo_group(self.comm_cfg.gloo_devices, self.timeout_s)
        with warnings.catch_warnings():
            # torch 2.13 deprecated broadcast_buffers for forward_sync_buffers, whose False still broadcasts the
            # buffers at construction: that would overwrite the per-rank BN statistics a mid-epoch checkpoint
            # restores (checkpoint bn_per_rank). torch's own warning says to keep broadcast_buffers=False until
            # init_sync_buffers exists; it is silenced here, for this call only.
            warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning)
            ddp = DistributedDataParallel(
                model,
                process_group=group,
                device_ids=device_ids,
                bucket_cap_mb=self.comm_cfg.bucket_cap_mb,
                static_graph=self.comm_cfg.static_graph,
                broadcast_buffers=False,  # BN running stats stay per rank and are averaged before validation
            )
        ddp.register_comm_hook(group, self._allreduce)  # the hook reduces on `group` (None: the default group)
        return ddp, optimizer

    def no_sync(self, model: nn.Module):
        return model.no_sync() if isinstance(model, DistributedDataParallel) else super().no_sync(model)

    def _allreduce(self, state, bucket):  # no annotations: DDP checks them against its own types
        """The backend's comm hook (`hook`), timed; the bytes counted in its record's wire dtype."""
        self.window.begin()
        buf = bucket.buffer()
        wire = registry.ALLREDUCE_BACKENDS[self.name].wire()
        self._bytes += buf.numel() * (2 if wire in ("fp16", "bf16") else buf.element_size())
        return self.hook(state, bucket).then(self._reduced)

    def _reduced(self, fut):
        self.window.end()
        return fut.value()

    def on_step_end(self, step: int, log=None) -> None:
        self.window.close_step()

    def stats(self) -> CommStats:
        c = self.comm_cfg
        settings = {"bucket_cap_mb": c.bucket_cap_mb, "static_graph": c.static_graph, "flows": self.flows()}
        return CommStats(self.name, self.window.steps, self.window.seconds, None, self._bytes, settings)

    def flows(self) -> int:
        """TCP flows per peer connection this backend asked for (gloo devices, or NCCL threads x sockets)."""
        if self.dist.world_size > 1 and td.is_initialized() and td.get_backend() == "gloo":
            return self.comm_cfg.gloo_devices
        return ncclenv.flows_per_connection(self.comm_cfg)


class DDPBf16Backend(DDPBackend):
    name = "ddp_bf16"
    hook = staticmethod(default_hooks.bf16_compress_hook)


def gloo_group(devices: int, timeout_s: float):
    """A gloo process group over every rank with `devices` TCP devices on this process's interface (the first of
    GLOO_SOCKET_IFNAME, else the one the hostname resolves to): ProcessGroupGloo builds one device per listed
    interface and spreads its collectives over them, so its traffic takes `devices` connections per peer."""
    old = os.environ.get("GLOO_SOCKET_IFNAME")
    name = next((n for n in (old or "").split(",") if n), None) or _default_ifname()
    os.environ["GLOO_SOCKET_IFNAME"] = ",".join([name] * devices)
    try:
        return td.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    finally:
        if old is None:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
        else:
            os.environ["GLOO_SOCKET_IFNAME"] = old


def _default_ifname() -> str:
    """The interface of the address this machine's hostname resolves to (what gloo picks without a name)."""
    import fcntl
    import socket
    import struct

    addr = socket.gethostbyname(socket.gethostname())
    for _, name in socket.if_nameindex():
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
        except OSError:
            continue
        if socket.inet_ntoa(packed[20:24]) == addr:
            return name
    return "lo"
