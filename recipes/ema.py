"""An exponential moving average of the weights (`run.ema`): timm's ModelEmaV3, updated after each optimizer step.

It averages every floating-point entry of the state_dict, BN running statistics included, and copies the integer
ones (`num_batches_tracked`), as timm does. The trainer validates `ema.module` alongside the model (its BN
statistics averaged over ranks first, like the model's) and a checkpoint keeps its state_dict under `ema`.
"""

from __future__ import annotations

from timm.utils import ModelEmaV3
from torch import nn


def create_ema(model: nn.Module, *, enabled: bool, decay: float, warmup: bool) -> ModelEmaV3 | None:
    """The EMA of `model` (a copy of it now), or None when `enabled` is false.

    `decay`: the decay per step; `warmup`: timm's decay warm-up, 1 - (1 + step)^(-2/3) capped at `decay`.
    The first update (step 1) copies the weights: timm's decay is 0 there.
    """
    if not enabled:
        return None
    return ModelEmaV3(model, decay=decay, use_warmup=warmup)


def update_ema(ema: ModelEmaV3 | None, model: nn.Module, step: int) -> None:
    """Move the EMA towards `model` after optimizer step `step` (1-based: the steps taken so far)."""
    if ema is not None:
        ema.update(model, step=step)
