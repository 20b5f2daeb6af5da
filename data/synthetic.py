"""`data.backend: synthetic`: random batches made once on the device, for throughput and comm runs."""

from __future__ import annotations

import torch

from data.pipeline import BasePipeline
from data.sharding import steps_per_epoch


class _Repeat:
    def __init__(self, images: torch.Tensor, labels: torch.Tensor, steps: int):
        self.images, self.labels, self.steps = images, labels, steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        for _ in range(self.steps):
            yield self.images, self.labels


class SyntheticPipeline(BasePipeline):
    """Built as SyntheticPipeline(data, dist, run): its record says it reads no folders (base/registry.py)."""

    def __init__(self, data, dist, run):
        d = data
        num_val = max(dist.world_size, min(d.synthetic_size, 2 * d.val_batch_size * dist.world_size))
        classes = [f"class{i:04d}" for i in range(d.synthetic_classes)]
        super().__init__(data, dist, run, classes, num_train=d.synthetic_size, num_val=num_val)

    def _batch(self, n: int, size: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, 3, size, size, generator=g)
        y = torch.randint(0, self.num_classes, (n,), generator=g)
        if self.run.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x.to(self.dist.device), y.to(self.dist.device)

    def train_batches(self, info, start_step: int = 0):
        local = info.phase.batch_size // self.dist.world_size
        steps = steps_per_epoch(self.num_train, info.phase.batch_size, self.dist.world_size) - start_step
        return _Repeat(*self._batch(local, info.phase.image_size, self.dist.rank), steps)

    def val_batches(self, phase):
        n = len(range(self.dist.rank, self.num_val, self.dist.world_size))
        size = phase.val_image_size or phase.image_size
        return _Repeat(*self._batch(n, size, 10_000 + self.dist.rank), 1)
