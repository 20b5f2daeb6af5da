"""The one place a training step is put together from a config: `build_step(cfg, ...)` hands StepRunner (or GraphStep)
the settings the config decides (the optimizer's record, run.amp, run.on_nonfinite, dist.timeout_s, comm.backend,
optim.clip_grad_norm, the criterion) beside the parts the caller built (model, optimizer, backend, scaler). The
trainer, the GPU check (scripts/gpu_check/) and the tests build their steps here, so a new step setting is one line."""

from __future__ import annotations

from typing import Any

from base import registry
from recipes.config import Config
from recipes.steps import GraphStep, StepRunner, create_criterion


def build_step(
    cfg: Config,
    *,
    model,
    train_model,
    optimizer,
    comm,
    scaler,
    device,
    graph: bool = False,
    capture: bool = False,
    **overrides: Any,
) -> StepRunner:
    """The training step of `cfg` over these parts: a GraphStep when `graph` (captured as one CUDA graph when
    `capture`), else a StepRunner. `overrides`: any other keyword of theirs, winning over the config's (the GPU
    check's fixed criterion, GraphStep's warmup and dist)."""
    kw = {
        "model": model,
        "train_model": train_model,
        "optimizer": optimizer,
        "optim": registry.OPTIMIZERS[cfg.optim.name],
        "scaler": scaler,
        "comm": comm,
        "criterion": create_criterion(cfg),
        "device": device,
        "amp": cfg.run.amp,
        "on_nonfinite": cfg.run.on_nonfinite,
        "timeout_s": cfg.dist.timeout_s,
        "backend": cfg.comm.backend,
        "clip_grad_norm": cfg.optim.clip_grad_norm,
        **overrides,
    }
    return GraphStep(capture=capture, **kw) if graph else StepRunner(**kw)
