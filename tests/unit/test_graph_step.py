"""`run.cuda_graph`'s step (recipes/steps.py GraphStep) run eagerly on CPU: the code a CUDA graph captures (static
input buffers, lr and momentum as device tensors, GradScaler unscaling in place, the multistream engine's hooks)
must train exactly like the eager StepRunner, through a skipped non-finite step and a phase change."""

from __future__ import annotations

import copy
from contextlib import nullcontext
from functools import partial

import pytest
import torch
import torch.distributed as td
from support import trap_host_reads
from torch import nn

from recipes.comm.engine import _Engine
from recipes.comm.plan import Settings, build_plan, grad_specs
from recipes.config import load_config
from recipes.errors import TrainingError
from recipes.optim import create_optimizer, set_lr_momentum
from recipes.rundir.payload import State
from recipes.steps import GraphStep, StepRunner, graph_decision


class _Done:
    def wait(self):
        return True


class _Comm:
    def on_step_end(self, step, log):
        pass


class _Log:
    def __init__(self):
        self.warnings, self.lines = [], []

    def warn(self, msg):
        self.warnings.append(msg)

    def info(self, msg):
        self.lines.append(msg)


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    ).to(memory_format=torch.channels_last)


def _runner(cls, model, *, amp: str, engine: bool):
    cfg = load_config("configs/dawnbench_158s.yaml", ["run.device=cpu"])  # hybrid LARS, tf momentum
    opt = create_optimizer(cfg.optim, model)
    if engine:
        specs, params = grad_specs(model)
        eng = _Engine(build_plan(specs, Settings(0.001, 2, 2), "none"), params, [object(), object()], 1, False, 30.0)
        for i, p in enumerate(params):
            p.register_post_accumulate_grad_hook(partial(lambda i, _p: eng.grad_ready(i), i))
    return cls(
        model=model,
        train_model=model,
        optimizer=opt,
        scaler=torch.amp.GradScaler("cpu", init_scale=2.0**8, enabled=amp == "fp16"),
        comm=_Comm(),
        criterion=nn.CrossEntropyLoss(label_smoothing=0.1),
        device=torch.device("cpu"),
        amp=amp,
        on_nonfinite="skip",
    )


def _batches():
    """Six steps at 8 px, the fourth with a NaN image (a skipped step), then three at 12 px (a phase change)."""
    g = torch.Generator().manual_seed(1)
    out = []
    for step in range(9):
        size = 8 if step < 6 else 12
        x = torch.randn(4, 3, size, size, generator=g).contiguous(memory_format=torch.channels_last)
        if step == 3:
            x[1, 0, 0, 0] = float("nan")
        out.append((x, torch.randint(0, 5, (4,), generator=g)))
    return out


@pytest.mark.parametrize("amp,engine", [("fp16", True), ("none", True), ("none", False)])
def test_graph_step_trains_like_the_eager_step(monkeypatch, amp, engine):
    monkeypatch.setattr(td, "all_reduce", lambda t, group=None, async_op=False: _Done())
    ref_model = _net()
    new_model = copy.deepcopy(ref_model)
    ref = _runner(StepRunner, ref_model, amp=amp, engine=engine)
    new = _runner(partial(GraphStep, capture=False), new_model, amp=amp, engine=engine)
    st_ref, st_new, log_ref, log_new = State(), State(), _Log(), _Log()
    losses = []
    for i, (x, y) in enumerate(_batches()):
        lr, mom = 0.05 + 0.1 * i, 0.98 - 0.01 * i  # a moving schedule, as the trainer sets it each step
        for runner in (ref, new):
            set_lr_momentum(runner.optimizer, lr, mom)
        losses.append((ref(x, y, st_ref), new(x.clone(), y.clone(), st_new)))
        if i in (4, 8):
            ref.settle(st_ref, log_ref)
            new.settle(st_new, log_new)
    for a, b in losses:
        torch.testing.assert_close(b, a, equal_nan=True, rtol=1e-6, atol=1e-7)
    for (name, a), b in zip(ref_model.state_dict().items(), new_model.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, equal_nan=True, msg=name)  # NaN image: BN stats
    with torch.no_grad():
        moved = max(
            float((a - b).abs().max()) for a, b in zip(_net().parameters(), new_model.parameters(), strict=True)
        )
    assert moved > 1e-3  # the steps trained
    assert st_new.step == st_ref.step == 9 and st_new.skipped_steps == st_ref.skipped_steps == 1
    assert len(log_new.warnings) == len(log_ref.warnings) == 1 and "step 3" in log_new.warnings[0]
    # the groups keep plain floats (checkpoints and logs): the device tensors live in the step only
    assert all(isinstance(g["lr"], float) and isinstance(g["momentum"], float) for g in new.optimizer.param_groups)


def test_graph_step_reads_nothing_on_the_host(monkeypatch):
    monkeypatch.setattr(td, "all_reduce", lambda t, group=None, async_op=False: _Done())
    runner = _runner(partial(GraphStep, capture=False), _net(), amp="fp16", engine=True)
    st = State()
    (x, y), *_ = _batches()
    runner(x, y, st)
    trap_host_reads(monkeypatch)
    for _ in range(2):
        runner(x, y, st)
    monkeypatch.undo()
    assert len(runner.pending) == 3


def test_graph_decision_says_why_it_stays_eager():
    def decide(*overrides, device="cuda", world=1, optimizer="hybrid"):
        cfg = load_config(None, [f"optim.name={optimizer}", *overrides])
        opt = create_optimizer(cfg.optim, nn.Linear(2, 2))
        return graph_decision(
            cfg.run,
            backend=cfg.comm.backend,
            optim_name=cfg.optim.name,
            device=torch.device(device),
            world_size=world,
            optimizer=opt,
        )

    assert decide() == (True, "")
    assert decide("comm.backend=multistream", world=8) == (True, "")
    assert decide("run.cuda_graph=false") == (False, "run.cuda_graph=false")
    assert decide(device="cpu") == (False, "no CUDA device (cpu)")
    assert decide("run.accumulate=2")[1] == "gradient accumulation (run.accumulate/max_gpu_batch)"
    assert "optim.name=lamb decides on the host" in decide(optimizer="lamb")[1]
    assert "comm.backend=horovod" in decide("comm.backend=horovod", world=2)[1]
    assert "comm.backend=ddp across ranks" in decide(world=2)[1]
    with pytest.raises(TrainingError, match="decides on the host"):
        GraphStep(
            capture=False,
            model=nn.Linear(2, 2),
            train_model=nn.Linear(2, 2),
            optimizer=torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1),
            scaler=torch.amp.GradScaler("cpu", enabled=False),
            comm=_Comm(),
            criterion=nn.CrossEntropyLoss(),
            device=torch.device("cpu"),
        )


class _Stream:
    def wait_stream(self, other):
        pass


def test_capture_replay_and_recapture_with_a_stand_in_graph(monkeypatch):
    """The capture path's control flow on CPU, with torch.cuda's graph and streams replaced: a capture runs nothing
    (the stand-in restores every tensor the step wrote), a replay runs the captured body on the static buffers.
    Warm-up steps, then one capture per shape, replays in between, the same weights as the eager step."""
    monkeypatch.setattr(td, "all_reduce", lambda t, group=None, async_op=False: _Done())
    ref_model, new_model = _net(), _net()
    ref = _runner(StepRunner, ref_model, amp="fp16", engine=True)
    new = _runner(partial(GraphStep, capture=True, warmup=2), new_model, amp="fp16", engine=True)
    captured, replays = [], []

    def written():
        opt_state = [t for s in new.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        return [
            *new_model.parameters(),
            *new_model.buffers(),
            *opt_state,
            new.scaler._scale,
            new.scaler._growth_tracker,
        ]

    class Graph:
        def replay(self):
            replays.append(tuple(self.shape))
            self.body()

    class capture_graph:  # torch.cuda.graph(graph, pool=..., capture_error_mode=...)
        def __init__(self, graph, pool=None, capture_error_mode=None):
            self.g = graph

        def __enter__(self):
            self.before = [t.detach().clone() for t in written()]

        def __exit__(self, *exc):
            with torch.no_grad():
                for t, b in zip(written(), self.before, strict=True):
                    t.copy_(b)
            self.g.shape, self.g.body = new.static[0].shape, partial(new._body, *new.static)
            captured.append(tuple(new.static[0].shape))

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    monkeypatch.setattr(torch.cuda, "graph", capture_graph)
    st_ref, st_new, log_ref, log_new = State(), State(), _Log(), _Log()
    for i, (x, y) in enumerate(_batches()):
        for runner in (ref, new):
            set_lr_momentum(runner.optimizer, 0.05 + 0.1 * i, 0.98 - 0.01 * i)
        ref(x, y, st_ref, log_ref)
        new(x.clone(), y.clone(), st_new, log_new)
    ref.settle(st_ref, log_ref)
    new.settle(st_new, log_new)
    # 8 px: 2 eager, captured at step 2 (and replayed: that is the step), 3 more replays incl. the NaN step 3;
    # 12 px: a new shape, 2 eager, captured and replayed at step 8
    assert captured == [(4, 3, 8, 8), (4, 3, 12, 12)]
    assert replays == [(4, 3, 8, 8)] * 4 + [(4, 3, 12, 12)]
    assert [m for m in log_new.lines if "captured" in m] == [
        "run.cuda_graph: step captured for input [4, 3, 8, 8] (torch.float32)",
        "run.cuda_graph: step captured for input [4, 3, 12, 12] (torch.float32)",
    ]
    for (name, a), b in zip(ref_model.state_dict().items(), new_model.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, equal_nan=True, msg=name)
    assert st_new.skipped_steps == st_ref.skipped_steps == 1
