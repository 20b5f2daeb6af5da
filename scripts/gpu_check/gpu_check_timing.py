"""How the GPU check times a training step, one way for every part (speed, capture, perf, steps): N calls after an
untimed warm-up, between two CUDA events recorded on the current stream (the GPU's own clock; the host waits once,
at the end), or by the host clock on the CPU, where the same code runs in the smoke tests; rounds are compared by
their median.

The device is idle when the first event is recorded (the host waits for it first), so the events span the calls'
own work and every wait for the host between them: a step that the host's launches bound is timed as long as it
takes, not as the GPU's kernels alone (torch.profiler's kernel time is the separate column that shows that).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def seconds_per_call(fn: Callable[[], object], n: int = 1, *, device) -> float:
    """Seconds per call over `n` calls of `fn()`: CUDA events around them on a GPU, the host clock on the CPU."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / n
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def time_calls(fn: Callable[[], object], n: int, *, device, warmup: int = 0, rounds: int = 1) -> list[float]:
    """Seconds per call in each of `rounds` rounds of `n` calls, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    return [seconds_per_call(fn, n, device=device) for _ in range(rounds)]


def median_ms(seconds: list[float]) -> float:
    """The median of rounds' seconds per call, in milliseconds."""
    return statistics.median(seconds) * 1e3
