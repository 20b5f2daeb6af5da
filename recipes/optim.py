"""Optimizer factory: parameter groups (no decay on BN and bias) and the optimizers named by `optim.name`.

    sgd     torch.optim.SGD (fused), Nesterov by default
    lars    LARS: SGD with the layer trust ratio eta * ||w|| / (||g|| + wd * ||w||)        (recipes/lars.py)
    hybrid  the record's "LARS with rectified adaptive LR": the same trust ratio clipped to
            [optim.trust_clip_min, optim.trust_clip_max] on Nesterov SGD                  (recipes/lars.py)
    lamb    timm's Lamb (Adam moments, layer trust ratio), betas (0.9, 0.999), no global grad clipping
    adamw   torch.optim.AdamW, fused on CUDA (optim.fused), optim.betas and optim.eps

BN parameters and biases form their own group: no weight decay when `optim.no_bn_decay`, and plain SGD (no
trust ratio) in lars/hybrid/lamb unless `optim.adapt_bn_bias`.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from base import registry
from base.errors import ConfigError
from recipes.config.rules import trust_clip
from recipes.lars import LayerAdaptiveSGD


def param_groups(model: nn.Module, weight_decay: float, no_bn_decay: bool, adapt_bn_bias: bool = False) -> list[dict]:
    """Two groups: weights (decay, adapted), and BN parameters + biases (1-d tensors).

    The second group gets weight_decay 0 when no_bn_decay and adapt=adapt_bn_bias. Each group also carries
    `label`, `names` (parameter names) and `kinds` (counts per module type and parameter, for the log).
    """
    groups = {
        "weights": {"params": [], "weight_decay": weight_decay, "adapt": True, "names": [], "kinds": Counter()},
        "bn_bias": {
            "params": [],
            "weight_decay": 0.0 if no_bn_decay else weight_decay,
            "adapt": adapt_bn_bias,
            "names": [],
            "kinds": Counter(),
        },
    }
    for mod_name, module in model.named_modules():
        for p_name, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            g = groups["weights" if p.ndim > 1 else "bn_bias"]
            g["params"].append(p)
            g["names"].append(f"{mod_name}.{p_name}" if mod_name else p_name)
            g["kinds"][f"{type(module).__name__}.{p_name}"] += 1
    out = []
    for label, g in groups.items():
        if g["params"]:
            out.append({**g, "label": label, "kinds": dict(sorted(g["kinds"].items()))})
    return out


def describe_groups(optimizer: torch.optim.Optimizer) -> list[str]:
    """One log line per parameter group: what is in it, how big, its weight decay and whether it is adapted."""
    lines = []
    for i, g in enumerate(optimizer.param_groups):
        n = sum(p.numel() for p in g["params"])
        kinds = ", ".join(f"{k} x{v}" for k, v in g.get("kinds", {}).items())
        adapts = isinstance(optimizer, LayerAdaptiveSGD) or "always_adapt" in g  # sgd ignores the flag
        adapt = f", adapt={g['adapt']}" if adapts and "adapt" in g else ""
        lines.append(
            f"param group {i} ({g.get('label', '-')}): {len(g['params'])} tensors, {n:,} values, "
            f"weight_decay={g['weight_decay']:g}{adapt}" + (f" [{kinds}]" if kinds else "")
        )
    return lines


def build_sgd(cfg, groups):
    # fused: the step reads `found_inf` on the device (GradScaler, the trainer's finite check), so skipping a step
    # with non-finite gradients needs no host synchronisation.
    opt = torch.optim.SGD(
        groups,
        lr=cfg.lr,
        momentum=cfg.momentum,
        nesterov=cfg.nesterov and cfg.momentum > 0,
        weight_decay=cfg.weight_decay,
        fused=True,
    )
    if cfg.momentum > 0:
        # torch's fused SGD makes uninitialised (empty_like) buffers on its first step even when found_inf skips
        # it; zero buffers start exactly like buf = g (m * 0 + g) and make a skipped first step harmless.
        for g in opt.param_groups:
            for p in g["params"]:
                opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
    return opt


def _layer_adaptive(cfg, groups, clip: bool):
    if clip:
        trust_clip(cfg)  # the loader's rule, for a section built in code
    lo, hi = (cfg.trust_clip_min, cfg.trust_clip_max) if clip else (0.0, float("inf"))
    if cfg.eta <= 0:
        raise ConfigError(f"optim.eta: expected a positive number, got {cfg.eta}")
    return LayerAdaptiveSGD(
        groups,
        lr=cfg.lr,
        momentum=cfg.momentum,
        nesterov=cfg.nesterov and cfg.momentum > 0,
        weight_decay=cfg.weight_decay,
        eta=cfg.eta,
        trust_min=lo,
        trust_max=hi,
        momentum_convention=cfg.lars_momentum,
    )


def build_lamb(cfg, groups):
    from timm.optim import Lamb

    for g in groups:
        # timm's Lamb adapts every group whose weight decay is not zero; say so rather than silently adapt.
        if g["weight_decay"] and not g["adapt"]:
            raise ConfigError(
                "optim.name=lamb adapts every parameter that decays (timm's Lamb): set optim.no_bn_decay=true "
                "or optim.adapt_bn_bias=true"
            )
        g["always_adapt"] = g["adapt"]
    return Lamb(groups, lr=cfg.lr, weight_decay=cfg.weight_decay, max_grad_norm=None, foreach=True)


class _SkippingAdamW(torch.optim.AdamW):
    """torch's unfused AdamW, skipping a step on the device as its fused kernel does: with `found_inf` (0-dim, 1.0)
    set, each parameter and its state keep their values from before the step (no host read). GradScaler hands it the
    flag, and the scale when its gradients are still scaled, as it does a fused optimizer."""

    _step_supports_amp_scaling = True

    @torch.no_grad()
    def step(self, closure=None):
        found, scale = getattr(self, "found_inf", None), getattr(self, "grad_scale", None)
        if found is None:
            return super().step(closure)
        if scale is not None:
            torch._foreach_div_([p.grad for g in self.param_groups for p in g["params"] if p.grad is not None], scale)
        tensors = []
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:  # AdamW's own first state, made now so that a skipped first step leaves it as it was
                    step = torch.zeros((), dtype=torch.float32, device=p.device if g["capturable"] else "cpu")
                    state.update(step=step, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                tensors += [p, *(v for v in state.values() if isinstance(v, torch.Tensor))]
        before = [t.clone() for t in tensors]
        self.found_inf = self.grad_scale = None  # torch's own unfused step refuses them (its fused kernel reads them)
        try:
            loss = super().step(closure)
        finally:
            self.found_inf, self.grad_scale = found, scale
        for t, old in zip(tensors, before, strict=True):
            t.copy_(torch.where(found.to(t.device).reshape(()) > 0, old, t))
        return loss


def build_adamw(cfg, groups):
    """torch's AdamW; fused (CUDA only) as optim.fused says, auto = fused on CUDA."""
    if len(cfg.betas) != 2:
        raise ConfigError(f"optim.betas: expected two numbers (beta1, beta2), got {cfg.betas}")
    cuda = all(p.is_cuda for g in groups for p in g["params"])
    fused = cuda if cfg.fused == "auto" else cfg.fused
    if fused and not cuda:
        raise ConfigError("optim.fused=true: torch's fused AdamW runs on CUDA here; set optim.fused to auto or false")
    kw = {"lr": cfg.lr, "betas": tuple(cfg.betas), "eps": cfg.eps, "weight_decay": cfg.weight_decay}
    if fused:
        return torch.optim.AdamW(groups, fused=True, **kw)
    # capturable on CUDA: its step count lives on the device, so the skip above reads no flag on the host
    return _SkippingAdamW(groups, foreach=False, capturable=cuda, **kw)


def build_lars(cfg, groups):
    return _layer_adaptive(cfg, groups, clip=False)


def build_hybrid(cfg, groups):
    return _layer_adaptive(cfg, groups, clip=True)


OPTIMIZERS = registry.OPTIMIZERS  # optim.name -> "recipes.optim:build_<name>"


def create_optimizer(cfg, model: nn.Module) -> torch.optim.Optimizer:
    """Build the optimizer named by `cfg.name` over the model's parameter groups."""
    build = registry.load(OPTIMIZERS, cfg.name, "optim.name", "optimizer")
    groups = param_groups(model, cfg.weight_decay, cfg.no_bn_decay, cfg.get("adapt_bn_bias", False))
    return build(cfg, groups)


def set_lr_momentum(optimizer: torch.optim.Optimizer, lr: float, momentum: float | None) -> None:
    """The schedule's values of this step into every group (momentum None: the optimizer reads none)."""
    for g in optimizer.param_groups:
        g["lr"] = lr
        if momentum is not None and "momentum" in g:
            g["momentum"] = momentum


# Set every step by the schedule (set_lr_momentum), so a restored value never outlives the first step.
_SCHEDULED = ("params", "lr", "momentum")


def apply_config(optimizer: torch.optim.Optimizer, cfg, model: nn.Module) -> list[str]:
    """Give `optimizer`'s groups the hyperparameters `create_optimizer(cfg, model)` would (weight decay, Nesterov,
    eta, trust clip, adapt flags, betas, eps, ...): `load_state_dict` brings back the checkpoint's values, and a run
    resumed with checkpoint.resume=force trains with its config's. Returns 'group label: key old -> new' per change.
    """
    fresh = create_optimizer(cfg, model)  # the builders are the one place that maps config keys to group keys
    if len(fresh.param_groups) != len(optimizer.param_groups):
        raise ConfigError(
            f"optim: the config makes {len(fresh.param_groups)} parameter group(s), the restored optimizer has "
            f"{len(optimizer.param_groups)}"
        )
    changes = []
    for mine, new in zip(optimizer.param_groups, fresh.param_groups, strict=True):
        for key, value in new.items():
            old = mine.get(key)
            if key in _SCHEDULED or _same(old, value):
                continue
            changes.append(f"{new.get('label', '-')}: {key} {old!r} -> {value!r}")
            if isinstance(old, torch.Tensor):  # in place: a captured CUDA graph reads this tensor
                old.copy_(torch.as_tensor(value, dtype=old.dtype))
            else:
                mine[key] = value
    return changes


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.equal(torch.as_tensor(a).cpu().double(), torch.as_tensor(b).cpu().double())
    return a == b
