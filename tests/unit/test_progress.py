"""recipes.epoch_clock.EpochClock: training time excludes checkpoints, the window's metrics by name (images/s, mean
loss, mean gradient norm over the finite steps, the last lr), the epoch's, the ETA."""

from __future__ import annotations

import torch

from recipes import epoch_clock as progress
from recipes.rundir.payload import State


class FakeTime:
    def __init__(self):
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


def _values(loss: float, norm: float) -> dict:
    return {"loss": torch.tensor(loss), "grad_norm": torch.tensor(norm)}


def test_checkpoint_time_is_not_training_time_and_the_window_is_exact(monkeypatch):
    clock_time = FakeTime()
    monkeypatch.setattr(progress.time, "perf_counter", clock_time.perf_counter)
    st = State(train_seconds=7.0)
    clock = progress.EpochClock(st, torch.device("cpu"), start_step=0)
    for loss, lr in ((1.0, 0.1), (3.0, 0.2)):
        clock_time.now += 1.0  # a step of 1 s, 32 images
        clock.add(32, _values(loss, 2 * loss), {"lr": lr, "momentum": 0.9})
    w = clock.window(epoch_steps_done=2, steps_left=10)
    # 64 images in 2 s; 1 s per step so far, 10 steps to go
    no_wait = {"data_wait_ms": 0.0, "data_wait_share": 0.0}  # no input was timed (clock.timed): no wait
    shown = {"loss": 2.0, "grad_norm": 4.0, "images_per_s": 32.0, "eta_seconds": 10.0, "lr": 0.2, "momentum": 0.9}
    assert w == {**shown, **no_wait}
    clock.restart_window()
    with clock.paused():
        clock_time.now += 50.0  # a checkpoint
    clock_time.now += 2.0
    clock.add(32, _values(5.0, 1.0))
    w = clock.window(epoch_steps_done=3, steps_left=9)
    assert (w["loss"], w["grad_norm"], w["images_per_s"]) == (5.0, 1.0, 16.0)  # the checkpoint's 50 s are not in it
    clock.stop()
    assert st.epoch_seconds == 4.0 and st.train_seconds == 7.0 + 4.0  # the 50 s are not training time
    assert st.images == st.epoch_images == 96
    assert clock.epoch() == {"images_per_s": 24.0, "loss": 3.0, "grad_norm": 3.0, **no_wait}  # (2+6+1) / 3 steps


def test_a_skipped_step_is_left_out_of_the_gradient_norm_not_out_of_the_loss(monkeypatch):
    """A non-finite step (skipped by the optimizer) does not poison the window's gradient norm; the loss keeps it
    (a diverged loss shows); a window with no finite norm has none."""
    monkeypatch.setattr(progress.time, "perf_counter", FakeTime().perf_counter)
    clock = progress.EpochClock(State(), torch.device("cpu"), start_step=0)
    clock.add(8, _values(1.0, 2.0))
    clock.add(8, _values(3.0, float("inf")))  # an fp16 overflow: the scaler skipped this step
    clock.add(8, _values(2.0, 4.0))
    w = clock.window(epoch_steps_done=3, steps_left=0)
    assert (w["loss"], w["grad_norm"]) == (2.0, 3.0)
    clock.add(8, _values(float("nan"), float("nan")))
    w = clock.window(epoch_steps_done=4, steps_left=0)
    assert w["grad_norm"] is None and w["loss"] != w["loss"]  # NaN: the loss diverged
    assert clock.epoch()["grad_norm"] == 3.0


def test_a_resumed_epoch_estimates_from_its_own_steps(monkeypatch):
    clock_time = FakeTime()
    monkeypatch.setattr(progress.time, "perf_counter", clock_time.perf_counter)
    clock = progress.EpochClock(State(), torch.device("cpu"), start_step=40)  # resumed 40 steps into the epoch
    clock_time.now += 5.0
    clock.add(8, _values(0.5, 1.0))
    assert clock.window(epoch_steps_done=45, steps_left=100)["eta_seconds"] == 100.0  # 5 steps in 5 s, not 45
