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

`lars` is this with no clipping (trust_min=0, trust_max=inf). The step is a fixed number of kernels per
(device, dtype) group, whatever the number of tensors: multi-tensor `torch._foreach_*` calls, and whole-group
operations on a flat workspace that holds d for every tensor (views into it with each parameter's strides, built
once), where the per-tensor trust ratio is spread over the elements on a GPU (`repeat_interleave`; on the CPU,
where launches are free, one multiply per tensor) and the non-finite values of a skipped step are zeroed in one
kernel. `.grad` is never modified. The optimizer understands
GradScaler's `grad_scale`/`found_inf` like torch's fused optimizers: a step with non-finite gradients is skipped on
the device, with no host synchronisation. `lr` and `momentum` may be 0-dim tensors on the device (a CUDA graph
replays the step with the values they hold), or floats.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
from torch import Tensor


def _dense(p: Tensor) -> bool:
    """Whether `p` covers exactly `p.numel()` consecutive elements in some dimension order (contiguous,
    channels_last, any permutation), so a view with its strides fits a flat segment of that size."""
    expected = 1
    for size, stride in sorted(zip(p.shape, p.stride(), strict=True), key=lambda t: t[1]):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def strided_view(flat: Tensor, like: Tensor, offset: int) -> Tensor:
    """A view of `like`'s shape into the 1-d `flat` at element `offset`: with `like`'s strides where it is dense,
    so multi-tensor kernels see view and tensor in the same layout (their fast path); contiguous otherwise."""
    if _dense(like):
        return flat.as_strided(like.shape, like.stride(), flat.storage_offset() + offset)
    return flat[offset : offset + like.numel()].view(like.shape)


SPREAD_DEVICES = {"cuda"}  # device types where `_Workspace.scale_` saves launches by spreading the values


class _Workspace:
    """One flat buffer for a list of tensors, with a view per tensor (`strided_view`), built once."""

    def __init__(self, params: list[Tensor]):
        self.params = list(params)
        numels = [p.numel() for p in params]
        self.total = sum(numels)
        self.flat = torch.empty(self.total, dtype=params[0].dtype, device=params[0].device)
        offsets = [sum(numels[:i]) for i in range(len(numels))]
        self.views = [strided_view(self.flat, p, off) for p, off in zip(params, offsets, strict=True)]
        self.counts = torch.tensor(numels, device=params[0].device)

    def fits(self, params: list[Tensor]) -> bool:
        return len(params) == len(self.params) and all(a is b for a, b in zip(params, self.params, strict=True))

    def spread(self, per_tensor: Tensor) -> Tensor:
        """A 1-d tensor of one value per tensor, repeated over that tensor's elements (no host sync)."""
        return torch.repeat_interleave(per_tensor, self.counts, output_size=self.total)

    def scale_(self, per_tensor: Tensor) -> None:
        """Multiply each tensor's segment by its own value (a 1-d tensor, one per tensor), with no host sync.

        Where kernels are launched (`SPREAD_DEVICES`), two whole-workspace kernels, whatever the number of
        tensors: the values spread over the elements, then one multiply. Elsewhere (the CPU) a launch costs
        nothing while `repeat_interleave` costs many passes over the workspace, so each view is multiplied by its
        0-dim value. Both round the same: one float multiply per element."""
        if self.flat.device.type in SPREAD_DEVICES:
            self.flat.mul_(self.spread(per_tensor))
        else:
            torch._foreach_mul_(self.views, list(per_tensor.unbind()))


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

    def _workspace(self, key: tuple, params: list[Tensor]) -> _Workspace:
        spaces = self.__dict__.setdefault("_spaces", {})
        ws = spaces.get(key)
        if ws is None or not ws.fits(params):
            ws = spaces[key] = _Workspace(params)
        return ws

    def _momentum_buffers(self, params: list[Tensor]) -> list[Tensor]:
        bufs = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                # m * 0 + d == d: a zero buffer starts exactly like buf = d, and stays zero if the step is skipped
                state["momentum_buffer"] = torch.zeros_like(p)
            bufs.append(state["momentum_buffer"])
        return bufs

    def _step_tensors(
        self, group: dict, params: list[Tensor], grad_scale: Tensor | None, found_inf: Tensor | None
    ) -> None:
        lr, m, wd = group["lr"], group["momentum"], group["weight_decay"]
        ws = self._workspace((id(group), params[0].device, params[0].dtype), params)
        d = ws.views
        torch._foreach_copy_(d, [p.grad for p in params])  # d lives in the workspace: `.grad` is left alone
        if grad_scale is not None:  # fp16 gradients still carry GradScaler's scale
            ws.flat.div_(grad_scale)
        ratios = None
        if group["adapt"]:
            ratios = trust_ratios(
                torch.stack(torch._foreach_norm(params)),
                torch.stack(torch._foreach_norm(d)),
                group["eta"],
                wd,
                group["trust_min"],
                group["trust_max"],
            )
        if wd:
            torch._foreach_add_(d, params, alpha=wd)
        tf = ratios is not None and group.get("momentum_convention", "torch") == "tf"
        if ratios is not None and not tf:
            ws.scale_(ratios)
        tensor_m = isinstance(m, Tensor)
        if not tf and not tensor_m:
            # buf = m * buf + d; w -= lr * (d + m * buf) (Nesterov) or lr * buf; nothing at all when found_inf is set.
            # `lr` may be a tensor (the kernel's tensor-lr form); the momentum must be a float here.
            torch._fused_sgd_(
                params,
                d,
                self._momentum_buffers(params) if m else [],
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
        self._step_foreach(group, params, ws, ratios if tf else None, found_inf)

    def _step_foreach(
        self, group: dict, params: list[Tensor], ws: _Workspace, ratios: Tensor | None, found_inf: Tensor | None
    ) -> None:
        """The momentum and weight update in multi-tensor and whole-workspace kernels: TensorFlow's LARS (`ratios`
        given: lr x trust ratio scales the whole update, the buffer holds raw decayed gradients), or torch's
        convention with a tensor momentum (d already carries the ratio).

        A step with `found_inf` set changes nothing, decided on the device (keep = 1 - found_inf), like the fused
        kernel: the non-finite values are zeroed first (one kernel over the workspace), since 0 x inf is NaN."""
        lr, m, d = group["lr"], group["momentum"], ws.views
        tensor_m = isinstance(m, Tensor)
        keep = None
        if found_inf is not None:
            keep = 1.0 - found_inf.to(ws.flat.dtype).reshape(())
            torch.nan_to_num_(ws.flat, nan=0.0, posinf=0.0, neginf=0.0)
            ws.flat.mul_(keep)
            if ratios is not None:
                ratios = torch.nan_to_num(ratios, nan=0.0, posinf=0.0, neginf=0.0)
        if tensor_m or m:
            bufs = self._momentum_buffers(params)
            torch._foreach_mul_(bufs, m if keep is None else 1.0 + keep * (m - 1.0))  # a skipped step keeps buf
            torch._foreach_add_(bufs, d)
            if not group["nesterov"]:
                torch._foreach_copy_(d, bufs)  # u = buf
            elif tensor_m:  # u = d + m * buf, m * buf in a second workspace (no allocation per tensor)
                mb = self._workspace((id(group), params[0].device, params[0].dtype, "m*buf"), params)
                torch._foreach_copy_(mb.views, bufs)
                mb.flat.mul_(m)
                torch._foreach_add_(d, mb.views)
            else:
                torch._foreach_add_(d, bufs, alpha=m)
            if keep is not None:
                ws.flat.mul_(keep)
        if ratios is not None:
            ws.scale_(ratios)  # lr x trust ratio on the whole (Nesterov) update
        if isinstance(lr, Tensor):
            ws.flat.mul_(lr)
            torch._foreach_sub_(params, d)
        else:
            torch._foreach_add_(params, d, alpha=-lr)
