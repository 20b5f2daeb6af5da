"""The model's gradient profile (for the comm model): when each gradient is ready during backward."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from recipes.comm.plan import TensorSpec, grad_specs


@dataclass(frozen=True)
class GradProfile:
    specs: tuple[TensorSpec, ...]
    ready: tuple[float, ...]  # gradient-ready fractions of backward
    forward_share: float  # forward / (forward + backward), by FLOPs
    image_size: int
    bn_bytes: int  # BN running mean + variance, fp32


def _matmul_flops(m, out) -> int:
    """Forward FLOPs of a convolution or linear layer (multiply-adds x 2); 0 for the others (BN, activations)."""
    import torch

    if isinstance(m, torch.nn.Conv2d):
        return 2 * out.numel() * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]
    if isinstance(m, torch.nn.Linear):
        return 2 * out.numel() * m.in_features
    return 0


def profile_model(model_name: str, image_size: int = 224) -> GradProfile:
    """When each gradient of `model_name` is ready during backward (remembered per model and size)."""
    return _profile_model(model_name, image_size)


@functools.lru_cache(maxsize=8)
def _profile_model(model_name: str, image_size: int) -> GradProfile:
    """When each gradient of `model_name` is ready during backward, from its layers' FLOPs (one forward on the meta
    device: nothing is computed, and every machine gets the same numbers).

    At a GPU's batch sizes a convolution's time follows its FLOPs; backward runs the layers in reverse, each costing
    twice its forward (the input's gradient and the weight's), the first layer once (no input gradient), and a
    layer's gradients are ready when its backward is done."""
    import torch

    from models.factory import create_model
    from recipes.config import load_config

    cfg = load_config(None, [f"model.name={model_name}"])
    model = create_model(cfg.model, 1000)
    specs, params = grad_specs(model)
    bn = sum(
        m.running_mean.numel() * 2 * 4
        for m in model.modules()
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None
    )
    owner = {id(p): m for m in model.modules() for p in m.parameters(recurse=False)}
    order: dict = {}  # module -> position in forward
    flops: dict = {}

    def hook(m, _inp, out):
        order.setdefault(m, len(order))
        flops[m] = flops.get(m, 0) + _matmul_flops(m, out)

    handles = [m.register_forward_hook(hook) for m in set(owner.values())]
    with torch.no_grad():
        model.to("meta")(torch.empty(1, 3, image_size, image_size, device="meta"))
    for h in handles:
        h.remove()
    first = min(order, key=order.get)
    back = {m: f * (1 if m is first else 2) for m, f in flops.items()}
    total = sum(back.values())

    def ready(p) -> float:  # backward has done every layer from the last one down to p's
        m = owner[id(p)]
        return 1.0 if m not in order else sum(b for k, b in back.items() if order[k] >= order[m]) / total

    fwd = sum(flops.values())
    return GradProfile(tuple(specs), tuple(ready(p) for p in params), fwd / (fwd + total), image_size, bn)
