"""Time within an epoch: the training seconds that DAWNBench counts, the step log's window and the ETA.

Training time runs from before the input pipeline is built (DALI builds one per phase: that is training time)
to the epoch's last step, minus the checkpoints written in between (`paused`). The log window measures images/s
and the mean loss since the previous log line; the loss is summed on the device and read once per window.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch


class EpochClock:
    """Counts one epoch's training time into `state` (train_seconds, epoch_seconds, images, epoch_images)."""

    def __init__(self, state, device: torch.device, start_step: int):
        self.state, self.start_step = state, start_step
        self.t0 = self.mark = self.window_t = time.perf_counter()
        self.window_images = 0
        self.loss_sum = torch.zeros((), device=device)
        self.loss_n = 0

    def add(self, images: int, loss: torch.Tensor) -> None:
        """One step of `images` training images (all ranks) with loss `loss` (a device tensor: no sync)."""
        st = self.state
        st.images += images
        st.epoch_images += images
        self.window_images += images
        self.loss_sum += loss.detach()
        self.loss_n += 1

    def window(self, epoch_steps_done: int, steps_left: int) -> tuple[float, float, float]:
        """(mean loss, images/s, ETA in seconds) of the window since the last call, which starts a new window."""
        now = time.perf_counter()
        mean_loss = float(self.loss_sum) / max(self.loss_n, 1)
        img_s = self.window_images / max(now - self.window_t, 1e-9)
        eta = (now - self.t0) / max(epoch_steps_done - self.start_step, 1) * steps_left
        self.loss_sum.zero_()
        self.loss_n = self.window_images = 0
        return mean_loss, img_s, eta

    def restart_window(self) -> None:
        """Start the next window now (after the log line is written)."""
        self.window_t = time.perf_counter()

    @contextmanager
    def paused(self):
        """Time inside is not training time, nor part of the window (a checkpoint)."""
        now = time.perf_counter()
        self._bank(now)
        try:
            yield
        finally:
            self.mark = time.perf_counter()
            self.window_t += self.mark - now

    def stop(self) -> None:
        """The epoch's last step is done: count the time since the last mark."""
        self._bank(time.perf_counter())

    def _bank(self, now: float) -> None:
        self.state.train_seconds += now - self.mark
        self.state.epoch_seconds += now - self.mark
        self.mark = now
