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
(device, dtype) group, not a Python loop over the model's tensors; the momentum and weight update is torch's fused
SGD kernel, so the optimizer understands GradScaler's `grad_scale`/`found_inf` like torch's fused optimizers: a
step with non-finite gradients is skipped on the device, with no host synchronisation.
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

    def __init__(
        self,
        params,
        lr: float = 0.1,
        *,
        momentum: float = 0.9,
        nesterov: bool = True,
        weight_decay: float = 0.0,
        eta: float = 1e-3,
        trust_min: float = 0.0,
        trust_max: float = math.inf,
        adapt: bool = True,
        momentum_convention: str = "torch",
    ):
        if lr < 0 or momentum < 0 or weight_decay < 0 or eta <= 0:
            raise ValueError(f"invalid lr={lr}, momentum={momentum}, weight_decay={weight_decay} or eta={eta}")
        if not 0 <= trust_min <= trust_max:
            raise ValueError(f"invalid trust ratio clip [{trust_min}, {trust_max}]: expected 0 <= min <= max")
        if momentum_convention not in ("torch", "tf"):
            raise ValueError(f"invalid momentum_convention {momentum_convention!r}: expected 'torch' or 'tf'")
        defaults = dict(
            lr=lr,
            momentum=momentum,
            nesterov=nesterov,
            weight_decay=weight_decay,
            eta=eta,
            trust_min=trust_min,
            trust_max=trust_max,
            adapt=adapt,
            momentum_convention=momentum_convention,
        )
        super().__init__(params, defaults)
        # GradScaler (and the trainer's finite check) hand the step `grad_scale` and `found_inf` as attributes,
        # as for torch's fused optimizers, instead of deciding on the host whether to call step().
        self._step_supports_amp_scaling = True

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
            for (device, _), params in by_device.items():
                scale, found = getattr(self, "grad_scale", None), getattr(self, "found_inf", None)
                self._step_tensors(
                    group,
                    params,
                    None if scale is None else scale.to(device),
                    None if found is None else found.to(device),
                )
        return loss

    def _step_tensors(
        self, group: dict, params: list[Tensor], grad_scale: Tensor | None, found_inf: Tensor | None
    ) -> None:
        lr, m, wd = group["lr"], group["momentum"], group["weight_decay"]
        grads = [p.grad for p in params]
        if grad_scale is not None:  # fp16 gradients still carry GradScaler's scale
            grads = torch._foreach_div(grads, grad_scale)
        d = torch._foreach_add(grads, params, alpha=wd) if wd else torch._foreach_mul(grads, 1.0)
        ratios = None
        if group["adapt"]:
            ratios = trust_ratios(
                torch.stack(torch._foreach_norm(params)),
                torch.stack(torch._foreach_norm(grads)),
                group["eta"],
                wd,
                group["trust_min"],
                group["trust_max"],
            )
        tf = ratios is not None and group.get("momentum_convention", "torch") == "tf"
        if ratios is not None and not tf:
            torch._foreach_mul_(d, ratios.unbind(0))
        bufs = []
        if m:
            for p in params:
                state = self.state[p]
                if "momentum_buffer" not in state:
                    # m * 0 + d == d: a zero buffer starts exactly like buf = d, and stays zero if the step is skipped
                    state["momentum_buffer"] = torch.zeros_like(p)
                bufs.append(state["momentum_buffer"])
        if not tf:
            # buf = m * buf + d; w -= lr * (d + m * buf) (Nesterov) or lr * buf; nothing at all when found_inf is set.
            torch._fused_sgd_(
                params,
                d,
                bufs,
                weight_decay=0.0,
                momentum=m,
                lr=lr,
                dampening=0.0,
                nesterov=bool(group["nesterov"] and m),
                maximize=False,
                is_first_step=False,
                grad_scale=None,
                found_inf=found_inf,
            )
            return
        self._step_tf(group, params, d, bufs, ratios, found_inf)

    @staticmethod
    def _step_tf(
        group: dict, params: list[Tensor], d: list[Tensor], bufs: list[Tensor], ratios: Tensor, found_inf: Tensor | None
    ) -> None:
        """TensorFlow's LARS: the buffer holds raw (decayed) gradients and lr x trust ratio scales the whole update.

        A step with `found_inf` set changes nothing, decided on the device (keep = 1 - found_inf), like the fused
        kernel: the non-finite values are zeroed first, since 0 x inf would still be NaN."""
        lr, m = group["lr"], group["momentum"]
        keep = None
        if found_inf is not None:
            # 0-dim: GradScaler and the trainer hand a flag of shape (1,), and _foreach_mul_ takes only a 0-dim tensor
            keep = 1.0 - found_inf.to(d[0].dtype).reshape(())
            for x in d:
                torch.nan_to_num_(x, nan=0.0, posinf=0.0, neginf=0.0)
            torch._foreach_mul_(d, keep)
            ratios = torch.nan_to_num(ratios, nan=0.0, posinf=0.0, neginf=0.0)
        if m:
            torch._foreach_mul_(bufs, m if keep is None else 1.0 + keep * (m - 1.0))  # a skipped step keeps buf
            torch._foreach_add_(bufs, d)
            upd = torch._foreach_add(d, bufs, alpha=m) if group["nesterov"] else torch._foreach_mul(bufs, 1.0)
            if keep is not None:
                torch._foreach_mul_(upd, keep)
        else:
            upd = d
        torch._foreach_mul_(upd, ratios.unbind(0))  # lr x trust ratio on the whole (Nesterov) update
        torch._foreach_add_(params, upd, alpha=-lr)
