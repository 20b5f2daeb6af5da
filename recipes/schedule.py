"""The training plan as pure functions of the global step: phase, epoch, LR, momentum, image and batch size.

Batch size changes between phases, so iterations per epoch do too; `Plan` lays out the whole run once
(which step starts which epoch) and everything else is `np.interp` over that table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from recipes.config import Config, Phase


def steps_per_epoch(num_images: int, global_batch: int, world_size: int) -> int:
    """Iterations per epoch when each rank reads ceil(N / world) images in local batches of B / world."""
    local_batch = max(1, global_batch // world_size)
    shard = math.ceil(num_images / world_size)
    return math.ceil(shard / local_batch)


@dataclass(frozen=True)
class EpochInfo:
    epoch: int  # 0-based
    phase_index: int
    phase: Phase
    first_step: int
    steps: int


class Plan:
    """Epoch/step layout of a run for a given dataset size and world size."""

    def __init__(self, cfg: Config, num_images: int, world_size: int):
        self.cfg = cfg
        self.num_images = num_images
        self.world_size = world_size
        self.epochs: list[EpochInfo] = []
        step = 0
        for pi, phase in enumerate(cfg.phases):
            if phase.batch_size % world_size:
                raise ValueError(
                    f"phases.{pi}.batch_size: {phase.batch_size} is not divisible by the world size {world_size}"
                )
            n = steps_per_epoch(num_images, phase.batch_size, world_size)
            for _ in range(phase.epochs):
                self.epochs.append(EpochInfo(len(self.epochs), pi, phase, step, n))
                step += n
        self.total_steps = step
        # Fractional epoch at each epoch boundary, used to turn "warmup_epochs" into a step.
        self._bounds_step = np.array([e.first_step for e in self.epochs] + [step], dtype=np.float64)
        self._bounds_epoch = np.arange(len(self.epochs) + 1, dtype=np.float64)

    def epoch_of_step(self, step: float) -> float:
        """Fractional epoch reached at `step` (epoch 2.5 = half-way through the third epoch)."""
        return float(np.interp(step, self._bounds_step, self._bounds_epoch))

    def step_of_epoch(self, epoch: float) -> float:
        return float(np.interp(epoch, self._bounds_epoch, self._bounds_step))

    def lr(self, step: float) -> float:
        """Linear warm-up to the peak, then linear decay to final_lr at the last iteration."""
        o = self.cfg.optim
        peak = o.lr
        if o.lr_scaling == "linear":
            peak = o.lr * self.batch_size(step) / 256
        warm = self.step_of_epoch(o.warmup_epochs)
        last = max(self.total_steps - 1, 1)
        if warm > 0:
            xs, ys = [0.0, warm, last], [o.warmup_start_lr, peak, o.final_lr]
        else:
            xs, ys = [0.0, last], [peak, o.final_lr]
        return float(np.interp(step, xs, ys))

    def momentum(self, step: float) -> float:
        """constant; linear from momentum to momentum_end over the run; cyclic: down in warm-up, back up after."""
        o = self.cfg.optim
        if o.momentum_schedule == "constant" or o.momentum_end is None:
            return o.momentum
        last = max(self.total_steps - 1, 1)
        if o.momentum_schedule == "linear":
            return float(np.interp(step, [0.0, last], [o.momentum, o.momentum_end]))
        warm = self.step_of_epoch(o.warmup_epochs)
        # Cyclic (one-cycle style): momentum falls while the LR rises and rises again while it decays.
        return float(np.interp(step, [0.0, warm, last], [o.momentum, o.momentum_end, o.momentum]))

    def epoch_info(self, epoch: int) -> EpochInfo:
        return self.epochs[epoch]

    def phase_at(self, step: float) -> Phase:
        idx = int(np.searchsorted(self._bounds_step[1:], step, side="right"))
        return self.epochs[min(idx, len(self.epochs) - 1)].phase

    def batch_size(self, step: float) -> int:
        return self.phase_at(step).batch_size

    def image_size(self, step: float) -> int:
        return self.phase_at(step).image_size

    def table(self) -> str:
        """Readable phase table: epochs, resolution, batch, steps per epoch, LR at the phase start."""
        lines = ["phase  epochs       size  val      batch  steps/ep  steps  lr@start"]
        ep = 0
        for pi, p in enumerate(self.cfg.phases):
            info = self.epochs[ep]
            val = f"{p.val_image_size or p.image_size}{'r' if p.rect_val else ''}"
            lines.append(
                f"{pi:>5}  {ep:>3}-{ep + p.epochs - 1:<3}  {p.image_size:>7}  {val:<6} {p.batch_size:>6}  "
                f"{info.steps:>8}  {info.steps * p.epochs:>5}  {self.lr(info.first_step):.4g}"
            )
            ep += p.epochs
        lines.append(f"total: {self.total_steps} iterations in {len(self.epochs)} epochs")
        return "\n".join(lines)
