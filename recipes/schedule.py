"""The training plan as pure functions of the global step: phase, epoch, LR, momentum, image and batch size.

Batch size changes between phases, so iterations per epoch do too; `Schedule` lays out the whole run once
(which step starts which epoch); LR and momentum are piecewise-linear functions of the global step, and
`Schedule.at(epoch, iteration)` gives every scheduled value for a point of the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from base import registry
from base.errors import ConfigError
from data.sharding import steps_per_epoch  # the sharding rule decides the steps per epoch
from recipes.config import OptimConfig, Phase
from recipes.metrics import LR, MOMENTUM


def _warmup_then_decay(step: float, warm: float, last: float, start: float, peak: float, end: float) -> float:
    """start -> peak linearly over [0, warm], then peak -> end linearly over [warm, last]; constant outside."""
    step = min(max(float(step), 0.0), float(last))
    if step < warm:
        return start + (peak - start) * step / warm
    if last <= warm:
        return peak
    return peak + (end - peak) * (step - warm) / (last - warm)


def micro_batches(per_gpu: int, accumulate: int = 1, max_gpu_batch: int | None = None) -> int | None:
    """The accumulation A of a per-GPU batch: `accumulate` itself without a limit; with `max_gpu_batch`, the
    smallest A >= `accumulate` that cuts the batch into equal micro-batches of at most that many images.
    None when there is no such A (the batch does not split evenly)."""
    accumulate = max(accumulate, 1)
    if not max_gpu_batch:
        return accumulate if per_gpu % accumulate == 0 else None
    for a in range(accumulate, per_gpu + 1):
        if per_gpu % a == 0 and per_gpu // a <= max_gpu_batch:
            return a
    return None


def _show(value: float | None) -> str:
    """A table's number, or "-" where the optimizer has none (momentum under Lamb or AdamW)."""
    return "-" if value is None else f"{value:.4g}"


@dataclass(frozen=True)
class Point:
    step: int
    phase_index: int
    image_size: int
    batch_size: int
    lr: float
    momentum: float | None  # None: the optimizer reads no momentum


@dataclass(frozen=True)
class EpochInfo:
    epoch: int  # 0-based
    phase_index: int
    phase: Phase
    first_step: int
    steps: int
    micro_batches: int = 1  # gradient accumulation: micro-batches per optimizer step (run.accumulate)


class Schedule:
    """Epoch/step layout of a run for a given dataset size and world size."""

    def __init__(
        self,
        phases: list[Phase],
        optim: OptimConfig,
        *,
        num_images: int,
        world_size: int,
        accumulate: int = 1,
        max_gpu_batch: int | None = None,
        max_gpu_batch_by_size: dict[int, int] | None = None,
        aug_splits: int = 0,
    ):
        """`phases` and `optim` (the LR and momentum schedule): the config's sections of those names; `accumulate`,
        `max_gpu_batch`, `max_gpu_batch_by_size` (run.*) and `aug_splits` (data.*) decide each phase's micro-batches
        (recipes.memory.accumulation(cfg) gives all four)."""
        self.phases, self.optim = phases, optim
        self.accumulate, self.max_gpu_batch, self.aug_splits = accumulate, max_gpu_batch, aug_splits
        self.by_size = dict(max_gpu_batch_by_size or {})
        self.num_images = num_images
        self.world_size = world_size
        self.epochs: list[EpochInfo] = []
        step = 0
        for pi, phase in enumerate(phases):
            if phase.batch_size % world_size:
                raise ConfigError(
                    f"phases.{pi}.batch_size: {phase.batch_size} is not divisible by the world size {world_size}"
                )
            n = steps_per_epoch(num_images, phase.batch_size, world_size)
            a = self._micro_batches(pi, phase.batch_size // world_size)
            if phase.batch_size // world_size // a == 1 and phase.image_size <= 32:
                # The ResNets' last stage is 1/32 of the crop: one image of <= 32 px leaves BatchNorm one value
                # per channel, which it cannot normalise (PyTorch raises at the first training step).
                raise ConfigError(
                    f"phases.{pi}: a micro-batch of 1 image per process at {phase.image_size} px leaves BatchNorm one "
                    f"value per channel; use a batch of at least {2 * world_size * a} or an image size above 32"
                )
            for _ in range(phase.epochs):
                self.epochs.append(EpochInfo(len(self.epochs), pi, phase, step, n, a))
                step += n
        self.total_steps = step
        # Fractional epoch at each epoch boundary, used to turn "warmup_epochs" into a step.
        self._bounds_step = np.array([e.first_step for e in self.epochs] + [step], dtype=np.float64)
        self._bounds_epoch = np.arange(len(self.epochs) + 1, dtype=np.float64)

    def _micro_batches(self, pi: int, per_gpu: int) -> int:
        size = self.phases[pi].image_size
        cap, key = self.by_size.get(size, self.max_gpu_batch), "run.max_gpu_batch"
        if size in self.by_size:
            key = f"run.max_gpu_batch_by_size.{size}"
        a = micro_batches(per_gpu, self.accumulate, cap)
        if a is None:
            limit = f" of at most {key}={cap}" if cap else ""
            raise ConfigError(
                f"phases.{pi}: the per-GPU batch of {per_gpu} ({self.world_size} processes) cannot be cut into "
                f"run.accumulate={self.accumulate} or more equal micro-batches{limit}"
            )
        if a > 1 and self.aug_splits:
            raise ConfigError(
                f"phases.{pi}: accumulation ({a} micro-batches) with data.aug_splits={self.aug_splits} would "
                "cut an image's AugMix views apart; set data.aug_splits=0 or use more GPUs"
            )
        return a

    def phase_micro_batches(self) -> list[int]:
        """Micro-batches per optimizer step of each phase, in phase order."""
        first = {}
        for e in self.epochs:
            first.setdefault(e.phase_index, e.micro_batches)
        return [first[pi] for pi in sorted(first)]

    def micro_batch(self, epoch: int) -> int:
        """Images per GPU per micro-batch in `epoch` (the per-GPU batch over the accumulation)."""
        info = self.epochs[epoch]
        return info.phase.batch_size // self.world_size // info.micro_batches

    def epoch_of_step(self, step: float) -> float:
        """Fractional epoch reached at `step` (epoch 2.5 = half-way through the third epoch)."""
        return float(np.interp(step, self._bounds_step, self._bounds_epoch))

    def step_of_epoch(self, epoch: float) -> float:
        return float(np.interp(epoch, self._bounds_epoch, self._bounds_step))

    def warmup_steps(self) -> float:
        """The (fractional) step at which warm-up ends, capped at the last iteration."""
        return min(self.step_of_epoch(self.optim.warmup_epochs), self.last_step)

    @property
    def last_step(self) -> int:
        return max(self.total_steps - 1, 0)

    def lr(self, step: float) -> float:
        """Linear warm-up from warmup_start_lr to lr, then linear decay to final_lr at the last iteration.

        With `optim.lr_scaling: linear` the three values are per 256 images: the curve is multiplied by
        global_batch / 256 of the phase that `step` is in (so a phase with half the batch gets half the LR).
        """
        o = self.optim
        value = _warmup_then_decay(step, self.warmup_steps(), self.last_step, o.warmup_start_lr, o.lr, o.final_lr)
        if o.lr_scaling == "linear":
            value *= self.batch_size(step) / 256
        return value

    @property
    def reads_momentum(self) -> bool:
        """The optimizer reads optim.momentum (its record's config declares it); Lamb and AdamW have Adam's betas."""
        return "momentum" in registry.OPTIMIZERS[self.optim.name].reads

    def momentum(self, step: float) -> float | None:
        """constant; linear from momentum to momentum_end over the run; cyclic: momentum -> momentum_end over the
        warm-up (while the LR rises) and back to momentum at the last iteration (while the LR decays). None for an
        optimizer that reads no momentum: nothing to set, log or plot."""
        if not self.reads_momentum:
            return None
        o = self.optim
        if o.momentum_schedule == "constant" or o.momentum_end is None:
            return o.momentum
        if o.momentum_schedule == "linear":
            return _warmup_then_decay(step, 0.0, self.last_step, o.momentum, o.momentum, o.momentum_end)
        return _warmup_then_decay(step, self.warmup_steps(), self.last_step, o.momentum, o.momentum_end, o.momentum)

    def logged(self, step: float) -> dict[str, float]:
        """The schedule's values the log shows at `step`, by metric name (recipes/metrics.py): the learning rate, and
        the momentum where the optimizer reads one."""
        mom = self.momentum(step)
        return {LR.name: self.lr(step), **({MOMENTUM.name: mom} if mom is not None else {})}

    def global_step(self, epoch: int, iteration: int) -> int:
        """Global step of `iteration` (0-based) in `epoch` (0-based); steps per epoch depend on the phase."""
        info = self.epochs[epoch]
        if not 0 <= iteration < info.steps:
            raise ValueError(f"iteration {iteration} is outside epoch {epoch} ({info.steps} iterations)")
        return info.first_step + iteration

    def at(self, epoch: int, iteration: int) -> Point:
        """Everything the schedule says about (epoch, iteration)."""
        step = self.global_step(epoch, iteration)
        phase = self.epochs[epoch].phase
        return Point(
            step, self.epochs[epoch].phase_index, phase.image_size, phase.batch_size, self.lr(step), self.momentum(step)
        )

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
        accum = any(e.micro_batches > 1 for e in self.epochs)  # the column only when something accumulates
        lines = ["phase  epochs       size  val      batch  steps/ep  steps  lr@start  momentum@start"]
        if accum:
            lines[0] += "  micro-batches x images/GPU"
        ep = 0
        for pi, p in enumerate(self.phases):
            info = self.epochs[ep]
            val = f"{p.val_image_size or p.image_size}{'r' if p.rect_val else ''}"
            lines.append(
                f"{pi:>5}  {ep:>3}-{ep + p.epochs - 1:<3}  {p.image_size:>7}  {val:<6} {p.batch_size:>6}  "
                f"{info.steps:>8}  {info.steps * p.epochs:>5}  {self.lr(info.first_step):<8.4g}  "
                f"{_show(self.momentum(info.first_step))}"
            )
            if accum:
                lines[-1] = f"{lines[-1]:<79}  {info.micro_batches} x {self.micro_batch(ep)}"
            ep += p.epochs
        lines.append(f"total: {self.total_steps} iterations in {len(self.epochs)} epochs")
        lines.append(self.lr_summary())
        return "\n".join(lines)

    def lr_summary(self) -> str:
        """One line: the LR at the end of warm-up and at its peak (the plot's two landmarks, as numbers)."""
        w = self.warmup_steps()
        # The LR is linear between these steps (warm-up end, phase boundaries): its peak is at one of them.
        starts = [e.first_step for e in self.epochs]
        marks = {0, math.floor(w), math.ceil(w), self.last_step, *starts, *(s - 1 for s in starts if s > 0)}
        peak = max(sorted(m for m in marks if 0 <= m <= self.last_step), key=self.lr)
        warm = (
            # warm-up may end inside a step (6.5): rounded, the step shown would not be where the LR peaks
            f"end of warm-up {self.lr(w):.4g} at step {w:.10g} (epoch {self.epoch_of_step(w):.2f})"
            if w > 0
            else "no warm-up"
        )
        return (
            f"lr: {self.lr(0):.4g} at step 0, {warm}, peak {self.lr(peak):.4g} at step {peak}, "
            f"{self.lr(self.last_step):.4g} at the last step ({self.last_step})"
        )
