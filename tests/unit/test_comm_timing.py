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


def test_the_balancer_waits_on_the_host_once_per_window():
    """While comm.balance measures on a GPU, the host counts the window's steps (marked, not read) and waits once,
    at the window's last step, for a mark after every communicator; the GPU runs a step behind the host."""
    from functools import partial

    from recipes.comm.balance import BalanceState

    clock = Stopwatch(torch.device("cuda"), event_factory=FakeEvent)
    FakeEvent.gpu_now, FakeEvent.syncs = 0.0, 0
    engine = SimpleNamespace(ring=None, comm_marks=[], joined=None, clock=clock)
    engine.read_communicators = partial(_Engine.read_communicators, engine)
    b, window, windows = BalanceState(2), 4, []
    for step in range(2 * (window + 1)):  # two windows, each after its first step (left out)
        FakeEvent.queued = step
        start = clock.mark()
        done = []
        for end in (0.3, 0.5):  # communicator 0 done 0.3 s after the first gradient, communicator 1 after 0.5 s
            FakeEvent.queued = step + end
            done.append(clock.mark())
        FakeEvent.queued = step + 0.6
        engine.joined = clock.mark()
        engine.comm_marks.append((start, done))
        FakeEvent.gpu_now = step - 1.0  # the device is a step behind the host
        for secs in _Engine.read_window(engine, b.skip + window - b.steps):
            b.add(secs)
        if b.steps >= window:
            windows.append([round(x / b.steps, 6) for x in b.window])
            b.window, b.steps, b.skip = [], 0, 1
    assert windows == [[0.3, 0.5], [0.3, 0.5]]
    assert FakeEvent.syncs == 2  # one per window; every step read with a wait would make 8


def test_a_communicator_done_before_backward_reads_its_own_time(monkeypatch):
    """On a GPU each communicator's slices are waited for on a measuring stream of its own: one done at 4 s while
    backward runs until 10 s reads 4 s, not backward's end (streams modelled by when their queued work ends)."""
    from contextlib import contextmanager

    class Stream:
        def __init__(self, device=None):
            self.t = 0.0  # when the work queued on it so far ends

        def wait_stream(self, other):
            self.t = max(self.t, other.t)

    backward = Stream()
    backward.t = 10.0
    state = {"current": backward}

    @contextmanager
    def on(stream):
        state["current"], before = stream, state["current"]
        yield
        state["current"] = before

    class Work:
        def __init__(self, end):
            self.end = end

        def wait(self):  # NCCL: the current stream waits for the collective's end
            state["current"].t = max(state["current"].t, self.end)

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: state["current"])
    monkeypatch.setattr(torch.cuda, "stream", on)
    engine = SimpleNamespace(
        _meas_streams=None,
        groups=[0, 1, 2],
        device=torch.device("cuda"),
        works=[(0, 0, 0, Work(3.0)), (1, 0, 0, Work(4.0)), (1, 1, 1, Work(12.0))],  # communicator 2 carried nothing
        clock=SimpleNamespace(mark=lambda: state["current"].t),
        t_start=1.0,
        comm_marks=[],
        joined=None,
    )
    _Engine._wait_per_communicator(engine)
    assert engine.comm_marks == [(1.0, [4.0, 12.0, None])]
    assert backward.t == 12.0 and engine.joined == 12.0  # backward's stream waited for every communicator
