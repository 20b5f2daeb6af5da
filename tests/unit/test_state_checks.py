"""recipes/rundir/state_checks.py: a checkpoint's optimizer, grad-scaler and allreduce state judged before a step
uses it, each problem one phrase (the checkpointer adds the file and the entry)."""

from __future__ import annotations

import math

import pytest
import torch

from recipes.comm.balance import SHARE_TOTAL
from recipes.rundir.state_checks import comm_state_problem, optimizer_state_problem, scaler_state_problem

GOOD_COMM = {"bucket_mb": 8.0, "streams": 4, "slices": 2}


def _sgd():
    w = torch.nn.Parameter(torch.zeros(3, 2))
    opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    return w, opt


def test_a_momentum_buffer_of_another_dtype_is_refused():
    """A float64 buffer beside a float32 parameter: torch's fused SGD reads it as float32 (SC1)."""
    w, opt = _sgd()
    opt.state[w]["momentum_buffer"] = torch.zeros(3, 2, dtype=torch.float64)
    assert optimizer_state_problem(opt) == (
        "group 0, parameter 0, state 'momentum_buffer' is a float64 tensor of shape (3, 2): "
        "expected the parameter's float32 tensor of shape (3, 2)"
    )
    opt.state[w]["momentum_buffer"] = torch.zeros(3, 2)
    assert optimizer_state_problem(opt) is None


@pytest.mark.parametrize(
    "value, ok", [(1.0, False), (0.5, False), (0.0, False), (math.inf, False), (1.0001, True), (2.0, True)]
)
def test_growth_factor_must_grow(value, ok):
    """A growth factor of 1.0 never grows the scale back after a backoff (SC2: (0, 1] was accepted)."""
    state = {"scale": 65536.0, "growth_factor": value, "backoff_factor": 0.5, "growth_interval": 2000}
    problem = scaler_state_problem(state)
    assert problem is None if ok else problem == f"key 'growth_factor' must be a finite number > 1, got {value!r}"


def _hop(rows):
    return {**GOOD_COMM, "balance": {"shares": rows, "hops": len(rows), "version": 1, "settled": False}}


@pytest.mark.parametrize(
    "state, words",
    [
        ({**GOOD_COMM, "streams": 1000}, "key 'streams' must be in comm.streams's domain (> 0, <= 64), got 1000"),
        ({**GOOD_COMM, "streams": 0}, "key 'streams' must be in comm.streams's domain"),
        ({**GOOD_COMM, "streams": 2.5}, "key 'streams' must be an integer, got 2.5"),
        ({**GOOD_COMM, "bucket_mb": math.inf}, "key 'bucket_mb' must be in comm.bucket_mb's domain"),
        ({**GOOD_COMM, "bucket_mb": -8.0}, "key 'bucket_mb' must be in comm.bucket_mb's domain"),
        ({**GOOD_COMM, "bucket_mb": "8"}, "key 'bucket_mb' must be a number, got '8'"),
        ({**GOOD_COMM, "slices": True}, "key 'slices' must be an integer, got True"),
        ({"streams": 4, "slices": 2}, "has no key 'bucket_mb'"),
        ({**GOOD_COMM, "balance": [1, 2]}, "key 'balance' must be a mapping, got list"),
        ({**GOOD_COMM, "balance": {"shares": [250, 250, 250]}}, "key 'balance.shares' must be 4 shares"),
        ({**GOOD_COMM, "balance": {"shares": 5}}, "key 'balance.shares' must be 4 shares (comm.streams=4), got 5"),
        ({**GOOD_COMM, "balance": {"shares": [-250, 750, 250, 250]}}, "must be positive integers summing to 1000"),
        ({**GOOD_COMM, "balance": {"shares": [0, 500, 250, 250]}}, "must be positive integers summing to 1000"),
        ({**GOOD_COMM, "balance": {"shares": [math.inf, 250, 250, 250]}}, "must be positive integers summing"),
        ({**GOOD_COMM, "balance": {"shares": [250.0, 250, 250, 250]}}, "must be positive integers summing"),
        ({**GOOD_COMM, "balance": {"shares": [300, 250, 250, 250]}}, "must be positive integers summing to 1000"),
        (_hop([[250] * 4, [250] * 4, [250] * 3]), "key 'balance.shares' must be 3 rows of 4 shares"),
        ({**_hop([[250] * 4] * 2), "balance": {"shares": [[250] * 4] * 2, "hops": 3}}, "must be 3 rows of 4"),
        ({**GOOD_COMM, "balance": {"hops": -1}}, "key 'balance.hops' must be an integer in 0..65536, got -1"),
        ({**GOOD_COMM, "balance": {"version": 1e308}}, "key 'balance.version' must be an integer in 0.."),
        ({**GOOD_COMM, "balance": {"settled": "yes"}}, "key 'balance.settled' must be true or false, got 'yes'"),
    ],
)
def test_a_multistream_state_outside_comms_domains_is_one_phrase(state, words):
    """Negative, zero or infinite shares, the wrong shape, bad bucket_mb/streams were tracebacks when the plan was
    built, and `streams: 1000` hung creating 1,000 process groups."""
    problem = comm_state_problem(state)
    assert problem is not None and words in problem and "\n" not in problem, problem


@pytest.mark.parametrize(
    "state",
    [
        {},
        GOOD_COMM,
        {**GOOD_COMM, "balance": {"shares": None, "hops": 0, "version": 0, "replans": 0, "quiet": 0}},
        {**GOOD_COMM, "balance": {"shares": [SHARE_TOTAL - 30, 10, 10, 10], "version": 3, "settled": True}},
        _hop([[400, 200, 200, 200], [250] * 4, [100, 300, 300, 300]]),
    ],
)
def test_a_state_the_backends_write_is_accepted(state):
    assert comm_state_problem(state) is None
