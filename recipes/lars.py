"""Layer-wise adaptive SGD: LARS, and the record's hybrid (LARS with a clipped, "rectified" trust ratio).

For every tensor w with gradient g in a group with `adapt=True`:

    r = clip(eta * ||w|| / (||g|| + wd * ||w||), trust_min, trust_max)    (r = 1 before clipping if ||w|| or ||g|| is 0)
    d = r * (g + wd * w)

and for tensors of a group with `adapt=False` (BN parameters and biases by default) plain SGD: d = g + wd * w.
Then the (Nesterov) momentum SGD update, in one of two conventions (`momentum_convention`):

  torch (torch.optim.SGD, timm's Lars, apex): the trust ratio goes into the buffer
    buf = m * buf + r * d     (buf = r * d on the first step)
    u   = r * d + m * buf     (Nesterov)   or   u = buf
    w  -= lr * u
  tf (TensorFlow's LARSOptimizer, the record's): the buffer holds the raw gradients, and the current lr x trust ratio
  scales the whole buffer (tf.raw_ops.ApplyMomentum with lr * r as its learning rate)
    buf = m * buf + g'        (g' = g + wd * w, the gradient of the loss with its L2 term)
    u   = g' + m * buf        (Nesterov)   or   u = buf
    w  -= lr * r * u

The two agree while r stays constant; once r moves (it does every step), the torch buffer keeps each step's own
ratio and the tf buffer takes today's ratio for all its history, so the record's eta and clip carry over exactly
only under tf.

`lars` is this with no clipping (trust_min=0, trust_max=inf). The step is a few `torch._foreach_*` calls per
(device, dtype) group, not a Python loop over the model's tensors.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
from torch import Tensor


def trust_ratios(w_norm: Tensor, g_norm: Tensor, eta: float, weight_decay: float, lo: float, hi: float) -> Tensor:
    """Layer trust ratios from stacked weight and gradient norms (1-d tensors), clipped to [lo, hi]."""
    ratio = eta * w_norm / (g_norm + weight_decay * w_norm)
    # A zero weight (fresh layer) or zero gradient (unused layer) leaves the step unscaled, as in timm's Lars.
    ratio = torch.where((w_norm > 0) & (g_norm > 0), ratio, torch.ones_like(ratio))
    return ratio.clamp(lo, hi)


class LayerAdaptiveSGD(torch.optim.Optimizer):
    """SGD with momentum whose update of each adapted tensor is scaled by its clipped layer trust ratio.

    Group keys (defaults from the arguments): lr, momentum, nesterov, weight_decay, eta, trust_min, trust_max,
    adapt (False: plain SGD for this group).
    """

    def __init__(self, params, lr: float = 0.1, momentum: float = 0.9, nesterov: bool = True,
                 weight_decay: float = 0.0, eta: float = 1e-3, trust_min: float = 0.0, trust_max: float = math.inf,
                 adapt: bool = True, momentum_convention: str = "torch"):  # fmt: skip
        if lr < 0 or momentum < 0 or weight_decay < 0 or eta <= 0:
            raise ValueError(f"invalid lr={lr}, momentum={momentum}, weight_decay={weight_decay} or eta={eta}")
        if not 0 <= trust_min <= trust_max:
            raise ValueError(f"invalid trust ratio clip [{trust_min}, {trust_max}]: expected 0 <= min <= max")
        if momentum_convention not in ("torch", "tf"):
            raise ValueError(f"invalid momentum_convention {momentum_convention!r}: expected 'torch' or 'tf'")
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay, eta=eta,
                        trust_min=trust_min, trust_max=trust_max, adapt=adapt,
                        momentum_convention=momentum_convention)  # fmt: skip
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            by_device = defaultdict(list)
            for p in group["params"]:
                if p.grad is not None:
                    if p.grad.is_sparse:
                        raise RuntimeError("LayerAdaptiveSGD does not support sparse gradients")
                    by_device[(p.device, p.dtype)].append(p)
            for params in by_device.values():
                self._step_tensors(group, params)
        return loss

    def _step_tensors(self, group: dict, params: list[Tensor]) -> None:
        lr, m, wd = group["lr"], group["momentum"], group["weight_decay"]
        grads = [p.grad for p in params]
        ratios = None
        if group["adapt"]:
            ratios = trust_ratios(torch.stack(torch._foreach_norm(params)), torch.stack(torch._foreach_norm(grads)),
                                  group["eta"], wd, group["trust_min"], group["trust_max"]).unbind(0)  # fmt: skip
        d = torch._foreach_add(grads, params, alpha=wd) if wd else torch._foreach_mul(grads, 1.0)
        tf = group.get("momentum_convention", "torch") == "tf"
        if ratios is not None and not tf:
            torch._foreach_mul_(d, ratios)
        if m:
            states = [self.state[p] for p in params]
            if all("momentum_buffer" in s for s in states):
                bufs = [s["momentum_buffer"] for s in states]
                torch._foreach_mul_(bufs, m)
                torch._foreach_add_(bufs, d)
            else:
                bufs = []
                for s, di in zip(states, d, strict=True):
                    if "momentum_buffer" not in s:
                        s["momentum_buffer"] = di.clone()
                    else:
                        s["momentum_buffer"].mul_(m).add_(di)
                    bufs.append(s["momentum_buffer"])
            if group["nesterov"]:
                torch._foreach_add_(d, bufs, alpha=m)
            else:
                d = torch._foreach_mul(bufs, 1.0) if tf and ratios is not None else bufs
        if tf and ratios is not None:
            torch._foreach_mul_(d, ratios)  # lr x trust ratio on the whole (Nesterov) update, buffer included
        torch._foreach_add_(params, d, alpha=-lr)
