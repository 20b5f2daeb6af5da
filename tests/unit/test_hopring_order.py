"""The hop ring's order of posting (recipes/comm/hopring.py): each step's receives go up before the step ahead of
it is waited for, except where they would land in what that step still sends. Real gloo ranks check the sums
(tests/e2e/test_comm_backends.py); here one rank's calls are recorded against groups that only log them."""

from __future__ import annotations

import torch

from recipes.comm.hopring import HopRing


class _Log:
    def __init__(self):
        self.calls: list[str] = []


class _Work:
    def __init__(self, log: _Log):
        self.log = log

    def wait(self, timeout) -> None:
        self.log.calls.append("W")


class _Group:
    """A communicator as the ring uses it: `recv`/`send` post a piece and return its work; nothing moves."""

    def __init__(self, log: _Log):
        self.log = log

    def recv(self, tensors, src, tag):
        self.log.calls.append("R")
        return _Work(self.log)

    def send(self, tensors, dst, tag):
        self.log.calls.append("S")
        return _Work(self.log)


def _calls(world: int) -> str:
    log = _Log()
    groups = [_Group(log), _Group(log)]
    ring = HopRing(groups, 0, world, tuple((1, 1) for _ in range(world)), 5.0)
    try:
        ring.allreduce(0, torch.zeros(12 * world))
    finally:
        ring.close()
    return "".join(log.calls)


def test_each_steps_receives_are_posted_before_the_step_ahead_is_waited_for():
    # 3 ranks, K = 2: 2 reduce-scatter and 2 all-gather steps, each 2 receives (R), 2 sends (S), 4 waits (W)
    assert _calls(3) == "RRSS" + "RRWWWWSS" * 3 + "WWWW"


def test_at_two_ranks_the_all_gathers_receive_waits_for_the_chunk_it_overwrites_to_be_sent():
    # the all-gather receives the chunk the reduce-scatter step sends: posted only after that step's waits
    assert _calls(2) == "RRSSWWWW" + "RRSSWWWW"
