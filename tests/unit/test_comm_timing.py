"""Communication timing (recipes/comm/timing.py): wall time on CPU, CUDA events on a GPU, read without stalling."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from recipes.comm.engine import _Engine
from recipes.comm.timing import Stopwatch


class FakeEvent:
    """Stands in for torch.cuda.Event: 'reached' once the fake GPU clock passes its time."""

    gpu_now = 0.0
    syncs = 0

    def record(self):
        self.t = FakeEvent.queued  # where the event sits in the stream's work

    def query(self):
        return FakeEvent.gpu_now >= self.t

    def synchronize(self):
        FakeEvent.syncs += 1
        FakeEvent.gpu_now = max(FakeEvent.gpu_now, self.t)

    def elapsed_time(self, end):
        assert self.query() and end.query(), "elapsed_time of an event the GPU has not reached"
        return (end.t - self.t) * 1000.0


def test_cpu_marks_are_wall_time():
    clock = Stopwatch(torch.device("cpu"))
    a = clock.mark()
    time.sleep(0.05)
    assert clock.seconds(a, clock.mark()) == pytest.approx(0.05, abs=0.04)


def test_cuda_marks_measure_gpu_time_not_host_time():
    """The host returns at once from NCCL's wait(); the events carry when the GPU got there."""
    clock = Stopwatch(torch.device("cuda"), event_factory=FakeEvent)
    FakeEvent.gpu_now, FakeEvent.syncs = 0.0, 0
    FakeEvent.queued = 1.0
    start = clock.mark()
    FakeEvent.queued = 1.25  # communication and copy-back queued behind it: 250 ms of GPU work
    end = clock.mark()
    assert clock.seconds(start, end, wait=False) is None  # not reached: no stall, read later
    assert FakeEvent.syncs == 0
    assert clock.seconds(start, end, wait=True) == pytest.approx(0.25)
    assert FakeEvent.syncs == 1


def test_engine_reads_finished_steps_in_order_and_leaves_the_rest():
    clock = Stopwatch(torch.device("cuda"), event_factory=FakeEvent)
    FakeEvent.gpu_now, FakeEvent.syncs = 0.0, 0
    marks = []
    for step in range(3):  # each step: first gradient at s, backward ends at s + 0.1, averages at s + 0.15
        points = []
        for dt in (0.0, 0.1, 0.15):
            FakeEvent.queued = step + dt
            points.append(clock.mark())
        marks.append(tuple(points))
    engine = SimpleNamespace(marks=list(marks), clock=clock)
    FakeEvent.gpu_now = 1.5  # the GPU has finished step 0 and 1 only
    got = _Engine.read(engine, wait=False)
    assert [pytest.approx(x) for x in got] == [(0.15, 0.05), (0.15, 0.05)] and len(engine.marks) == 1
    assert FakeEvent.syncs == 0
    assert _Engine.read(engine, wait=True) == [pytest.approx((0.15, 0.05))] and engine.marks == []
    assert FakeEvent.syncs == 1
