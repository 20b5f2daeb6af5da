"""The step's gradient norm (recipes/metrics.py's `grad_norm`) and `optim.clip_grad_norm`: the norm of the
gradients the optimizer is handed (unscaled, averaged over micro-batches), clipped on the device, for every
optimizer, in the eager and the graph step, with no host read."""

from __future__ import annotations

import copy
from functools import partial

import pytest
import torch
from support import TINY_CONFIG, optim_record, trap_host_reads
from torch import nn

from base import registry
from recipes.config import load_config
from recipes.config.inert import inert_keys
from recipes.optim import create_optimizer
from recipes.rundir.payload import State
from recipes.steps import GraphStep, StepRunner


class _Comm:
    def on_step_end(self, step, log):
        pass

    def no_sync(self, model):
        from contextlib import nullcontext

        return nullcontext()


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(12, 5, generator=g), torch.randint(0, 3, (12,), generator=g)


def _runner(model, optimizer, *, scaled=False, clip=0.0, kind=StepRunner) -> StepRunner:
    return kind(
        model=model,
        train_model=model,
        optimizer=optimizer,
        optim=optim_record(optimizer),
        scaler=torch.amp.GradScaler("cpu", init_scale=2.0**10, enabled=scaled),
        comm=_Comm(),
        criterion=nn.CrossEntropyLoss(),
        device=torch.device("cpu"),
        clip_grad_norm=clip,
    )


def _reference_norm(model: nn.Module, x, y) -> float:
    """The total L2 norm of the batch's mean-loss gradients, computed tensor by tensor."""
    ref = copy.deepcopy(model)
    nn.CrossEntropyLoss()(ref(x), y).backward()
    return float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in ref.parameters())))


@pytest.mark.parametrize("accumulate", [1, 3])
@pytest.mark.parametrize("scaled", [False, True], ids=["fp32", "grad-scaler"])
def test_the_logged_norm_is_the_norm_of_the_unscaled_averaged_gradients(scaled, accumulate):
    """fp32, and with GradScaler (run.amp=fp16's path, scale 1024): the norm of the gradients the optimizer gets,
    not of the scaled ones; with 3 micro-batches, of their mean (the whole batch's)."""
    model = _net()
    x, y = _data()
    want = _reference_norm(model, x, y)
    run = _runner(model, torch.optim.SGD(model.parameters(), lr=0.1), scaled=scaled)
    got = run(x, y, State(), None, accumulate)
    assert set(got) == {"loss", "grad_norm"}
    assert float(got["grad_norm"]) == pytest.approx(want, rel=1e-5)
    assert 0.1 < want < 10  # a real gradient, far from the scale's 1024x


def test_the_graph_step_hands_the_same_norm():
    """GraphStep's body (run eagerly on CPU) puts the norm in its static output: the same value as StepRunner's."""
    a, b = _net(), _net()
    x, y = _data()
    eager = _runner(a, torch.optim.SGD(a.parameters(), lr=0.1), scaled=True)
    graph = _runner(
        b, torch.optim.SGD(b.parameters(), lr=0.1, fused=True), scaled=True, kind=partial(GraphStep, capture=False)
    )
    st_a, st_b = State(), State()
    for _ in range(2):
        va, vb = eager(x, y, st_a), graph(x, y, st_b)
        assert float(vb["grad_norm"]) == pytest.approx(float(va["grad_norm"]), rel=1e-5)
        assert float(vb["loss"]) == pytest.approx(float(va["loss"]), rel=1e-5)


@pytest.mark.parametrize("kind", [StepRunner, partial(GraphStep, capture=False)], ids=["eager", "graph"])
def test_clip_makes_the_applied_gradient_norm_the_clip(kind):
    """Plain SGD (no momentum, no decay, lr 1): the parameter change is the applied gradient. With clip c below the
    gradient's norm its norm is c; with 0 it is the gradient itself. The logged norm is the one before clipping."""
    x, y = _data()
    norm = _reference_norm(_net(), x, y)
    for clip, applied in ((0.25 * norm, 0.25 * norm), (0.0, norm), (4 * norm, norm)):
        model = _net()
        before = [p.detach().clone() for p in model.parameters()]
        run = _runner(model, torch.optim.SGD(model.parameters(), lr=1.0, fused=True), clip=clip, kind=kind)
        got = run(x, y, State())
        change = torch.sqrt(sum(((b - p.detach()) ** 2).sum() for b, p in zip(before, model.parameters(), strict=True)))
        assert float(change) == pytest.approx(applied, rel=1e-4), clip
        assert float(got["grad_norm"]) == pytest.approx(norm, rel=1e-5)


@pytest.mark.parametrize("name", sorted(registry.OPTIMIZERS))
def test_every_optimizer_reads_the_clip(name):
    """For each registered optimizer (from the trainer's factory and config), a clip far below the norm changes the
    step (Lamb's and LARS' updates hardly depend on the gradient's scale: 1e-9 takes it below Adam's eps, and the
    biases' group is plain SGD in LARS), and the key is not marked inert."""
    x, y = _data()

    def step(clip: float) -> list[torch.Tensor]:
        cfg = load_config(TINY_CONFIG, [f"optim.name={name}", f"optim.clip_grad_norm={clip}", "optim.lr=0.5"])
        assert "optim.clip_grad_norm" not in inert_keys(cfg)
        model = _net()
        run = _runner(model, create_optimizer(cfg.optim, model), clip=cfg.optim.clip_grad_norm)
        run(x, y, State())
        return [p.detach().clone() for p in model.parameters()]

    plain, clipped = step(0.0), step(1e-9)
    assert any(not torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(plain, clipped, strict=True)), name


def test_a_skipped_step_reports_a_non_finite_norm_and_changes_nothing():
    """An overflowing step (inf gradients) with the clip on: the norm is inf (EpochClock leaves it out of the
    window's mean), the step is skipped, the weights are untouched."""
    model = _net()
    x, y = _data()
    run = _runner(model, torch.optim.SGD(model.parameters(), lr=0.1, fused=True), scaled=True, clip=1.0)
    before = [p.detach().clone() for p in model.parameters()]
    got = run(x * float("inf"), y, State())
    assert not torch.isfinite(got["grad_norm"])
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize("scaled", [False, True], ids=["fp32", "grad-scaler"])
def test_norm_and_clip_read_nothing_on_the_host(monkeypatch, scaled):
    model = _net()
    x, y = _data()
    run = _runner(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True), scaled=scaled, clip=0.5)
    st = State()
    run(x, y, st)
    trap_host_reads(monkeypatch)
    for _ in range(2):
        run(x, y, st)
    monkeypatch.undo()
    assert st.step == 3


def test_norm_and_clip_ops_do_not_grow_with_the_parameters():
    """One foreach norm and one foreach multiply over every gradient, never a per-tensor loop: the same ops for a
    net of 4 tensors as for one of 40 (each op is a kernel launch on a GPU)."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    def ops(layers: int) -> Counter:
        model = nn.Sequential(*[nn.Linear(3, 3) for _ in range(layers)])
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        run = _runner(model, torch.optim.SGD(model.parameters(), lr=0.1), clip=0.5)
        with Count() as c:
            run.grad_norm()
        return c.ops

    small, large = ops(2), ops(20)
    assert small == large, (small, large)
    assert small["_foreach_norm"] == small["_foreach_mul_"] == 1 and sum(small.values()) <= 8, small
