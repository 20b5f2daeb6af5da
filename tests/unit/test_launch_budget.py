"""How many ops the host issues per training step outside forward and backward (recipes/comm/engine.py,
recipes/lars.py, recipes/steps.py), counted at the dispatcher with a TorchDispatchMode, and that no step reads a
device value on the host.

Every op the dispatcher sees is at least one kernel launch on a GPU, and the small-image phases of the record are
bound by those launches, so the budgets are per step and must not grow with the number of parameter tensors.
"""

from __future__ import annotations

import copy
from collections import Counter
from functools import partial

import pytest
import torch
import torch.distributed as td
from support import optim_record, trap_host_reads
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from recipes import lars
from recipes.comm.engine import _Engine
from recipes.comm.plan import Settings, build_plan, grad_specs
from recipes.config import load_config
from recipes.lars import LayerAdaptiveSGD
from recipes.optim import create_optimizer
from recipes.rundir.payload import State
from recipes.steps import StepRunner


@pytest.fixture(autouse=True)
def _gpu_paths(monkeypatch):
    """Count the ops a GPU runs: the workspace-wide trust-ratio multiply, not the CPU's per-tensor one."""
    monkeypatch.setattr(lars, "SPREAD_DEVICES", {"cuda", "cpu"})


class _Count(TorchDispatchMode):
    """Counts compute ops and view ops (which launch nothing) by name."""

    def __init__(self):
        super().__init__()
        self.compute, self.views = Counter(), Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        (self.views if func.is_view else self.compute)[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _count(fn) -> _Count:
    with _Count() as c:
        fn()
    return c


class _Done:
    def wait(self):
        return True


def _no_allreduce(monkeypatch):
    """One rank: the collective is the identity, so only the engine's own ops are counted."""
    monkeypatch.setattr(td, "all_reduce", lambda t, group=None, async_op=False: _Done())


def _net(layers: int) -> nn.Module:
    blocks = [
        nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU()) for _ in range(layers)
    ]
    net = nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    return net.to(memory_format=torch.channels_last)


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 6, 6, generator=g).contiguous(memory_format=torch.channels_last)
    return x, torch.tensor([0, 2])


def _engine(model: nn.Module, bucket_mb: float = 100.0, compression: str = "none") -> _Engine:
    specs, params = grad_specs(model)
    plan = build_plan(specs, Settings(bucket_mb, 2, 2), compression)
    eng = _Engine(plan, params, [object(), object()], 1, False, 30.0)
    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(partial(lambda i, _p: eng.grad_ready(i), i))
    return eng


def _backward_ops(model: nn.Module) -> _Count:
    x, y = _data()
    loss = nn.functional.cross_entropy(model(x), y)

    def run():
        model.zero_grad(set_to_none=True)
        loss.backward()

    return _count(run)


@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_multistream_engine_ops_per_step_do_not_grow_with_the_parameters(monkeypatch, compression):
    """The engine's ops per backward (its hooks and end-of-backward callback) are a few per bucket: no copy of a
    gradient into its bucket or back per parameter (today's engine had 2 copies per parameter)."""
    _no_allreduce(monkeypatch)

    def engine_ops(layers: int) -> tuple[Counter, Counter, int]:
        torch.manual_seed(0)
        plain, hooked = _net(layers), _net(layers)
        hooked.load_state_dict(plain.state_dict())
        eng = _engine(hooked, compression=compression)
        _backward_ops(hooked)  # the first step binds `.grad` to the bucket views
        base, with_engine = _backward_ops(plain), _backward_ops(hooked)
        for p, q in zip(plain.parameters(), hooked.parameters(), strict=True):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-3 if compression == "fp16" else 0, atol=1e-4)
            assert q.grad.stride() == q.stride()  # the view keeps the parameter's layout (channels_last)
        return with_engine.compute - base.compute, with_engine.views - base.views, len(eng.plan.buckets)

    small, small_views, buckets = engine_ops(10)
    large, large_views, buckets_large = engine_ops(40)
    assert buckets == buckets_large == 1  # 100 MB buckets: the whole net in one, whatever its depth
    assert small == large, (small, large)
    assert sum(small.values()) <= (4 if compression == "fp16" else 2) * buckets, small  # copy in, div_, casts
    assert small["copy_"] == (2 * buckets if compression == "fp16" else 0), small
    assert sum(small_views.values()) <= 2 and small_views == large_views, small_views


def _lars_step_ops(layers: int, convention: str, tensors: bool) -> Counter:
    torch.manual_seed(0)
    model = _net(layers)
    weights = [p for p in model.parameters() if p.ndim > 1]
    others = [p for p in model.parameters() if p.ndim <= 1]
    groups = [{"params": weights, "weight_decay": 1e-4, "adapt": True}, {"params": others, "adapt": False}]
    opt = LayerAdaptiveSGD(
        groups, lr=0.1, momentum=0.9, eta=1e-3, trust_min=1e-5, trust_max=1.0, momentum_convention=convention
    )
    if tensors:
        for g in opt.param_groups:
            g["lr"], g["momentum"] = torch.tensor(0.1), torch.tensor(0.9)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.found_inf = torch.zeros(1)  # as GradScaler and the step runner hand it, every step
    opt.step()  # the first step creates the momentum buffers and the workspaces
    return _count(opt.step).compute


@pytest.mark.parametrize("convention", ["tf", "torch"])
@pytest.mark.parametrize("tensors", [False, True], ids=["float_lr", "tensor_lr"])
def test_lars_step_ops_do_not_grow_with_the_parameters(convention, tensors):
    """No per-tensor kernels (today's `tf` ran nan_to_num_ per tensor and a per-tensor trust-ratio multiply)."""
    small, large = _lars_step_ops(10, convention, tensors), _lars_step_ops(40, convention, tensors)
    assert small == large, (small, large)
    assert sum(small.values()) <= 60, small
    assert small["nan_to_num_"] <= 2 and small["mul_"] <= 12, small


def _record_step(monkeypatch):
    """The record's step on CPU: its model (resnet50's 161 tensors, 1/8 of its widths, so CPU time stays small),
    hybrid LARS with `tf` momentum, fp16 GradScaler, channels_last and the multistream engine on one rank (the
    collective is the identity)."""
    import timm

    _no_allreduce(monkeypatch)
    cfg = load_config("configs/dawnbench_158s.yaml", ["run.device=cpu"])
    torch.manual_seed(0)
    model = timm.create_model("resnet50", num_classes=10, channels=(8, 16, 32, 64), stem_width=8, base_width=8).to(
        memory_format=torch.channels_last
    )
    opt = create_optimizer(cfg.optim, model)
    for g in opt.param_groups:
        g["lr"], g["momentum"] = 0.01, 0.9
    bare = copy.deepcopy(model)  # for forward and backward without the engine's hooks
    mb = sum(p.numel() * 4 for p in model.parameters()) / 16 / 2**20
    eng = _engine(model, bucket_mb=mb)  # about the record's 12 buckets (8 MB each at resnet50's full width)

    class Comm:
        def on_step_end(self, step, log):
            pass

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    runner = StepRunner(
        model=model,
        train_model=model,
        optimizer=opt,
        optim=optim_record(opt),
        scaler=scaler,
        comm=Comm(),
        criterion=nn.CrossEntropyLoss(label_smoothing=0.1),
        device=torch.device("cpu"),
        amp="fp16",
    )
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 32, 32, generator=g).contiguous(memory_format=torch.channels_last)
    y = torch.tensor([1, 7])
    return runner, eng, bare, scaler, x, y


def test_the_record_step_outside_forward_and_backward_is_a_quarter_of_what_it_was(monkeypatch):
    """The record's step (resnet50, 161 tensors) issues at most 117 ops beyond its forward and backward: a quarter
    of the ~470 of the engine that copied every gradient and the optimizer's per-tensor kernels."""
    runner, eng, bare_model, scaler, x, y = _record_step(monkeypatch)
    assert len(list(bare_model.parameters())) == 161 and len(eng.plan.buckets) >= 10
    st = State()
    runner(x, y, st)  # momentum buffers, workspaces, bucket views

    def fwd_bwd():
        bare_model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = runner.criterion(bare_model(x), y)
        scaler.scale(loss).backward()

    step, bare = _count(lambda: runner(x, y, st)), _count(fwd_bwd)
    extra = sum(step.compute.values()) - sum(bare.compute.values())
    assert extra <= 117, (extra, step.compute - bare.compute)
    assert step.compute["copy_"] - bare.compute["copy_"] <= 4, step.compute["copy_"]


def test_the_record_step_reads_nothing_on_the_host(monkeypatch):
    """Two steps of the record's step with every host read of a tensor trapped: the step never waits on the
    device (the non-finite flags are read later, in `settle`)."""
    runner, _, _, _, x, y = _record_step(monkeypatch)
    st = State()
    runner(x, y, st)
    trap_host_reads(monkeypatch)
    for _ in range(2):
        runner(x, y, st)
    monkeypatch.undo()
    assert len(runner.pending) == 3 and st.step == 3


@pytest.mark.parametrize("convention", ["tf", "torch"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_tensor_lr_and_momentum_step_like_floats_including_a_skipped_step(convention, nesterov):
    """LR and momentum as 0-dim tensors (what a captured step reads) give the float path's weights and buffers over
    a moving schedule, and a step flagged non-finite changes nothing on either path."""
    torch.manual_seed(0)
    ref, ten = _net(3), _net(3)
    ten.load_state_dict(ref.state_dict())

    def make(model):
        weights = [p for p in model.parameters() if p.ndim > 1]
        others = [p for p in model.parameters() if p.ndim <= 1]
        groups = [{"params": weights, "weight_decay": 1e-4, "adapt": True}, {"params": others, "adapt": False}]
        return LayerAdaptiveSGD(
            groups,
            lr=0.1,
            momentum=0.9,
            nesterov=nesterov,
            eta=1e-3,
            trust_min=1e-5,
            trust_max=1.0,
            momentum_convention=convention,
        )

    a, b = make(ref), make(ten)
    lr_t, m_t = torch.tensor(0.0), torch.tensor(0.0)
    for g in b.param_groups:
        g["lr"], g["momentum"] = lr_t, m_t
    gen = torch.Generator().manual_seed(3)
    for step, (lr, m) in enumerate([(0.5, 0.98), (5.0, 0.95), (25.0, 0.9), (12.0, 0.93)]):
        for g in a.param_groups:
            g["lr"], g["momentum"] = lr, m
        lr_t.fill_(lr)
        m_t.fill_(m)
        bad = step == 2
        for p, q in zip(ref.parameters(), ten.parameters(), strict=True):
            p.grad = torch.randn(p.shape, generator=gen).contiguous(memory_format=torch.preserve_format) * 0.1
            if bad:
                p.grad.view(-1)[0] = float("inf")
            q.grad = p.grad.clone()
        before = [p.detach().clone() for p in ten.parameters()]
        for opt in (a, b):
            opt.found_inf = torch.ones(1) if bad else torch.zeros(1)
            opt.step()
            del opt.found_inf
        for p, q, w in zip(ref.parameters(), ten.parameters(), before, strict=True):
            torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)
            if bad:
                assert torch.equal(q, w)
    for p, q in zip(ref.parameters(), ten.parameters(), strict=True):
        torch.testing.assert_close(b.state[q]["momentum_buffer"], a.state[p]["momentum_buffer"], rtol=1e-6, atol=1e-7)
