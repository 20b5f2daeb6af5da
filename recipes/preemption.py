"""Preemption: SIGTERM or SIGINT stop the run at a step boundary, every rank at the same step, with a checkpoint.

A scheduler (SLURM's preemption, `scancel`, a time limit, a spot instance's notice) sends SIGTERM and, after a
grace period, SIGKILL. The signal may reach one rank only, so the handler merely records it; the trainer asks
`StopSignal.agreed()` at a boundary where it synchronises anyway (each log window), which takes the maximum of every
rank's flag with one one-element all_reduce on the training device (gloo on CPU). When it says stop, every rank
saves the checkpoint together (`Checkpointer.save`), then the run ends with `Preempted`, which the command line
turns into one line and exit code `EXIT_PREEMPTED` (75, EX_TEMPFAIL in sysexits.h: "try again later"). Rerunning
the command that started the run continues from that checkpoint (checkpoint.resume); `rerun_hint` names that command
for the way the run was started: make or scripts/launch.py (which pass it to the workers as DAWNBENCH_RERUN),
torchrun, or train.py alone. Signals that arrive after the first,
during the save included, are counted and otherwise ignored, so the save is never cut short by one; a SIGKILL can
still end it, and then the previous checkpoint is intact (checkpoints are written to a temporary file and renamed).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager

import torch
import torch.distributed as td

from recipes.distributed import DistInfo, collective_guard
from recipes.exit_codes import PREEMPTED

EXIT_PREEMPTED = PREEMPTED  # 75, EX_TEMPFAIL
# How long a stop signal waits for a phase's first compile (StopSignal.bounded): well inside the launcher's grace
# (launch.py --grace) and torchrun's (30 s), so the process leaves by itself rather than being killed.
COMPILE_STOP_WAIT_S = 20.0
RERUN_ENV = "DAWNBENCH_RERUN"  # the command that resumes this run, set by make and scripts/launch.py for the workers


def rerun_hint(environ: dict | None = None) -> str:
    """What to run to continue after a stop, for the way this process was started."""
    env = os.environ if environ is None else environ
    if env.get(RERUN_ENV):
        return f"rerun `{env[RERUN_ENV]}` to resume from it"
    if "TORCHELASTIC_RUN_ID" in env:
        return "rerun the same torchrun command to resume from it (the run directory's checkpoint is found)"
    return "rerun the same train.py command to resume from it (the run directory's checkpoint is found)"


SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignal:
    """Records SIGTERM/SIGINT from `install()` to `restore()`; `agreed()` says whether any rank got one."""

    def __init__(self, signals: tuple[signal.Signals, ...] = SIGNALS):
        self.signals = signals
        self.received: list[str] = []  # the names of the signals received, in order
        self._old: dict = {}

    def _on_signal(self, signum, frame) -> None:
        self.received.append(signal.Signals(signum).name)  # no exception: the step and the save run to the end

    @contextmanager
    def bounded(self, what: str, wait_s: float = COMPILE_STOP_WAIT_S):
        """Around work that reaches no step boundary for a long time (a phase's first torch.compile): a signal that
        arrives inside waits at most `wait_s` for it, then the process leaves with EXIT_PREEMPTED and one line,
        without a checkpoint of this step (the last one stands), inside any scheduler's grace period."""
        timer: list[threading.Timer] = []

        def leave() -> None:
            print(
                f"preempted: {self.received[0]} during {what}, which did not end within {wait_s:g} s: leaving "
                f"without a checkpoint of this step; {rerun_hint()} (from the last checkpoint)",
                file=sys.stderr,
                flush=True,
            )
            os._exit(EXIT_PREEMPTED)

        def arm() -> None:
            if not timer:
                timer.append(threading.Timer(wait_s, leave))
                timer[0].daemon = True
                timer[0].start()

        def on_signal(signum, frame) -> None:
            self._on_signal(signum, frame)
            arm()

        active = bool(self._old) and threading.current_thread() is threading.main_thread()
        if active:
            for s in self.signals:
                signal.signal(s, on_signal)
        try:
            if active and self.received:  # a signal just before: the same bound
                arm()
            yield
        finally:
            for t in timer:
                t.cancel()
            if active:
                for s in self.signals:
                    signal.signal(s, self._on_signal)

    def install(self) -> None:
        """Handle the signals from now on (in the main thread only: Python runs handlers there)."""
        if not self._old and threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._on_signal) for s in self.signals}

    def restore(self) -> None:
        """Put back the handlers that `install()` replaced."""
        for s, handler in self._old.items():
            signal.signal(s, handler)
        self._old = {}

    @property
    def local(self) -> bool:
        """Whether this process received a signal."""
        return bool(self.received)

    def agreed(self, dist: DistInfo, step: int, timeout_s: float) -> bool:
        """Whether any rank received a signal (all ranks call it at the same step; one tiny all_reduce)."""
        if not td.is_initialized() or td.get_world_size() == 1:
            return self.local
        flag = torch.tensor([1.0 if self.local else 0.0], device=dist.device)
        with collective_guard("preemption check (all_reduce of the stop flag)", step, timeout_s):
            td.all_reduce(flag, op=td.ReduceOp.MAX)
        return bool(flag.item())

    def describe(self) -> str:
        """'SIGTERM' or 'SIGTERM on another rank'."""
        return self.received[0] if self.received else "a signal on another rank"


def ignore_stop_signals() -> None:
    """Ignore SIGTERM/SIGINT from now on: the process is leaving after a preemption (its checkpoint is written)."""
    if threading.current_thread() is threading.main_thread():
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)


__all__ = ["EXIT_PREEMPTED", "RERUN_ENV", "SIGNALS", "StopSignal", "ignore_stop_signals", "rerun_hint"]
