"""`comm.backend: ddp`: PyTorch DistributedDataParallel, the reference backend."""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel


class DDPBackend:
    def __init__(self, cfg, dist):
        self.cfg, self.dist = cfg, dist

    def prepare(self, model: nn.Module, optimizer):
        if self.dist.world_size == 1:
            return model, optimizer  # nothing to reduce; DDP would only add hooks
        device_ids = [self.dist.device.index] if self.dist.device.type == "cuda" else None
        ddp = DistributedDataParallel(
            model,
            device_ids=device_ids,
            bucket_cap_mb=self.cfg.comm.bucket_cap_mb,
            static_graph=self.cfg.comm.static_graph,
            broadcast_buffers=False,  # BN running stats stay per rank and are averaged before validation
        )
        return ddp, optimizer

    def on_step_end(self, step: int, log=None) -> None:
        pass

    def stats(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
