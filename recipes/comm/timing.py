"""How long communication took, measured where it runs: CUDA events on a GPU, wall time on CPU.

With NCCL, `work.wait()` only makes the current CUDA stream wait for the communicator's stream; the host returns
at once, so host wall time around a step measures kernel launches, not communication. A `Stopwatch` mark is
instead a CUDA event recorded on the current stream: marked after the stream has been made to wait for every
communicator (the end of multistream's `finalize`), it is reached on the GPU only when communication and the
copy-back are done, and the time between two marks is what the GPU spent. On CPU (gloo) a collective's
`wait()` blocks the host, and a mark is `time.perf_counter()`.

Reading a CUDA interval either waits for its last event (`wait=True`: one synchronisation, used by the tuner
at the end of a timed step) or returns None while the GPU has not reached it (the per-step stats, read late).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


class Stopwatch:
    """Marks points in the work of one device and turns pairs of marks into seconds."""

    def __init__(self, device: torch.device, event_factory: Callable | None = None):
        self.cuda = device.type == "cuda"
        # event_factory: tests hand a fake event to exercise the CUDA branch on CPU
        self._event = event_factory or (lambda: torch.cuda.Event(enable_timing=True))

    def mark(self):
        """A point in time: an event recorded on the current CUDA stream, or the host clock on CPU."""
        if not self.cuda:
            return time.perf_counter()
        event = self._event()
        event.record()
        return event

    def wait(self, mark) -> None:
        """Block the host until the device has reached `mark` (nothing on CPU: a mark there is already past)."""
        if self.cuda and not mark.query():
            mark.synchronize()

    def seconds(self, start, end, wait: bool = True) -> float | None:
        """Seconds from mark `start` to mark `end`; None if `end` is not reached yet and not `wait`."""
        if not self.cuda:
            return end - start
        if not end.query():
            if not wait:
                return None
            end.synchronize()
        return start.elapsed_time(end) / 1000.0  # milliseconds between the two events on the GPU
