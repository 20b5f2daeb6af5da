"""recipes/metrics.py: the step line, the TensorBoard scalars and the history row written from the record."""

from __future__ import annotations

import pytest

from recipes import metrics


def test_the_step_line_shows_each_console_metric_and_a_dash_for_none():
    window = {"images_per_s": 1234.56, "loss": 2.5, "grad_norm": None, "lr": 0.125, "eta_seconds": 3725.0}
    wait = {"data_wait_ms": 12.34, "data_wait_share": 0.25}
    assert metrics.step_line(0, 9, 3, 13, window | {"momentum": 0.9} | wait) == (
        "epoch 1/9  step 3/13    1234.6 img/s  loss 2.5000  grad_norm -  lr 0.125  eta 1:02:05  "
        "data wait 12.3 ms  (25%)"
    )
    assert "loss nan" in metrics.step_line(0, 1, 1, 1, window | {"loss": float("nan"), "grad_norm": 0.5})


def test_scalars_and_rows_carry_the_record_names():
    window = {"images_per_s": 10.0, "loss": 1.0, "grad_norm": None, "lr": 0.1, "eta_seconds": 5.0, "momentum": 0.9}
    assert metrics.window_scalars(window) == {
        "train/images_per_s": 10.0,
        "train/loss": 1.0,
        "train/lr": 0.1,
        "train/eta_seconds": 5.0,
        "train/momentum": 0.9,
    }  # no grad_norm point for a window without a finite step
    val = {"top1": 50.0, "top5": 90.0, "loss": 1.5, "count": 20}
    row = metrics.epoch_row(
        epoch=1, step=4, train_seconds=2.0, train={"images_per_s": 8.0, "loss": 1.2, "grad_norm": 3.0}, val=val
    )
    assert row == {
        "epoch": 1,
        "step": 4,
        "train_seconds": 2.0,
        "images_per_s": 8.0,
        "loss": 1.2,
        "grad_norm": 3.0,
        "top1": 50.0,
        "top5": 90.0,
        "val_loss": 1.5,
        "val_count": 20,
    }
    assert metrics.epoch_scalars(row | {"wall_seconds": 3.0}) == {
        "epoch/images_per_s": 8.0,
        "epoch/loss": 1.2,
        "epoch/grad_norm": 3.0,
        "val/top1": 50.0,
        "val/top5": 90.0,
        "val/loss": 1.5,
    }
    assert metrics.ema_values({"top1": 1.0, "top5": 2.0, "loss": 3.0, "count": 4}) == {
        "ema_top1": 1.0,
        "ema_top5": 2.0,
        "ema_loss": 3.0,
    }


def test_the_data_wait_is_the_hosts_wait_for_each_batch():
    """EpochClock.timed times each next() of the batches: a pipeline that sleeps 50 ms before each batch waits at
    least that per step, and its share of the window and of the epoch is a fraction of their training time."""
    import time
    from types import SimpleNamespace

    import torch

    from recipes.epoch_clock import EpochClock

    def slow_batches(n):
        for i in range(n):
            time.sleep(0.05)
            yield i

    st = SimpleNamespace(images=0, epoch_images=0, train_seconds=0.0, epoch_seconds=0.0)
    clock = EpochClock(st, torch.device("cpu"), 0)
    values = {m.name: torch.tensor(1.0) for m in metrics.DEVICE_SUMS}
    for _ in clock.timed(slow_batches(3)):
        clock.add(8, values)
    window = clock.window(3, 0)
    clock.stop()
    epoch = clock.epoch()
    for out in (window, epoch):
        assert out["data_wait_ms"] >= 50.0  # time.sleep waits at least what it is given
        assert 0.0 < out["data_wait_share"] <= 1.0
        assert out["data_wait_share"] * 1000 * st.epoch_seconds / 3 == pytest.approx(out["data_wait_ms"], rel=0.2)
    assert clock.window(3, 0)["data_wait_ms"] is None  # a window without a step has none
