"""The optimizer factory (recipes/optim.py): parameter groups, the registry, SGD and Lamb against hand computations."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from support import ROOT, NoComm
from torch import nn

from base import registry
from base.errors import ConfigError
from models import create_model
from recipes.config import load_config
from recipes.lars import LayerAdaptiveSGD
from recipes.optim import OPTIMIZERS, create_optimizer, describe_groups, param_groups, set_lr_momentum


def _cfg(*overrides):
    return load_config(ROOT / "configs" / "base.yaml", list(overrides))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, bias=False)
        self.bn = nn.BatchNorm2d(3)
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(self.bn(self.conv(x)).mean((2, 3)))


def test_resnet50_groups_no_decay_on_bn_and_bias():
    model = create_model(_cfg().model, 1000)  # resnet50_tweaked
    groups = param_groups(model, 1e-4, no_bn_decay=True)
    weights, bn_bias = groups
    assert (weights["label"], bn_bias["label"]) == ("weights", "bn_bias")
    assert weights["kinds"] == {"Conv2d.weight": 55, "Linear.weight": 1}
    assert bn_bias["kinds"] == {"BatchNorm2d.bias": 55, "BatchNorm2d.weight": 55, "Linear.bias": 1}
    assert weights["weight_decay"] == 1e-4 and bn_bias["weight_decay"] == 0.0
    assert weights["adapt"] and not bn_bias["adapt"]
    assert sum(p.numel() for p in bn_bias["params"]) == 54_248
    assert sum(p.numel() for g in groups for p in g["params"]) == sum(p.numel() for p in model.parameters())
    assert "fc.bias" in bn_bias["names"] and "layer1.0.bn3.weight" in bn_bias["names"]
    assert "conv1.0.weight" in weights["names"]  # ResNet-D deep stem


def test_groups_when_bn_decays_or_is_adapted():
    groups = param_groups(Tiny(), 5e-4, no_bn_decay=False, adapt_bn_bias=True)
    assert [(g["label"], g["weight_decay"], g["adapt"]) for g in groups] == [
        ("weights", 5e-4, True),
        ("bn_bias", 5e-4, True),
    ]


def test_log_lines_name_counts_and_sizes():
    opt = create_optimizer(_cfg("optim.name=hybrid").optim, Tiny())
    assert describe_groups(opt) == [
        "param group 0 (weights): 2 tensors, 60 values, weight_decay=0.0001, adapt=True "
        "[Conv2d.weight x1, Linear.weight x1]",
        "param group 1 (bn_bias): 3 tensors, 8 values, weight_decay=0, adapt=False "
        "[BatchNorm2d.bias x1, BatchNorm2d.weight x1, Linear.bias x1]",
    ]
    sgd_lines = describe_groups(create_optimizer(_cfg().optim, Tiny()))
    assert "adapt" not in " ".join(sgd_lines)  # plain SGD has no adaptation to report


def test_registry_and_config_values_reach_the_optimizer():
    hybrid = create_optimizer(_cfg("optim.name=hybrid", "optim.eta=8e-4", "optim.trust_clip_min=1e-5").optim, Tiny())
    assert isinstance(hybrid, LayerAdaptiveSGD)
    g = hybrid.param_groups[0]
    assert (g["eta"], g["trust_min"], g["trust_max"], g["nesterov"]) == (8e-4, 1e-5, 1.0, True)
    lars = create_optimizer(_cfg("optim.name=lars").optim, Tiny())
    assert (lars.param_groups[0]["trust_min"], lars.param_groups[0]["trust_max"]) == (0.0, float("inf"))
    names = list(registry.OPTIMIZERS)
    with pytest.raises(ConfigError, match=f"optim.name: expected one of {', '.join(map(repr, names))}, got 'adam'"):
        _cfg("optim.name=adam")  # a wrong name fails when the config loads
    with pytest.raises(ConfigError, match=f"optim.name: unknown optimizer 'adam' .*{', '.join(names)}"):
        create_optimizer(dataclasses.replace(_cfg().optim, name="adam"), Tiny())  # a config made in code
    with pytest.raises(ConfigError, match=r"optim.trust_clip_min: 2.0 is above optim.trust_clip_max \(1.0\)"):
        _cfg("optim.name=hybrid", "optim.trust_clip_min=2")  # refused when the config loads
    bad = dataclasses.replace(_cfg("optim.name=hybrid").optim, trust_clip_min=2.0)
    with pytest.raises(ConfigError, match=r"optim.trust_clip_min: 2.0 is above optim.trust_clip_max \(1.0\)"):
        create_optimizer(bad, Tiny())  # a config made in code


def test_set_lr_momentum_reaches_every_group():
    opt = create_optimizer(_cfg("optim.name=hybrid").optim, Tiny())
    set_lr_momentum(opt, 3.0, 0.95)
    assert [(g["lr"], g["momentum"]) for g in opt.param_groups] == [(3.0, 0.95), (3.0, 0.95)]


def test_sgd_two_steps_by_hand():
    """Nesterov SGD with decay on the weights only: d = g + wd*w; buf = m*buf + d; w -= lr*(d + m*buf)."""
    model = Tiny()
    opt = create_optimizer(_cfg("optim.lr=0.5", "optim.momentum=0.9", "optim.weight_decay=0.01").optim, model)
    w0 = {n: p.detach().double().numpy().copy() for n, p in model.named_parameters()}
    g1 = {n: np.full(p.shape, 0.1) for n, p in model.named_parameters()}
    g2 = {n: np.full(p.shape, -0.2) for n, p in model.named_parameters()}
    for grads in (g1, g2):
        for n, p in model.named_parameters():
            p.grad = torch.tensor(grads[n], dtype=torch.float32)
        opt.step()
    for n, p in model.named_parameters():
        wd = 0.01 if p.ndim > 1 else 0.0
        d1 = g1[n] + wd * w0[n]
        w1 = w0[n] - 0.5 * (d1 + 0.9 * d1)
        d2 = g2[n] + wd * w1
        buf = 0.9 * d1 + d2
        w2 = w1 - 0.5 * (d2 + 0.9 * buf)
        np.testing.assert_allclose(p.detach().numpy(), w2, rtol=1e-6, atol=1e-7, err_msg=n)


def test_lamb_one_step_by_hand():
    """First Lamb step: m_hat = g, v_hat = g^2, u = g / (|g| + eps) + wd*w; adapted: w -= lr * |w|/|u| * u."""
    model = Tiny()
    torch.manual_seed(3)
    opt = create_optimizer(_cfg("optim.name=lamb", "optim.lr=0.01", "optim.weight_decay=0.1").optim, model)
    w0 = {n: p.detach().double().numpy().copy() for n, p in model.named_parameters()}
    grads = {n: torch.randn(p.shape).double().numpy() for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        p.grad = torch.tensor(grads[n], dtype=torch.float32)
    opt.step()
    for n, p in model.named_parameters():
        g, w = grads[n], w0[n]
        if p.ndim > 1:
            u = g / (np.abs(g) + 1e-6) + 0.1 * w
            expected = w - 0.01 * (np.linalg.norm(w) / np.linalg.norm(u)) * u
        else:
            expected = w - 0.01 * g / (np.abs(g) + 1e-6)  # no decay, not adapted
        np.testing.assert_allclose(p.detach().numpy(), expected, rtol=1e-5, atol=1e-7, err_msg=n)


def test_lamb_refuses_decay_without_adaptation():
    with pytest.raises(ConfigError, match="optim.name=lamb adapts every parameter that decays"):
        create_optimizer(_cfg("optim.name=lamb", "optim.no_bn_decay=false").optim, Tiny())


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_every_optimizer_lowers_the_loss_of_a_tiny_problem(name):
    """At one of a few learning rates (a layer-adaptive one moves by a trust ratio, an Adam-like one by its step
    size, SGD by the gradient), 30 steps take the loss of a learnable problem down by 30%."""
    tried = {}
    for lr in (0.05, 0.1, 5.0):
        torch.manual_seed(0)
        model = Tiny()
        opt = create_optimizer(_cfg(f"optim.name={name}", f"optim.lr={lr}", "optim.eta=0.02").optim, model)
        x = torch.randn(64, 2, 6, 6)
        y = (x[:, 0].mean((1, 2)) > x[:, 1].mean((1, 2))).long()  # learnable from the input
        losses = []
        for _ in range(30):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        if losses[-1] < 0.7 * losses[0]:
            return
        tried[lr] = (losses[0], losses[-1])
    pytest.fail(f"{name}: the loss did not fall by 30% at any learning rate tried: {tried}")


def test_grad_scaler_skips_a_hybrid_step_with_inf_gradients():
    model = Tiny()
    opt = create_optimizer(_cfg("optim.name=hybrid").optim, model)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.randn(4, 2, 6, 6)).sum()
    scaler.scale(loss).backward()
    model.conv.weight.grad[0, 0, 0, 0] = float("inf")
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, b)


@pytest.mark.parametrize("name", [n for n, r in OPTIMIZERS.items() if r.skips_on_device])
def test_found_inf_skips_the_step_on_the_device_even_the_first(name):
    """A step given found_inf=1 leaves weights and momentum untouched (no host decision); the next finite step
    then lands exactly where an optimizer that never saw the bad step lands."""
    torch.manual_seed(0)
    a, b = Tiny(), Tiny()
    b.load_state_dict(a.state_dict())
    cfg = _cfg(f"optim.name={name}", "optim.momentum=0.9").optim
    opt_a, opt_b = create_optimizer(cfg, a), create_optimizer(cfg, b)
    assert opt_a._step_supports_amp_scaling  # the trainer relies on it (recipes.optim.skips_on_device)
    for p in a.parameters():
        p.grad = torch.full_like(p, float("nan"))
    before = [p.detach().clone() for p in a.parameters()]
    shape = OPTIMIZERS[name].skip_flag_shape  # the flag as the trainer hands it over (recipes/steps.py)
    opt_a.found_inf = torch.ones(shape)
    opt_a.step()  # the very first step: torch's fused SGD would leave empty_like momentum buffers here
    del opt_a.found_inf
    for p, q in zip(a.parameters(), before, strict=True):
        assert torch.equal(p, q)
    for _ in range(2):
        grads = [torch.randn_like(p) for p in a.parameters()]
        for pa, pb, g in zip(a.parameters(), b.parameters(), grads, strict=True):
            pa.grad, pb.grad = g.clone(), g.clone()
        opt_a.found_inf = torch.zeros(shape)
        opt_a.step()
        del opt_a.found_inf
        opt_b.step()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_adamw_trains_through_the_step_runner_as_torchs_adamw():
    """optim.name=adamw on the CPU (unfused: optim.fused=auto): four steps through StepRunner, the second with a NaN
    input (skipped on the device), land where torch's own AdamW lands after the three finite ones."""
    from recipes.rundir.payload import State
    from recipes.steps import StepRunner

    cfg = _cfg("optim.name=adamw", "optim.lr=0.01", "optim.betas=[0.8, 0.99]", "optim.eps=1e-6").optim
    torch.manual_seed(0)
    model, ref = Tiny(), Tiny()
    ref.load_state_dict(model.state_dict())
    opt = create_optimizer(cfg, model)
    assert not opt.defaults["fused"]
    groups = [{k: g[k] for k in ("params", "weight_decay")} for g in param_groups(ref, cfg.weight_decay, True)]
    torch_opt = torch.optim.AdamW(groups, lr=0.01, betas=(0.8, 0.99), eps=1e-6)

    class Log:
        def warn(self, msg):
            pass

    runner = StepRunner(
        model=model,
        train_model=model,
        optimizer=opt,
        optim=registry.OPTIMIZERS["adamw"],
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        comm=NoComm(),
        criterion=nn.CrossEntropyLoss(),
        device=torch.device("cpu"),
        on_nonfinite="skip",
    )
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randn(4, 2, 6, 6, generator=g), torch.randint(0, 2, (4,), generator=g)) for _ in range(4)]
    batches[1][0][0, 0, 0, 0] = float("nan")
    st = State()
    for x, y in batches:
        set_lr_momentum(opt, 0.01, 0.9)
        runner(x, y, st, Log())
    runner.settle(st, Log())
    assert st.skipped_steps == 1
    for x, y in (batches[0], batches[2], batches[3]):
        torch_opt.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        torch_opt.step()
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


def test_adamw_keys_are_checked():
    with pytest.raises(ConfigError, match=r"optim.fused=true: torch's fused AdamW runs on CUDA"):
        create_optimizer(_cfg("optim.name=adamw", "optim.fused=true").optim, Tiny())
    with pytest.raises(ConfigError, match=r"optim.betas: expected two numbers"):
        create_optimizer(_cfg("optim.name=adamw", "optim.betas=[0.9]").optim, Tiny())
    with pytest.raises(ConfigError, match=r"optim.betas.1: expected a number in \[0, 1\), got 1.5"):
        _cfg("optim.name=adamw", "optim.betas=[0.9, 1.5]")
