"""Networks built with timm. The trainer asks for `create_model(cfg.model, num_classes)` and nothing else."""

from __future__ import annotations

import os

import timm
import torch
from torch import nn

from recipes.errors import CheckpointError
from recipes.registry import MODELS, check_name


def create_model(cfg, num_classes: int) -> nn.Module:
    """Build `cfg.name` for `num_classes` classes with the configured BN settings."""
    check_name(MODELS, cfg.name, "model.name", "model")
    model = timm.create_model(
        MODELS[cfg.name],
        pretrained=False,
        num_classes=num_classes,
        drop_rate=cfg.drop_rate,
        zero_init_last=cfg.zero_init_last_bn,
    )
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.momentum = cfg.bn_momentum
            m.eps = cfg.bn_eps
    return model


def describe_model(model: nn.Module) -> dict:
    """Identity used to refuse a checkpoint from a different network: parameter names and shapes."""
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    return {"num_params": sum(p.numel() for p in model.parameters()), "shapes": shapes}


def check_compatible(model: nn.Module, state: dict, source: str) -> None:
    """Raise a clear error when a checkpoint's state_dict does not fit `model`."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    extra = [k for k in state if k not in own]
    wrong = [k for k in own if k in state and tuple(own[k].shape) != tuple(torch.as_tensor(state[k]).shape)]
    if missing or extra or wrong:
        detail = []
        if missing:
            detail.append(f"{len(missing)} missing (e.g. {missing[0]})")
        if extra:
            detail.append(f"{len(extra)} unexpected (e.g. {extra[0]})")
        if wrong:
            k = wrong[0]
            detail.append(f"{len(wrong)} of other shape (e.g. {k}: {tuple(state[k].shape)} vs {tuple(own[k].shape)})")
        raise CheckpointError(f"{source}: checkpoint was made for a different model: {'; '.join(detail)}")


def compile_unavailable(device: torch.device) -> str | None:
    """Why inductor cannot compile for `device` on this machine (None when it can): on CPU it needs a C++ compiler."""
    if device.type != "cpu":
        return None
    import shutil

    from torch._inductor import config as inductor_config

    cxx = inductor_config.cpp.cxx[-1] if isinstance(inductor_config.cpp.cxx, tuple) else inductor_config.cpp.cxx
    candidates = [os.environ.get("CXX"), cxx, "g++", "c++", "clang++"]
    if any(c and shutil.which(c) for c in candidates):
        return None
    return "inductor on CPU needs a C++ compiler (none of g++, c++, clang++ or $CXX is on PATH)"


def compile_for_training(module: nn.Module, mode: str, *, shapes: int = 1) -> nn.Module:
    """`module` under torch.compile (inductor) in `mode`, or `module` itself when `mode` is 'none'.

    Shapes are static (`dynamic=False`): each phase's image and batch size is compiled once, with kernels
    specialised to it, instead of one shape-generic graph; `shapes` (the distinct input shapes of the plan) raises
    dynamo's recompile limit so that no phase falls back to eager. The result shares its parameters and buffers
    with `module`, whose state_dict (no `_orig_mod.` prefix) is what checkpoints keep.
    """
    if mode == "none":
        return module
    import torch._dynamo

    dyn = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # the name differs across torch versions and can be hidden
        try:
            setattr(dyn, name, max(getattr(dyn, name), shapes + 1))
            break
        except AttributeError:
            continue
    return torch.compile(module, mode=mode, dynamic=False)
