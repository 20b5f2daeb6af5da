"""`CommStats`: what an allreduce backend measured, as summary.json's `comm` and scripts/compare_runs.py read it.

Kept free of torch so the comparison script imports it without the training stack.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CommStats:
    """Gradient communication of one rank over a run (rank 0's numbers in summary.json).

    `comm_seconds` sums, over the steps whose gradients were reduced, the time from the first gradient (or bucket)
    handed to the allreduce to the averaged gradients being in place: the communication window of the step,
    which overlaps backward. `wait_seconds` is the part of it after backward ended (not hidden behind compute);
    None where the backend cannot tell them apart.
    """

    backend: str
    steps: int = 0  # optimizer steps whose gradients went through the allreduce (0: one process, nothing to reduce)
    comm_seconds: float = 0.0
    wait_seconds: float | None = None
    bytes: int = 0  # gradient bytes this rank handed to the allreduce over the run, in the wire format
    settings: dict[str, Any] = field(default_factory=dict)  # the backend's own knobs (buckets, streams, ...)

    @property
    def comm_seconds_per_step(self) -> float | None:
        return self.comm_seconds / self.steps if self.steps else None

    @property
    def wait_seconds_per_step(self) -> float | None:
        return self.wait_seconds / self.steps if self.steps and self.wait_seconds is not None else None

    @property
    def bytes_per_step(self) -> int | None:
        return self.bytes // self.steps if self.steps else None

    def to_dict(self) -> dict:
        """The record plus its per-step values (for a person reading summary.json)."""
        out = dataclasses.asdict(self)
        for name in ("comm_seconds_per_step", "wait_seconds_per_step", "bytes_per_step"):
            out[name] = getattr(self, name)
        return out

    @classmethod
    def from_dict(cls, data: dict | None) -> CommStats | None:
        """The record in summary.json's `comm` (None: a run from before the record, or no `comm` at all)."""
        if not data or "backend" not in data:
            return None
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
