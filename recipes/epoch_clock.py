"""Time within an epoch: the training seconds that DAWNBench counts, the log window's metrics and the ETA.

Training time runs from before the input pipeline is built (DALI builds one per phase: that is training time)
to the epoch's last step, minus the checkpoints written in between (`paused`). A log window's metrics are those of
recipes/metrics.py's WINDOW: the step's named device values (loss, gradient norm) are summed on the device and read
once per window (one host sync), images/s is measured on the host, and so is the data wait: each step's `next()` of
the input pipeline's batches (`timed`), per step and as a share of the training time.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from recipes import metrics


class EpochClock:
    """Counts one epoch's training time into `state` (train_seconds, epoch_seconds, images, epoch_images)."""

    def __init__(self, state, device: torch.device, start_step: int):
        self.state, self.start_step = state, start_step
        self.t0 = self.mark = self.window_t = time.perf_counter()
        self.window_images = 0
        self.names = [m.name for m in metrics.DEVICE_SUMS]
        # a value counted in its mean whatever it is (loss: a NaN loss shows); the others only when finite
        self.always = torch.tensor([m.how == "mean" for m in metrics.DEVICE_SUMS], device=device)
        self.sums = torch.zeros(len(self.names), device=device)  # this window's, on the device
        self.counts = torch.zeros(len(self.names), device=device)
        self.epoch_sums = [0.0] * len(self.names)  # the epoch's windows read so far, on the host
        self.epoch_counts = [0.0] * len(self.names)
        self.last: dict[str, float] = {}
        # the host's wait for the input (metrics.DATA_WAIT): this window's and the epoch's, with their steps
        self.window_wait = self.epoch_wait = 0.0
        self.window_steps = self.epoch_steps = 0
        self.seconds = 0.0  # the training seconds this clock counted (a resumed epoch's state holds earlier ones)

    def timed(self, batches):
        """`batches`, each `next()` timed on the host into the data wait (the loop waits for its input there)."""
        it = iter(batches)
        while True:
            t = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                return
            waited = time.perf_counter() - t
            self.window_wait += waited
            self.epoch_wait += waited
            yield item

    def add(self, images: int, values: dict[str, torch.Tensor], last: dict[str, float] | None = None) -> None:
        """One step of `images` training images (all ranks); `values`: the step's device values by metric name (no
        sync); `last`: host values of the step (lr, momentum) whose last one the window reports."""
        st = self.state
        st.images += images
        st.epoch_images += images
        self.window_images += images
        v = torch.stack([values[n].detach().float().reshape(()) for n in self.names])
        keep = torch.isfinite(v) | self.always
        self.sums += torch.where(keep, v, 0.0)
        self.counts += keep
        self.last.update(last or {})
        self.window_steps += 1
        self.epoch_steps += 1

    def window(self, epoch_steps_done: int, steps_left: int) -> dict[str, float | None]:
        """The metrics of the window since the last call, by name (recipes/metrics.py's WINDOW), which starts a new
        window. One host read of the device sums; a `finite_mean` without a finite step is None."""
        now = time.perf_counter()
        sums, counts = torch.stack([self.sums, self.counts]).tolist()
        out: dict[str, float | None] = {}
        for i, name in enumerate(self.names):
            out[name] = sums[i] / counts[i] if counts[i] else None
            self.epoch_sums[i] += sums[i]
            self.epoch_counts[i] += counts[i]
        out[metrics.IMAGES_PER_S.name] = self.window_images / max(now - self.window_t, 1e-9)
        done = max(epoch_steps_done - self.start_step, 1)
        out[metrics.ETA.name] = (now - self.t0) / done * steps_left
        out.update(_wait(self.window_wait, self.window_steps, now - self.window_t))
        out.update(self.last)
        self.sums.zero_()
        self.counts.zero_()
        self.window_images = 0
        self.window_wait, self.window_steps = 0.0, 0
        return out

    def epoch(self) -> dict[str, float | None]:
        """The epoch's training metrics by name (images/s and the means of its windows, since its start or its
        resume), after `stop`."""
        st = self.state
        out: dict[str, float | None] = {metrics.IMAGES_PER_S.name: st.epoch_images / max(st.epoch_seconds, 1e-9)}
        for i, name in enumerate(self.names):
            out[name] = self.epoch_sums[i] / self.epoch_counts[i] if self.epoch_counts[i] else None
        out.update(_wait(self.epoch_wait, self.epoch_steps, self.seconds))  # this clock's: since the start or resume
        return out

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
        self.seconds += now - self.mark
        self.mark = now


def _wait(waited: float, steps: int, seconds: float) -> dict[str, float | None]:
    """The data wait's two metrics over `steps` steps of `seconds` training time (none without a step)."""
    if not steps:
        return {metrics.DATA_WAIT.name: None, metrics.DATA_WAIT_SHARE.name: None}
    return {
        metrics.DATA_WAIT.name: waited / steps * 1000,
        metrics.DATA_WAIT_SHARE.name: min(waited / max(seconds, 1e-9), 1.0),
    }
