"""The step runner's deferred finite check: flags stay on the device until `settle`, which counts, skips or halts."""

from __future__ import annotations

import pytest
import torch
from support import optim_record
from torch import nn

from base import registry
from base.errors import TrainingError
from recipes.rundir.payload import State
from recipes.steps import StepRunner


class _Comm:
    def __init__(self):
        self.ends = []

    def on_step_end(self, step, log):
        self.ends.append(step)


class _Log:
    def __init__(self):
        self.warnings = []

    def warn(self, msg):
        self.warnings.append(msg)


def _runner(on_nonfinite: str, optimizer_cls=torch.optim.SGD) -> StepRunner:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = optimizer_cls(model.parameters(), lr=0.1)
    return StepRunner(
        model=model,
        train_model=model,
        optimizer=optimizer,
        optim=optim_record(optimizer),
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        comm=_Comm(),
        criterion=nn.CrossEntropyLoss(),
        device=torch.device("cpu"),
        on_nonfinite=on_nonfinite,
        timeout_s=7.0,
        backend="ddp",
    )


def _batches():
    good = (torch.ones(4, 3), torch.tensor([0, 1, 0, 1]))
    bad = (torch.full((4, 3), float("nan")), torch.tensor([0, 1, 0, 1]))
    return good, bad


@pytest.mark.parametrize("optimizer_cls", [torch.optim.SGD, torch.optim.AdamW])
def test_a_non_finite_step_is_skipped_and_counted_when_settled(optimizer_cls):
    run, st, log = _runner("skip", optimizer_cls), State(), _Log()
    good, bad = _batches()
    run(*good, st, log)
    before = [p.detach().clone() for p in run.model.parameters()]
    run(*bad, st, log)
    after = [p.detach().clone() for p in run.model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))  # the bad step changed nothing
    assert (st.step, st.epoch_step, st.skipped_steps, len(run.pending)) == (2, 2, 0, 2)  # not read yet
    assert run.comm.ends == [1, 2]
    run.settle(st, log)
    assert run.pending == [] and st.skipped_steps == 1
    assert log.warnings == [
        "non-finite loss/gradients at step 1 (epoch 1, loss nan): step skipped (1 so far; run.on_nonfinite=skip)"
    ]
    run.settle(st, log)  # nothing pending: nothing counted twice
    assert st.skipped_steps == 1


def test_halt_raises_when_the_pending_flags_are_read_naming_the_step():
    run, st, log = _runner("halt"), State(step=10, epoch=2), _Log()
    good, bad = _batches()
    run(*good, st, log)
    run(*bad, st, log)  # no host read inside the step: no error yet
    with pytest.raises(TrainingError, match=r"non-finite loss/gradients at step 11 \(epoch 3, loss nan\): halting"):
        run.settle(st, log)


def test_finite_steps_settle_without_counting():
    run, st, log = _runner("halt"), State(), _Log()
    good, _ = _batches()
    for _ in range(3):
        run(*good, st, log)
    run.settle(st, log)
    assert (st.step, st.skipped_steps, log.warnings, run.pending) == (3, 0, [], [])


def test_the_builder_hands_the_step_the_configs_settings():
    """build_step: one place maps the config to the step (the trainer, the GPU check and the tests use it); an
    override wins, and graph=True is a GraphStep."""
    from recipes.config import load_config
    from recipes.step_builder import build_step
    from recipes.steps import GraphStep

    cfg = load_config(
        None,
        [
            "optim.name=lars",
            "run.on_nonfinite=skip",
            "dist.timeout_s=12",
            "optim.clip_grad_norm=2",
            "comm.backend=multistream",
        ],
    )
    model = nn.Linear(3, 2)
    parts = dict(model=model, train_model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), comm=_Comm())
    parts |= dict(scaler=torch.amp.GradScaler("cpu", enabled=False), device=torch.device("cpu"))
    runner = build_step(cfg, **parts)
    assert type(runner) is StepRunner and runner.optim is registry.OPTIMIZERS["lars"]
    settings = (runner.on_nonfinite, runner.timeout_s, runner.clip_grad_norm, runner.backend)
    assert settings == ("skip", 12.0, 2.0, "multistream")
    assert runner.criterion.label_smoothing == cfg.optim.label_smoothing
    graph = build_step(cfg, **parts, graph=True, warmup=5, timeout_s=3.0)
    assert type(graph) is GraphStep and not graph.capture and graph.warmup == 5 and graph.timeout_s == 3.0
