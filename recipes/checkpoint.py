"""Checkpoints written atomically (temp file + fsync + rename) and read back with clear errors."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

CHECKPOINT_NAME = "checkpoint.pt"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names the file."""


def save_atomic(state: dict, path: str | Path) -> None:
    """Write `state` so that `path` is always either the old complete file or the new complete file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def load(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # torch raises several types for a damaged file
        raise CheckpointError(f"checkpoint '{path}' cannot be read: {e}") from None
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"checkpoint '{path}' has no 'model' entry: not a checkpoint of this trainer")
    return state


def rng_state() -> dict:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
