"""Schedules (recipes/schedule.py) at their key points: start, end of warm-up, phase boundaries, last iteration."""

from __future__ import annotations

import pytest
from support import ROOT

from base import registry
from base.errors import ConfigError
from recipes.config import load_config
from recipes.metrics import window_scalars
from recipes.schedule import Schedule, steps_per_epoch

IMAGENET = 1_281_167


def record_plan(*overrides) -> Schedule:
    cfg = load_config(ROOT / "configs" / "dawnbench_158s.yaml", list(overrides))
    return Schedule(cfg.phases, cfg.optim, num_images=IMAGENET, world_size=128)


def test_record_layout_is_1159_iterations_in_28_epochs():
    plan = record_plan()
    assert steps_per_epoch(IMAGENET, 32768, 128) == 40 and steps_per_epoch(IMAGENET, 16384, 128) == 79
    assert plan.total_steps == 1159 == 40 * 27 + 79
    assert len(plan.epochs) == 28
    firsts = [plan.epochs[e].first_step for e in (0, 13, 24, 27)]
    assert firsts == [0, 520, 960, 1080]  # phase starts: 96 px, 128 px, 224 px, 288 px
    assert [plan.image_size(s) for s in (0, 519, 520, 959, 960, 1079, 1080, 1158)] == [
        96,
        96,
        128,
        128,
        224,
        224,
        288,
        288,
    ]
    assert plan.batch_size(1079) == 32768 and plan.batch_size(1080) == 16384


def test_record_lr_warmup_then_linear_decay():
    plan = record_plan()
    warm = 14 * 40  # 14 warm-up epochs of 40 iterations
    assert plan.warmup_steps() == warm
    assert plan.lr(0) == 0.0
    assert plan.lr(warm / 2) == pytest.approx(12.5)
    assert plan.lr(warm) == pytest.approx(25.0)
    assert plan.lr(520) == pytest.approx(25.0 * 520 / warm)  # start of the 128 px phase, still warming up
    decay = lambda s: 25.0 + (0.2 - 25.0) * (s - warm) / (1158 - warm)
    assert plan.lr(960) == pytest.approx(decay(960))
    assert plan.lr(1080) == pytest.approx(decay(1080))  # the batch halves here; the LR curve does not jump
    assert plan.lr(1158) == pytest.approx(0.2)
    assert plan.lr(5000) == pytest.approx(0.2)  # past the end: stays at the final value


def test_record_cyclic_momentum():
    plan = record_plan()
    assert plan.momentum(0) == pytest.approx(0.98)
    assert plan.momentum(280) == pytest.approx(0.94)
    assert plan.momentum(560) == pytest.approx(0.90)
    assert plan.momentum(1158) == pytest.approx(0.98)


def test_point_of_epoch_and_iteration():
    plan = record_plan()
    p = plan.at(27, 0)
    assert (p.step, p.phase_index, p.image_size, p.batch_size) == (1080, 3, 288, 16384)
    assert p.lr == plan.lr(1080) and p.momentum == plan.momentum(1080)
    assert plan.at(27, 78).step == 1158 and plan.at(27, 78).lr == pytest.approx(0.2)
    assert plan.at(14, 0).step == 560 and plan.at(14, 0).lr == pytest.approx(25.0)
    with pytest.raises(ValueError, match="iteration 79 is outside epoch 27"):
        plan.at(27, 79)


def test_eight_gpu_entry():
    cfg = load_config(ROOT / "configs" / "dawnbench_8gpu.yaml")
    plan = Schedule(cfg.phases, cfg.optim, num_images=IMAGENET, world_size=8)
    assert len(plan.epochs) == 21 and plan.total_steps == 626 * 20 + 1252
    assert plan.lr(5 * 626) == pytest.approx(1.2)
    assert plan.lr(plan.total_steps - 1) == pytest.approx(1e-4)
    assert plan.momentum(0) == pytest.approx(0.96)
    assert plan.momentum(plan.total_steps - 1) == pytest.approx(0.90)
    assert plan.momentum((plan.total_steps - 1) / 2) == pytest.approx(0.93)


def _small(*overrides) -> Schedule:
    cfg = load_config(
        None,
        [
            "phases=[{epochs: 2, image_size: 32, batch_size: 8}, {epochs: 1, image_size: 64, batch_size: 4}]",
            "optim.lr=1.0",
            "optim.final_lr=0.0",
            *overrides,
        ],
    )
    return Schedule(cfg.phases, cfg.optim, num_images=40, world_size=1)  # 5 + 5 + 10 = 20 steps


def test_linear_scaling_multiplies_by_the_phase_batch():
    plain, scaled = _small(), _small("optim.lr_scaling=linear")
    assert plain.total_steps == 20
    for s in (0, 7, 9, 10, 15, 19):
        assert scaled.lr(s) == pytest.approx(plain.lr(s) * plain.batch_size(s) / 256)
    assert scaled.lr(0) == pytest.approx(8 / 256)


def test_fractional_warmup_and_warmup_over_the_whole_run():
    half = _small("optim.warmup_epochs=0.5", "optim.warmup_start_lr=0.1")
    assert half.warmup_steps() == 2.5 and half.lr(0) == pytest.approx(0.1) and half.lr(2.5) == pytest.approx(1.0)
    whole = _small("optim.warmup_epochs=3", "optim.warmup_start_lr=0.0")
    lrs = [whole.lr(s) for s in range(20)]
    assert lrs == sorted(lrs) and lrs[-1] == pytest.approx(1.0)  # no decay left: ends at the peak, no NaN
    none = _small("optim.momentum_schedule=cyclic", "optim.momentum=0.95", "optim.momentum_end=0.85")
    assert none.lr(0) == 1.0 and none.momentum(0) == pytest.approx(0.85) and none.momentum(19) == pytest.approx(0.95)


def test_batch_not_divisible_by_world_is_a_config_error():
    with pytest.raises(ConfigError, match="phases.1.batch_size: 4 is not divisible by the world size 3"):
        cfg = load_config(
            None, ["phases=[{epochs: 1, image_size: 32, batch_size: 6}, {epochs: 1, image_size: 32, batch_size: 4}]"]
        )
        Schedule(cfg.phases, cfg.optim, num_images=40, world_size=3)


@pytest.mark.parametrize("world, size, ok", [(4, 32, False), (4, 64, True), (2, 32, True)])
def test_one_image_per_process_at_32_px_is_refused_before_batchnorm_meets_it(world, size, ok):
    cfg = load_config(None, [f"phases=[{{epochs: 1, image_size: {size}, batch_size: 4}}]"])
    make = lambda: Schedule(cfg.phases, cfg.optim, num_images=64, world_size=world)  # noqa: E731
    if ok:
        make()
        return
    with pytest.raises(ConfigError, match=r"^phases.0: a micro-batch of 1 image per process at 32 px .* at least 8"):
        make()


@pytest.mark.parametrize("name", list(registry.OPTIMIZERS))
def test_momentum_is_scheduled_and_logged_only_for_an_optimizer_that_reads_it(name):
    """Lamb and AdamW have Adam's betas: no momentum is computed, set, shown in --plan's table or logged (the log
    window's values and its TensorBoard scalars) for an optimizer whose record's config has none."""
    reads = "momentum" in registry.OPTIMIZERS[name].reads
    plan = record_plan(f"optim.name={name}")
    assert (plan.momentum(0) is not None) == reads == ("momentum" in plan.logged(0)) == plan.reads_momentum
    assert plan.logged(0)["lr"] == plan.lr(0)
    first_row = plan.table().splitlines()[1].split()
    assert first_row[-1] == ("0.98" if reads else "-")  # the record's cyclic momentum starts at 0.98
    window = {"lr": 0.1, **plan.logged(0)}
    assert ("train/momentum" in window_scalars(window)) == reads
