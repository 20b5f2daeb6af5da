"""A checkpoint's optimizer and grad-scaler state checked against the run's parts before a step uses them.

`torch.optim.Optimizer.load_state_dict` checks only that the parameter groups have the same sizes; a momentum buffer
of another shape or dtype goes through, and torch's fused SGD then reads past its memory (a segfault, exit 139).
GradScaler's `load_state_dict` takes any number. Each check returns what is wrong, in words, or None.
"""

from __future__ import annotations

import math

import torch


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
