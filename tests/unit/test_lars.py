"""LARS and the record's hybrid optimizer (recipes/lars.py) against hand computations and timm's Lars."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from recipes import lars
from recipes.lars import LayerAdaptiveSGD, trust_ratios


def test_trust_ratio_formula_zero_rule_and_clip():
    w = torch.tensor([2.0, 0.0, 1.0, 3.0, 1.0])
    g = torch.tensor([1.0, 1.0, 0.0, 1e-6, 1e4])
    r = trust_ratios(w, g, eta=0.5, weight_decay=0.1, lo=0.0, hi=math.inf)
    # 0.5 * 2 / (1 + 0.1 * 2); zero weight or zero grad -> 1; tiny grad -> eta / wd; huge grad -> tiny ratio
    expected = [1.0 / 1.2, 1.0, 1.0, 0.5 * 3 / (1e-6 + 0.3), 0.5 / (1e4 + 0.1)]
    np.testing.assert_allclose(r.numpy(), expected, rtol=1e-6)
    clipped = trust_ratios(w, g, eta=0.5, weight_decay=0.1, lo=1e-3, hi=1.0)
    np.testing.assert_allclose(clipped.numpy(), [1.0 / 1.2, 1.0, 1.0, 1.0, 1e-3], rtol=1e-6)


def _hand_step(w, g, buf, *, lr, m, wd, eta, lo, hi, adapt, nesterov=True):
    """One update of one tensor, written out in float64 numpy, independent of the implementation."""
    d = g + wd * w
    if adapt:
        wn, gn = np.linalg.norm(w), np.linalg.norm(g)
        r = eta * wn / (gn + wd * wn) if wn > 0 and gn > 0 else 1.0
        d = min(max(r, lo), hi) * d
    buf = d.copy() if buf is None else m * buf + d
    u = d + m * buf if nesterov else buf
    return w - lr * u, buf


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)
        self.fc2 = nn.Linear(3, 2, bias=False)


def _tiny_groups(model, wd, adapt_bn):
    weights = [model.fc1.weight, model.fc2.weight]
    others = [model.fc1.bias, model.bn.weight, model.bn.bias]
    return [
        {"params": weights, "weight_decay": wd, "adapt": True},
        {"params": others, "weight_decay": 0.0, "adapt": adapt_bn},
    ]


@pytest.mark.parametrize("lo,hi", [(0.0, math.inf), (1e-5, 1.0), (0.05, 0.2)])
@pytest.mark.parametrize("adapt_bn", [False, True])
def test_several_steps_match_hand_computation(lo, hi, adapt_bn):
    torch.manual_seed(0)
    model = Tiny()
    with torch.no_grad():
        model.bn.weight.uniform_(0.5, 1.5)
    lr, m, wd, eta = 0.7, 0.9, 1e-2, 0.3
    opt = LayerAdaptiveSGD(
        _tiny_groups(model, wd, adapt_bn), lr=lr, momentum=m, weight_decay=wd, eta=eta, trust_min=lo, trust_max=hi
    )
    params = [p for g in opt.param_groups for p in g["params"]]
    setting = [(g["weight_decay"], g["adapt"]) for g in opt.param_groups for _ in g["params"]]
    ws = [p.detach().double().numpy().copy() for p in params]
    bufs = [None] * len(params)
    gen = torch.Generator().manual_seed(1)
    for step in range(4):
        grads = [torch.randn(p.shape, generator=gen) * (10.0 if step == 2 else 0.1) for p in params]
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        opt.step()
        for i, (g, (p_wd, p_adapt)) in enumerate(zip(grads, setting, strict=True)):
            ws[i], bufs[i] = _hand_step(
                ws[i], g.double().numpy(), bufs[i], lr=lr, m=m, wd=p_wd, eta=eta, lo=lo, hi=hi, adapt=p_adapt
            )
        for p, w in zip(params, ws, strict=True):
            np.testing.assert_allclose(p.detach().numpy(), w, rtol=1e-5, atol=1e-6)


def test_clipping_changes_the_update_only_where_the_ratio_is_outside_the_range():
    # ||w|| = 10, ||g|| = 1: ratio = 0.5 * 10 / 1 = 5 -> lars keeps 5, hybrid clips to 1.
    def run(hi):
        w = nn.Parameter(torch.full((4,), 5.0))
        opt = LayerAdaptiveSGD([w], lr=0.1, momentum=0.0, weight_decay=0.0, eta=0.5, trust_min=0.0, trust_max=hi)
        w.grad = torch.full((4,), 0.5)
        opt.step()
        return w.detach()

    np.testing.assert_allclose(run(math.inf).numpy(), 5.0 - 0.1 * 5 * 0.5)
    np.testing.assert_allclose(run(1.0).numpy(), 5.0 - 0.1 * 1 * 0.5)


def test_unadapted_group_is_exactly_torch_sgd_and_grads_are_left_alone():
    torch.manual_seed(0)
    a, b = Tiny(), Tiny()
    b.load_state_dict(a.state_dict())
    ours = LayerAdaptiveSGD([{"params": list(a.parameters()), "adapt": False}], lr=0.3, momentum=0.9, weight_decay=1e-3)
    ref = torch.optim.SGD(b.parameters(), lr=0.3, momentum=0.9, nesterov=True, weight_decay=1e-3, foreach=True)
    for _ in range(3):
        grads = [torch.randn_like(p) for p in a.parameters()]
        for pa, pb, g in zip(a.parameters(), b.parameters(), grads, strict=True):
            pa.grad, pb.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
        for pa, g in zip(a.parameters(), grads, strict=True):
            assert torch.equal(pa.grad, g)  # the optimizer must not modify .grad (GradScaler and logs read it)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb)


def test_unclipped_matches_timm_lars():
    from timm.optim import Lars

    torch.manual_seed(0)
    a, b = Tiny(), Tiny()
    b.load_state_dict(a.state_dict())
    wd = 1e-2
    ours = LayerAdaptiveSGD(_tiny_groups(a, wd, False), lr=2.0, momentum=0.9, weight_decay=wd, eta=1e-3)
    # timm adapts exactly the groups whose weight decay is non-zero: the same split as ours.
    ref = Lars(_tiny_groups(b, wd, False), lr=2.0, momentum=0.9, nesterov=True, trust_coeff=1e-3, eps=0.0)
    for _ in range(5):
        grads = [torch.randn_like(p) for p in a.parameters()]
        for pa, pb, g in zip(a.parameters(), b.parameters(), grads, strict=True):
            pa.grad, pb.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb)


def test_momentum_and_lr_are_read_from_the_group_each_step():
    w = nn.Parameter(torch.ones(3))
    opt = LayerAdaptiveSGD([{"params": [w], "adapt": False}], lr=1.0, momentum=0.5, nesterov=False)
    w.grad = torch.ones(3)
    opt.step()  # buf = 1, w = 1 - 1 = 0
    opt.param_groups[0]["momentum"], opt.param_groups[0]["lr"] = 0.25, 2.0
    opt.step()  # buf = 0.25 * 1 + 1 = 1.25, w = 0 - 2 * 1.25
    np.testing.assert_allclose(w.detach().numpy(), -2.5)
    state = opt.state_dict()
    again = LayerAdaptiveSGD([{"params": [w], "adapt": False}], lr=1.0, momentum=0.5, nesterov=False)
    again.load_state_dict(state)
    torch.testing.assert_close(again.state[w]["momentum_buffer"], torch.full((3,), 1.25))


def _count_ops(fn) -> int:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


def test_step_is_foreach_not_a_loop_over_tensors():
    """The number of tensor ops per step does not grow with the number of parameter tensors."""

    def ops_for(layers: int) -> int:
        model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)) for _ in range(layers)])
        weights = [p for p in model.parameters() if p.ndim > 1]
        others = [p for p in model.parameters() if p.ndim <= 1]
        groups = [{"params": weights, "weight_decay": 1e-4, "adapt": True}, {"params": others, "adapt": False}]
        opt = LayerAdaptiveSGD(groups, lr=0.1, momentum=0.9, weight_decay=1e-4, trust_min=1e-5, trust_max=1.0)
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt.step()  # the first step creates the momentum buffers
        return _count_ops(opt.step)

    small, large = ops_for(4), ops_for(40)
    assert small == large < 40, (small, large)


def test_bad_arguments():
    w = nn.Parameter(torch.ones(2))
    with pytest.raises(ValueError, match="trust ratio clip"):
        LayerAdaptiveSGD([w], trust_min=1.0, trust_max=0.5)
    with pytest.raises(ValueError, match="eta"):
        LayerAdaptiveSGD([w], eta=0.0)


def _hand_step_tf(w, g, buf, *, lr, m, wd, eta, lo, hi, adapt, nesterov=True):
    """TensorFlow's LARSOptimizer: ApplyMomentum(var, accum, lr * r, g + wd * w); the buffer holds raw gradients."""
    d = g + wd * w
    r = 1.0
    if adapt:
        wn, gn = np.linalg.norm(w), np.linalg.norm(g)
        r = min(max(eta * wn / (gn + wd * wn) if wn > 0 and gn > 0 else 1.0, lo), hi)
    buf = m * (np.zeros_like(w) if buf is None else buf) + d  # TF's slot starts at zero
    u = d + m * buf if nesterov else buf
    return w - lr * r * u, buf


@pytest.mark.parametrize("convention", ["torch", "tf"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_both_momentum_conventions_match_hand_computation_with_a_moving_lr(convention, nesterov):
    torch.manual_seed(0)
    model = Tiny()
    wd, eta, lo, hi = 1e-2, 0.3, 1e-5, 1.0
    opt = LayerAdaptiveSGD(
        _tiny_groups(model, wd, False),
        lr=1.0,
        momentum=0.9,
        nesterov=nesterov,
        weight_decay=wd,
        eta=eta,
        trust_min=lo,
        trust_max=hi,
        momentum_convention=convention,
    )
    hand = _hand_step if convention == "torch" else _hand_step_tf
    params = [p for g in opt.param_groups for p in g["params"]]
    setting = [(g["weight_decay"], g["adapt"]) for g in opt.param_groups for _ in g["params"]]
    ws = [p.detach().double().numpy().copy() for p in params]
    bufs = [None] * len(params)
    gen = torch.Generator().manual_seed(2)
    schedule = [(0.5, 0.98), (5.0, 0.95), (25.0, 0.90), (12.0, 0.93), (0.2, 0.98)]  # warm-up, peak, decay
    for lr, m in schedule:
        for g in opt.param_groups:
            g["lr"], g["momentum"] = lr, m
        grads = [torch.randn(p.shape, generator=gen) * 0.1 for p in params]
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        opt.step()
        for i, (g, (p_wd, p_adapt)) in enumerate(zip(grads, setting, strict=True)):
            ws[i], bufs[i] = hand(
                ws[i],
                g.double().numpy(),
                bufs[i],
                lr=lr,
                m=m,
                wd=p_wd,
                eta=eta,
                lo=lo,
                hi=hi,
                adapt=p_adapt,
                nesterov=nesterov,
            )
        for p, w in zip(params, ws, strict=True):
            np.testing.assert_allclose(p.detach().numpy(), w, rtol=1e-5, atol=1e-6)


def test_conventions_differ_once_the_trust_ratio_moves():
    """Same gradients, same schedule: the record's (tf) and PyTorch's conventions end at different weights."""
    out = {}
    for convention in ("torch", "tf"):
        torch.manual_seed(0)
        model = Tiny()
        adapted = [model.fc1.weight, model.fc2.weight]
        start = [p.detach().clone() for p in adapted]
        opt = LayerAdaptiveSGD(
            _tiny_groups(model, 1e-4, False),
            lr=25.0,
            momentum=0.9,
            weight_decay=1e-4,
            eta=8e-4,
            trust_min=1e-5,
            trust_max=1.0,
            momentum_convention=convention,
        )
        gen = torch.Generator().manual_seed(3)
        for scale in (0.1, 1.0, 0.01, 0.5):
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=gen) * scale
            opt.step()
        out[convention] = (start, [p.detach().clone() for p in adapted])
    moved = sum(float((b - a).norm()) for a, b in zip(*out["torch"], strict=True))
    apart = sum(float((a - b).norm()) for a, b in zip(out["torch"][1], out["tf"][1], strict=True))
    assert apart > 0.1 * moved


def test_unknown_momentum_convention_is_refused():
    with pytest.raises(ValueError, match="momentum_convention"):
        LayerAdaptiveSGD(Tiny().parameters(), momentum_convention="keras")


@pytest.mark.parametrize("convention", ["torch", "tf"])
def test_the_gpu_and_cpu_trust_ratio_multiplies_step_identically(monkeypatch, convention):
    """The workspace-wide multiply (the ratios spread over the elements, as on a GPU) and the CPU's per-tensor one
    give the same bits, through a tensor momentum and a skipped step."""

    def run(spread_devices: set) -> list:
        monkeypatch.setattr(lars, "SPREAD_DEVICES", spread_devices)
        torch.manual_seed(0)
        model = Tiny()
        opt = LayerAdaptiveSGD(
            _tiny_groups(model, 1e-2, False), lr=1.0, momentum=0.9, weight_decay=1e-2, eta=0.3,
            trust_min=1e-5, trust_max=1.0, momentum_convention=convention,
        )  # fmt: skip
        gen = torch.Generator().manual_seed(2)
        for step in range(4):
            for g in opt.param_groups:
                g["momentum"] = torch.tensor(0.9) if step == 2 else 0.9
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=gen)
            opt.found_inf = torch.tensor(float(step == 1))
            opt.step()
        return [p.detach().clone() for p in model.parameters()]

    cpu, gpu = run({"cuda"}), run({"cuda", "cpu"})
    assert all(torch.equal(a, b) for a, b in zip(cpu, gpu, strict=True))
    torch.manual_seed(0)
    assert not any(torch.equal(a, b) for a, b in zip(Tiny().parameters(), cpu, strict=True))  # every tensor moved
