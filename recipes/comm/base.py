"""The allreduce backend interface (`AllreduceBackend`), its no-op defaults (`BackendDefaults`), and `StepWindow`,
the timer the backends measure their communication window with.

A backend is named by `comm.backend` in base/registry.py and built from its own config section by
`recipes.comm.create_allreduce` as `Backend(cfg.comm, dist, timeout_s=..., model_name=...)`; the trainer calls, in
this order:

    Backend.process_env(cfg.comm)         before torch.distributed starts (recipes.distributed.setup's `env`)
    backend.load_state_dict(state)        on resume, with what state_dict() saved
    backend.prepare(model, optimizer)     -> (module to run forward/backward through, optimizer to step)
    with backend.no_sync(module): ...     around forward+backward of each accumulated micro-batch but the last
    backend.on_step_end(step, log)        after every optimizer step
    backend.stats()                       -> CommStats, at the end of the run (summary.json)

After `loss.backward()` returns (or, for Horovod, after `optimizer.step()`), every rank holds the same averaged
gradients, so the trainer has no backend-specific code.
"""

from __future__ import annotations

import os
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from base.errors import ConfigError
from recipes.comm.stats import CommStats


@runtime_checkable
class AllreduceBackend(Protocol):
    name: str  # the comm.backend value

    @classmethod
    def process_env(cls, comm) -> dict[str, str]:
        """Environment variables for torch.distributed (RANK, WORLD_SIZE, ...) that the launcher left out."""

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Wrap the model and/or optimizer so that gradients are averaged over ranks."""

    def no_sync(self, model: nn.Module) -> AbstractContextManager:
        """Forward and backward passes inside keep their gradients local (accumulated in `.grad`); the next pass
        outside reduces the sum. `model` is what `prepare` returned."""

    def on_step_end(self, step: int, log=None) -> None:
        """After every optimizer step (close the step's timing window, drive an auto-tuner)."""

    def stats(self) -> CommStats:
        """What was measured so far."""

    def state_dict(self) -> dict:
        """Tuned settings to keep in the checkpoint."""

    def load_state_dict(self, state: dict) -> None: ...


class BackendDefaults:
    """The no-op parts of the interface; a backend overrides what it needs."""

    name = "?"

    def __init__(self, comm, dist, *, timeout_s: float, model_name: str, compute_start=None):
        """`comm`: the config's comm section; `timeout_s`: how long a collective may take (`dist.timeout_s`);
        `model_name`: the model's name (`model.name`), part of the tuning cache's key; `compute_start`: the
        calibrated compute for the tuner's model start (recipes.timemodel.calibrated_compute with the config bound)."""
        self.comm_cfg, self.dist = comm, dist
        self.timeout_s, self.model_name, self.compute_start = timeout_s, model_name, compute_start

    @classmethod
    def process_env(cls, comm) -> dict[str, str]:
        if "HOROVOD_RANK" in os.environ and "RANK" not in os.environ:  # every process would train alone
            raise ConfigError(
                f"comm.backend={cls.name}: this process was started by horovodrun; set "
                "comm.backend=horovod, or launch with torchrun"
            )
        return {}  # torchrun (or a single process) set the environment

    def no_sync(self, model: nn.Module) -> AbstractContextManager:
        return nullcontext()  # nothing is reduced (a single process)

    def on_step_end(self, step: int, log=None) -> None:
        pass

    def stats(self) -> CommStats:
        return CommStats(self.name)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class StepWindow:
    """Per step, the time from the first `begin()` to the last `end()`, summed over the steps `close_step()` ends.

    On a CUDA device both ends are events recorded on the current stream (where the gradients are produced, and
    where a communication future's callbacks run after the collective completed), read back without blocking
    once they completed; on CPU they are `time.perf_counter()` readings.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.steps = 0
        self._seconds = 0.0
        self._start = self._end = None
        self._pending: list = []  # (start, end) CUDA events of closed steps not yet read

    def _mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def begin(self) -> None:
        if self._start is None:
            self._start = self._mark()

    def end(self) -> None:
        self._end = self._mark()

    def close_step(self) -> None:
        if self._start is None or self._end is None:
            self._start = self._end = None
            return  # nothing was reduced in this step
        if self.cuda:
            self._pending.append((self._start, self._end))
            self._read(block=False)
        else:
            self._seconds += self._end - self._start
        self.steps += 1
        self._start = self._end = None

    def _read(self, block: bool) -> None:
        left = []
        for start, end in self._pending:
            if block:
                end.synchronize()
            if block or end.query():
                self._seconds += start.elapsed_time(end) / 1000
            else:
                left.append((start, end))
        self._pending = left

    @property
    def seconds(self) -> float:
        self._read(block=True)
        return self._seconds
