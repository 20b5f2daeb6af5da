"""`comm.backend: ddp`: PyTorch DistributedDataParallel, the reference backend.

DDP's own allreduce runs through a comm hook (the default one: average, then allreduce of each bucket) wrapped
to time the step's communication window: from the first bucket handed over to the last bucket's average being
ready (the future's callback). `wait_seconds` is not measured here: DDP waits for its buckets inside backward.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from recipes.comm.base import BackendDefaults, StepWindow
from recipes.comm.stats import CommStats


class DDPBackend(BackendDefaults):
    name = "ddp"

    def __init__(self, cfg, dist):
        super().__init__(cfg, dist)
        self.window = StepWindow(dist.device)
        self._bytes = 0

    def prepare(self, model: nn.Module, optimizer):
        if self.dist.world_size == 1 and not self.cfg.comm.engage_single_rank:
            return model, optimizer  # nothing to reduce; DDP would only add hooks
        device_ids = [self.dist.device.index] if self.dist.device.type == "cuda" else None
        ddp = DistributedDataParallel(
            model,
            device_ids=device_ids,
            bucket_cap_mb=self.cfg.comm.bucket_cap_mb,
            static_graph=self.cfg.comm.static_graph,
            broadcast_buffers=False,  # BN running stats stay per rank and are averaged before validation
        )
        ddp.register_comm_hook(None, self._allreduce)
        return ddp, optimizer

    def _allreduce(self, state, bucket):  # no annotations: DDP checks them against its own types
        """DDP's default hook (divide by the world size, allreduce), timed."""
        self.window.begin()
        buf = bucket.buffer()
        self._bytes += buf.numel() * buf.element_size()
        return default_hooks.allreduce_hook(state, bucket).then(self._reduced)

    def _reduced(self, fut):
        self.window.end()
        return fut.value()

    def on_step_end(self, step: int, log=None) -> None:
        self.window.close_step()

    def stats(self) -> CommStats:
        c = self.cfg.comm
        settings = {"bucket_cap_mb": c.bucket_cap_mb, "static_graph": c.static_graph}
        return CommStats(self.name, self.window.steps, self.window.seconds, None, self._bytes, settings)
