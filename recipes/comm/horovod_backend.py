"""`comm.backend: horovod`: the baseline, real `horovod.torch` (DistributedOptimizer + parameter broadcast).

Run it under horovodrun, e.g. `horovodrun --gloo -np 2 python train.py -c configs/quickstart.yaml
comm.backend=horovod`. Horovod 0.28.1 does not build against torch 2.x as released; `make horovod` (or
`scripts/install_horovod.sh`) builds it with the one-line C++20 patch. The trainer's own collectives
(exact evaluation, checkpoint RNG states) still use torch.distributed: `torch_env_from_horovod` derives the
torchrun-style environment from horovodrun's, so `recipes.distributed.setup` works unchanged.
"""

from __future__ import annotations

import os
import socket
import time
from contextlib import contextmanager
from functools import partial

import torch
from torch import nn

from base.errors import ConfigError
from recipes.comm.base import BackendDefaults
from recipes.comm.stats import CommStats

INSTALL_HINT = (
    "the horovod backend needs Horovod 0.28.1 built for this torch: run `make horovod` "
    "(or `PY=.venv/bin/python scripts/install_horovod.sh`), then launch with `horovodrun --gloo -np N ...`"
)


def import_horovod():
    """`horovod.torch`, or a RuntimeError saying how to install it."""
    try:
        import horovod.torch as hvd
    except ImportError as e:
        raise RuntimeError(f"comm.backend=horovod: cannot import horovod.torch ({e}); {INSTALL_HINT}") from None
    return hvd


def launched_by_horovodrun() -> bool:
    return "HOROVOD_RANK" in os.environ and "RANK" not in os.environ


def torch_env_from_horovod(comm) -> dict[str, str]:
    """Under horovodrun: start Horovod and return RANK/WORLD_SIZE/.../MASTER_ADDR/MASTER_PORT for torch.distributed.

    Horovod reads its tuning knobs when it starts, so `comm.bucket_mb` (fusion threshold) and `comm.autotune`
    are exported first, unless the user set the HOROVOD_* variables themselves. Rank 0 picks a free port on its
    own host and sends (host, port) to everyone through Horovod.
    """
    c = comm
    os.environ.setdefault("HOROVOD_FUSION_THRESHOLD", str(int(c.bucket_mb * 2**20)))
    if c.autotune:
        os.environ.setdefault("HOROVOD_AUTOTUNE", "1")
    hvd = import_horovod()
    hvd.init()
    if hvd.rank() == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        master = (os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname(), port)
    else:
        master = None
    host, port = hvd.broadcast_object(master, root_rank=0, name="dawnbench.master")
    if host in ("localhost", "127.0.0.1", socket.gethostname()) and hvd.cross_size() == 1:
        host = "127.0.0.1"
    return {
        "RANK": str(hvd.rank()),
        "WORLD_SIZE": str(hvd.size()),
        "LOCAL_RANK": str(hvd.local_rank()),
        "LOCAL_WORLD_SIZE": str(hvd.local_size()),
        "MASTER_ADDR": host,
        "MASTER_PORT": str(port),
    }


def _zero_grad(opt, set_to_none: bool = True) -> None:
    """Horovod's check (no allreduce may be pending), then the wrapped optimizer's own zero_grad(set_to_none)."""
    if opt._handles:
        raise AssertionError(
            "optimizer.zero_grad() called while Horovod allreduces are pending (after backward, before step)"
        )
    super(type(opt), opt).zero_grad(set_to_none=set_to_none)


class Contiguous:
    """A Horovod compressor on contiguous copies: Horovod 0.28.1 refuses a non-contiguous tensor, and a
    channels_last model has some (its 3x3 and 7x7 convolution weights, and their gradients). The average goes
    back in the gradient's own layout: the CUDA fused SGD kernel wants gradients laid out as their parameters."""

    def __init__(self, inner):
        self.inner = inner

    def compress(self, tensor: torch.Tensor):
        wire, ctx = self.inner.compress(tensor)
        return wire.contiguous(), (ctx, tensor)

    def decompress(self, tensor: torch.Tensor, ctx):
        ctx, like = ctx
        out = self.inner.decompress(tensor, ctx)
        if out.stride() == like.stride():
            return out
        return torch.empty_like(like).copy_(out)  # empty_like keeps the strides of a dense tensor


def broadcast_state(hvd, model: nn.Module, optimizer, root_rank: int = 0) -> None:
    """Rank `root_rank`'s weights, buffers and optimizer state on every rank, as hvd.broadcast_parameters and
    hvd.broadcast_optimizer_state, on contiguous copies (channels_last tensors; see `Contiguous`).

    Unlike hvd.broadcast_optimizer_state, an empty optimizer state stays empty: Horovod fills it with one step on
    zero gradients, which moves the weights wherever weight decay is set."""
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    scalars = {}
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for i, p in enumerate(params):
        for k, v in optimizer.state.get(p, {}).items():
            if torch.is_tensor(v):
                tensors[f"optim.{i}.{k}"] = v
            else:
                scalars[f"optim.{i}.{k}"] = v
    for i, g in enumerate(optimizer.param_groups):
        scalars.update({f"group.{i}.{k}": v for k, v in g.items() if k != "params"})
    copies = {k: v.contiguous() for k, v in tensors.items()}
    hvd.broadcast_parameters(copies, root_rank=root_rank)
    with torch.no_grad():
        for k, v in tensors.items():
            if copies[k] is not v:
                v.copy_(copies[k])
    for key, v in hvd.broadcast_object(scalars, root_rank=root_rank, name="dawnbench.optim_scalars").items():
        kind, i, k = key.split(".", 2)
        if kind == "group":
            optimizer.param_groups[int(i)][k] = v
        else:
            optimizer.state[params[int(i)]][k] = v


class HorovodBackend(BackendDefaults):
    """Timing: the step's window runs from the first gradient ready (Horovod's hooks start its allreduce then) to
    `synchronize()` returning with the averages; `wait_seconds` is the time spent inside `synchronize()`."""

    name = "horovod"

    def __init__(self, comm, dist, **named):
        super().__init__(comm, dist, **named)
        if comm.compression == "bf16":
            raise ConfigError("comm.compression: horovod supports 'none' or 'fp16', got 'bf16'")
        self.optimizer = None
        self._steps = 0
        self._comm_seconds = self._wait_seconds = 0.0
        self._step_bytes = 0

    @classmethod
    def process_env(cls, comm) -> dict[str, str]:
        """Under horovodrun: torch.distributed's environment, derived from Horovod's (see torch_env_from_horovod)."""
        return torch_env_from_horovod(comm) if launched_by_horovodrun() else {}

    def prepare(self, model: nn.Module, optimizer):
        if self.dist.world_size == 1 and not self.comm_cfg.engage_single_rank:
            return model, optimizer  # nothing to reduce
        hvd = import_horovod()
        hvd.init()
        if hvd.size() != self.dist.world_size or hvd.rank() != self.dist.rank:
            raise RuntimeError(
                f"comm.backend=horovod: Horovod sees rank {hvd.rank()} of {hvd.size()} but torch.distributed sees "
                f"rank {self.dist.rank} of {self.dist.world_size}; launch with horovodrun, not torchrun"
            )
        wire = hvd.Compression.fp16 if self.comm_cfg.compression == "fp16" else hvd.Compression.none
        state = optimizer.state_dict()  # a resume loaded it into the plain optimizer
        dist_opt = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), compression=Contiguous(wire), op=hvd.Average
        )
        dist_opt.load_state_dict(state)
        broadcast_state(hvd, model, dist_opt)
        # Horovod averages in optimizer.step(); GradScaler reads the gradients before that (unscale_, inf check).
        # Finishing the allreduce when backward ends, as DDP does, keeps the trainer free of Horovod calls.
        dist_opt._should_synchronize = False  # what `with dist_opt.skip_synchronize():` sets, for every step
        dist_opt.zero_grad = partial(_zero_grad, dist_opt)  # Horovod's takes no set_to_none
        self._params = [p for p in model.parameters() if p.requires_grad]
        wire = 2 if self.comm_cfg.compression == "fp16" else None
        self._step_bytes = sum(p.numel() * (wire or p.element_size()) for p in self._params)
        self._armed = self._held = False
        for p in self._params:
            p.register_post_accumulate_grad_hook(self._on_grad)
        self.optimizer = dist_opt
        return model, dist_opt

    @contextmanager
    def no_sync(self, model: nn.Module):
        """Horovod's own hooks allreduce a gradient when its countdown (`backward_passes_per_step`, reset by
        `synchronize()`) reaches zero: one more pass to count down keeps this pass's gradients local."""
        if self.optimizer is None:
            yield
            return
        delay = self.optimizer._allreduce_delay
        for p in delay:
            delay[p] += 1
        self._held = True
        try:
            yield
        finally:
            self._held = False

    def _on_grad(self, param: torch.Tensor) -> None:
        if self._held:
            return
        if not self._armed:
            self._armed = True
            self._t_first = time.perf_counter()
            torch.autograd.Variable._execution_engine.queue_callback(self._synchronize)

    def _synchronize(self) -> None:
        try:
            t_wait = time.perf_counter()
            self.optimizer.synchronize()
            now = time.perf_counter()
            self._steps += 1
            self._comm_seconds += now - self._t_first
            self._wait_seconds += now - t_wait
        finally:
            self._armed = False

    def stats(self) -> CommStats:
        c = self.comm_cfg
        fusion = float(os.environ.get("HOROVOD_FUSION_THRESHOLD", c.bucket_mb * 2**20)) / 2**20
        settings = {"fusion_threshold_mb": fusion, "compression": c.compression, "autotune": c.autotune}
        total_bytes = self._steps * self._step_bytes
        return CommStats(self.name, self._steps, self._comm_seconds, self._wait_seconds, total_bytes, settings)
