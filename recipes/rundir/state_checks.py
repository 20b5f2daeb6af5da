"""A checkpoint's optimizer, grad-scaler and allreduce (comm) state checked against the run's parts before a step
uses them.

`torch.optim.Optimizer.load_state_dict` checks only that the parameter groups have the same sizes; a momentum buffer
of another shape or dtype goes through, and torch's fused SGD then reads past its memory (a segfault, exit 139).
GradScaler's `load_state_dict` takes any number, and multistream's takes any settings and share table (negative or
infinite shares were tracebacks when the plan was built; `streams: 1000` hung creating a thousand process groups).
Each check returns what is wrong, in words, or None.
"""

from __future__ import annotations

import math

import torch

from recipes.comm.balance import SHARE_TOTAL
from recipes.config.schema import CommConfig, domain_rule, domain_text, section_fields


def _scalar(value) -> float | None:
    """`value` as a float when it is a real number or a one-element tensor, else None."""
    if isinstance(value, torch.Tensor):
        return float(value.reshape(-1)[0]) if value.numel() == 1 and not value.is_complex() else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def optimizer_state_problem(optimizer: torch.optim.Optimizer) -> str | None:
    """What is wrong with the state `optimizer` holds after load_state_dict: each per-parameter tensor must have its
    parameter's shape and dtype, each 'step' must be a finite count >= 0."""
    for g, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            for key, value in optimizer.state.get(p, {}).items():
                where = f"group {g}, parameter {i}, state '{key}'"
                if key == "step":
                    step = _scalar(value)
                    if step is None or not math.isfinite(step) or step < 0:
                        return f"{where} must be a finite count >= 0, got {_short(value)}"
                elif value is None:  # torch's SGD without momentum keeps None
                    continue
                elif not isinstance(value, torch.Tensor):
                    return f"{where} must be a tensor, got {type(value).__name__}"
                elif value.shape != p.shape or value.dtype != p.dtype:
                    return f"{where} is a {_tensor(value)}: expected the parameter's {_tensor(p)}"
    return None


# GradScaler's state_dict: key -> (what it must be, test)
_SCALER = {
    "scale": ("a finite number > 0", lambda v: v > 0),
    "growth_factor": ("a finite number > 1", lambda v: v > 1),
    "backoff_factor": ("a number in (0, 1)", lambda v: 0 < v < 1),
    "growth_interval": ("an integer >= 1", lambda v: v >= 1 and v == int(v)),
    "_growth_tracker": ("an integer >= 0", lambda v: v >= 0 and v == int(v)),
}


def scaler_state_problem(state: dict) -> str | None:
    """What is wrong with a GradScaler state_dict (an empty one, of a disabled scaler, is fine)."""
    for key, value in state.items():
        if key not in _SCALER:
            return f"has unknown key '{key}'"
        want, ok = _SCALER[key]
        number = _scalar(value)
        if number is None or not math.isfinite(number) or not ok(number):
            return f"key '{key}' must be {want}, got {_short(value)}"
    return None


def _tensor(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')} tensor of shape {tuple(t.shape)}"


def _short(value) -> str:
    if isinstance(value, torch.Tensor):
        text = repr(_scalar(value)) if value.numel() == 1 else _tensor(value)
    else:
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# multistream's balancer counters: key -> the largest value a run can reach (a re-plan per window, for years)
_BALANCE_COUNTS = {"version": 10**9, "replans": 10**9, "quiet": 10**9, "stretches": 10**9}
_MAX_HOPS = 65536  # the hop table has a row per host: more hosts than any cluster


def comm_state_problem(state) -> str | None:
    """What is wrong with an allreduce backend's state_dict (an empty one, of a backend that keeps none, is fine):
    multistream's (bucket_mb, streams, slices) in comm's own domains, and its balancer's shares a table of the
    checkpoint's own shape (a row of `streams` positive integers summing to SHARE_TOTAL, one row per hop at hop
    level) with bounded counters."""
    if not state or not {"bucket_mb", "streams", "slices", "balance"} & set(state):
        return None  # no backend state, or another backend's (its own load_state_dict judges it)
    fields = {k: f for k, (f, _) in section_fields(CommConfig).items()}
    for name, kind in (("bucket_mb", float), ("streams", int), ("slices", int)):
        if name not in state:
            return f"has no key '{name}'"
        v = state[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
            return f"key '{name}' must be {'an integer' if kind is int else 'a number'}, got {_short(v)}"
        domain = fields[name].metadata["domain"]
        if not all(domain_rule(word)[0](v) for word in domain.split()) or not math.isfinite(v):
            return f"key '{name}' must be in comm.{name}'s domain ({domain_text(domain)}), got {_short(v)}"
    balance = state.get("balance")
    return None if balance is None else _balance_problem(balance, state["streams"])


def _count(value, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most


def _balance_problem(balance, streams: int) -> str | None:
    if not isinstance(balance, dict):
        return f"key 'balance' must be a mapping, got {type(balance).__name__}"
    hops = balance.get("hops", 0)
    if not _count(hops, _MAX_HOPS):
        return f"key 'balance.hops' must be an integer in 0..{_MAX_HOPS}, got {_short(hops)}"
    for key, most in _BALANCE_COUNTS.items():
        if key in balance and not _count(balance[key], most):
            return f"key 'balance.{key}' must be an integer in 0..{most:,}, got {_short(balance[key])}"
    if "settled" in balance and not isinstance(balance["settled"], bool):
        return f"key 'balance.settled' must be true or false, got {_short(balance['settled'])}"
    shares = balance.get("shares")
    if shares is None:
        return None
    rows = shares if hops else [shares]
    shape = f"{hops} rows of {streams} shares" if hops else f"{streams} shares"
    if not isinstance(shares, list) or len(rows) != max(hops, 1):
        return f"key 'balance.shares' must be {shape} (comm.streams={streams}), got {_short(shares)}"
    for row in rows:
        if not isinstance(row, list) or len(row) != streams:
            return f"key 'balance.shares' must be {shape} (comm.streams={streams}), got a row {_short(row)}"
        if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in row) or sum(row) != SHARE_TOTAL:
            return f"key 'balance.shares' must be positive integers summing to {SHARE_TOTAL}, got {_short(row)}"
    return None
