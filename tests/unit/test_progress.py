"""recipes.epoch_clock.EpochClock: training time excludes checkpoints, the window's images/s and mean loss, the ETA."""

from __future__ import annotations

import torch

from recipes import epoch_clock as progress
from recipes.run.payload import State


class FakeTime:
    def __init__(self):
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


def test_checkpoint_time_is_not_training_time_and_the_window_is_exact(monkeypatch):
    clock_time = FakeTime()
    monkeypatch.setattr(progress.time, "perf_counter", clock_time.perf_counter)
    st = State(train_seconds=7.0)
    clock = progress.EpochClock(st, torch.device("cpu"), start_step=0)
    for loss in (1.0, 3.0):
        clock_time.now += 1.0  # a step of 1 s, 32 images
        clock.add(32, torch.tensor(loss))
    loss, img_s, eta = clock.window(epoch_steps_done=2, steps_left=10)
    assert (loss, img_s, eta) == (2.0, 32.0, 10.0)  # 64 images in 2 s; 1 s per step so far, 10 steps to go
    clock.restart_window()
    with clock.paused():
        clock_time.now += 50.0  # a checkpoint
    clock_time.now += 2.0
    clock.add(32, torch.tensor(5.0))
    loss, img_s, _ = clock.window(epoch_steps_done=3, steps_left=9)
    assert (loss, img_s) == (5.0, 16.0)  # the checkpoint's 50 s are not in the window
    clock.stop()
    assert st.epoch_seconds == 4.0 and st.train_seconds == 7.0 + 4.0  # the 50 s are not training time
    assert st.images == st.epoch_images == 96


def test_a_resumed_epoch_estimates_from_its_own_steps(monkeypatch):
    clock_time = FakeTime()
    monkeypatch.setattr(progress.time, "perf_counter", clock_time.perf_counter)
    clock = progress.EpochClock(State(), torch.device("cpu"), start_step=40)  # resumed 40 steps into the epoch
    clock_time.now += 5.0
    clock.add(8, torch.tensor(0.5))
    _, _, eta = clock.window(epoch_steps_done=45, steps_left=100)
    assert eta == 100.0  # 5 steps in 5 s, not 45
