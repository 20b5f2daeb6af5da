"""Optimizer factory: parameter groups (no decay on BN and bias) and the optimizers named by `optim.name`."""

from __future__ import annotations

import torch
from torch import nn

from recipes.config import ConfigError


def param_groups(model: nn.Module, weight_decay: float, no_bn_decay: bool) -> list[dict]:
    """Two groups: weights that decay, and BN parameters + biases (1-d tensors) that do not when no_bn_decay."""
    decay, no_decay = [], []
    decay_names, no_decay_names = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if no_bn_decay and p.ndim <= 1:
            no_decay.append(p)
            no_decay_names.append(name)
        else:
            decay.append(p)
            decay_names.append(name)
    groups = [{"params": decay, "weight_decay": weight_decay, "names": decay_names, "adapt": True}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0, "names": no_decay_names, "adapt": False})
    return groups


def describe_groups(optimizer: torch.optim.Optimizer) -> list[str]:
    lines = []
    for i, g in enumerate(optimizer.param_groups):
        n = sum(p.numel() for p in g["params"])
        lines.append(f"param group {i}: {len(g['params'])} tensors, {n:,} values, weight_decay={g['weight_decay']}")
    return lines


def _sgd(cfg, groups):
    return torch.optim.SGD(
        groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov and cfg.momentum > 0,
        weight_decay=cfg.weight_decay, foreach=True,
    )  # fmt: skip


OPTIMIZERS = {"sgd": _sgd}


def create_optimizer(cfg, model: nn.Module) -> torch.optim.Optimizer:
    """Build the optimizer named by `cfg.name` over the model's parameter groups."""
    if cfg.name not in OPTIMIZERS:
        raise ConfigError(f"optim.name: unknown optimizer '{cfg.name}' (expected one of {', '.join(OPTIMIZERS)})")
    groups = param_groups(model, cfg.weight_decay, cfg.no_bn_decay)
    opt = OPTIMIZERS[cfg.name](cfg, groups)
    return opt


def set_lr_momentum(optimizer: torch.optim.Optimizer, lr: float, momentum: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = lr
        if "momentum" in g:
            g["momentum"] = momentum
