"""What a person reads: one console line per N steps on rank 0 and TensorBoard curves (the run directory's files
are recipes/rundir/outputs.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from recipes.metrics import format_seconds, step_line
from recipes.rundir import files

__all__ = ["RunLogger", "format_seconds"]


class RunLogger:
    """Rank 0 writes; other ranks hold a logger that does nothing."""

    def __init__(self, run_dir: Path, active: bool, tensorboard: bool):
        self.active = active
        self.run_dir = run_dir
        self.tb = None
        if active and tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir / files.TENSORBOARD))

    def info(self, msg: str) -> None:
        if self.active:
            print(msg, flush=True)

    def warn(self, msg: str) -> None:
        if self.active:
            print(f"warning: {msg}", file=sys.stderr, flush=True)

    def scalars(self, step: int, **values: float) -> None:
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(k, v, step)

    def step_line(self, epoch: int, epochs: int, step: int, steps: int, window: dict) -> None:
        """The log window's line; `window`: EpochClock.window()'s metrics by name (recipes/metrics.py)."""
        self.info(step_line(epoch, epochs, step, steps, window))

    def close(self) -> None:
        if self.tb is not None:
            self.tb.flush()
            self.tb.close()
