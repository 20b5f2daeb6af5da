"""Gradient accumulation's arithmetic: the accumulation each phase gets, and a StepRunner step of A micro-batches."""

from __future__ import annotations

import pytest
import torch
from support import HOST_DECIDES
from torch import nn

from base.errors import ConfigError
from recipes import memory
from recipes.config import load_config
from recipes.rundir.payload import State
from recipes.schedule import Schedule, micro_batches
from recipes.steps import StepRunner


@pytest.mark.parametrize(
    ("per_gpu", "accumulate", "limit", "expected"),
    [
        (2048, 1, None, 1),
        (2048, 1, 256, 8),
        (2048, 4, 1024, 4),  # run.accumulate is a floor
        (1024, 1, 300, 4),  # 1024 / 4 = 256 <= 300 (3 does not divide 1024)
        (96, 1, 40, 3),
        (7, 2, 5, 7),  # 7 is prime: the next divisor
        (7, 2, None, None),  # without a limit run.accumulate is taken as it is, and must divide the batch
        (12, 1, 0, 1),  # 0 is not a limit (the schema refuses it anyway)
    ],
)
def test_micro_batches_is_run_accumulate_or_the_smallest_even_split_that_fits(per_gpu, accumulate, limit, expected):
    assert micro_batches(per_gpu, accumulate, limit) == expected


def _plan(cfg, num_images: int, world_size: int) -> Schedule:
    return Schedule(cfg.phases, cfg.optim, num_images=num_images, world_size=world_size, **memory.accumulation(cfg))


def _cfg(*overrides):
    phases = "phases=[{epochs: 1, image_size: 96, batch_size: 2048}, {epochs: 1, image_size: 288, batch_size: 1024}]"
    return load_config(None, [phases, *overrides])


def test_each_phase_accumulates_to_fit_the_per_gpu_limit():
    plan = _plan(_cfg("run.max_gpu_batch=128"), 1_281_167, 8)
    assert [(e.micro_batches, plan.micro_batch(e.epoch)) for e in plan.epochs] == [(2, 128), (1, 128)]
    same = _plan(_cfg(), 1_281_167, 8)
    assert [e.steps for e in plan.epochs] == [e.steps for e in same.epochs]  # the schedule is per optimizer step
    assert "micro-batches x images/GPU" in plan.table() and "2 x 128" in plan.table()
    assert "micro-batches" not in same.table()


def test_a_per_gpu_batch_that_cannot_be_split_is_refused_naming_the_phase():
    with pytest.raises(ConfigError, match=r"phases\.0: the per-GPU batch of 2048 .*run.accumulate=3"):
        _plan(_cfg("run.accumulate=3"), 1_281_167, 1)
    with pytest.raises(ConfigError, match="data.aug_splits"):
        _plan(_cfg("run.accumulate=2", "data.aug_splits=3"), 1_281_167, 8)


class _Comm:
    def __init__(self):
        self.held = 0

    def no_sync(self, model):
        from contextlib import contextmanager

        @contextmanager
        def held():
            self.held += 1
            yield

        return held()

    def on_step_end(self, step, log):
        pass


def _step(accumulate: int, scaled: bool = False) -> tuple[list[torch.Tensor], float, int]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    comm = _Comm()
    run = StepRunner(
        model=model,
        train_model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9),
        optim=HOST_DECIDES,
        scaler=torch.amp.GradScaler("cpu", init_scale=2.0**10, enabled=scaled),
        comm=comm,
        criterion=nn.CrossEntropyLoss(),
        device=torch.device("cpu"),
    )
    g = torch.Generator().manual_seed(1)
    st = State()
    for _ in range(2):
        loss = run(torch.randn(12, 5, generator=g), torch.randint(0, 3, (12,), generator=g), st, None, accumulate)
    assert st.step == 2
    return [p.detach().clone() for p in model.parameters()], float(loss["loss"]), comm.held


@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "grad-scaler"])
@pytest.mark.parametrize("accumulate", [2, 3, 4, 6])
def test_a_step_of_micro_batches_equals_one_step_of_the_whole_batch(accumulate, scaled):
    """With GradScaler too (run.amp=fp16's path): each micro-batch's loss scaled, unscaled once per step."""
    ref, ref_loss, _ = _step(1, scaled)
    got, loss, held = _step(accumulate, scaled)
    assert held == 2 * (accumulate - 1)  # every micro-batch but the last keeps its gradients local
    assert loss == pytest.approx(ref_loss, rel=1e-6)  # the reported loss is the whole batch's mean
    for a, b in zip(ref, got, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_a_batch_that_does_not_split_evenly_is_an_error():
    from base.errors import TrainingError

    with pytest.raises(TrainingError, match="12 images cannot be cut into 5"):
        _step(5)


def test_the_trainer_check_refuses_a_phase_too_big_for_the_cuda_device(monkeypatch):
    """recipes.memory.refuse_if_too_big, as Trainer._build calls it, with a 16 GiB device's properties."""
    from types import SimpleNamespace

    from recipes import memory

    props = SimpleNamespace(total_memory=16 * memory.GIB, name="Tesla V100-SXM2-16GB")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    cfg = _cfg("run.amp=fp16")
    with pytest.raises(ConfigError, match=r"^phases\.1 \(288 px, 1024 images per GPU .* Tesla V100-SXM2-16GB"):
        memory.refuse_if_too_big(cfg, _plan(cfg, 1_281_167, 1), torch.device("cuda", 0))
    fits = _cfg("run.amp=fp16", "run.max_gpu_batch=128")
    memory.refuse_if_too_big(fits, _plan(fits, 1_281_167, 1), torch.device("cuda", 0))  # nothing raised
    memory.refuse_if_too_big(cfg, _plan(cfg, 1_281_167, 1), torch.device("cpu"))  # CPU: not checked
