"""recipes/preemption.py: the signal handler records, never raises; the ranks agree on the flag."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import torch
from support import ROOT

from recipes.distributed import DistInfo
from recipes.preemption import EXIT_PREEMPTED, StopSignal

ONE = DistInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, device=torch.device("cpu"))


def test_sigterm_is_recorded_not_raised_and_the_handler_is_put_back():
    before = signal.getsignal(signal.SIGTERM)
    stop = StopSignal()
    stop.install()
    try:
        assert not stop.agreed(ONE, 0, 10)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.received == ["SIGTERM"] and stop.agreed(ONE, 3, 10)
        assert stop.describe() == "SIGTERM"
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigint_raises_no_keyboard_interrupt_and_a_second_signal_is_ignored():
    original = signal.getsignal(signal.SIGINT)  # Python's default_int_handler, or SIG_IGN in a background job
    stop = StopSignal()
    stop.install()
    try:
        os.kill(os.getpid(), signal.SIGINT)  # the default handler would raise KeyboardInterrupt here
        os.kill(os.getpid(), signal.SIGTERM)  # e.g. during the checkpoint save: counted, nothing else
    finally:
        stop.restore()
    assert stop.received == ["SIGINT", "SIGTERM"] and stop.describe() == "SIGINT"
    assert signal.getsignal(signal.SIGINT) is original


def test_installing_twice_keeps_the_original_handler():
    original = signal.getsignal(signal.SIGINT)
    stop = StopSignal()
    stop.install()
    stop.install()
    stop.restore()
    assert signal.getsignal(signal.SIGINT) is original


def test_no_signal_no_stop_and_the_exit_code_is_ex_tempfail():
    assert not StopSignal().agreed(ONE, 0, 10)
    assert StopSignal().describe() == "a signal on another rank"
    assert EXIT_PREEMPTED == 75  # sysexits.h EX_TEMPFAIL; docs/failures.md and scripts/slurm/ name it


# train.py's exit path in a process of its own: the trainer raises Preempted (as it does once the checkpoint is
# written), the process then survives the SIGTERM and SIGINT that torchrun sends the other ranks, and exits 75.
EXIT_PATH = """
import os, signal, sys
import recipes.trainer
from base.errors import Preempted
import train

def preempted(*a, **kw):
    raise Preempted("SIGTERM at step 3: checkpoint written")

recipes.trainer.train = preempted
code = train.main(["-c", "configs/quickstart.yaml"])
os.kill(os.getpid(), signal.SIGTERM)  # the default action would end the process here, with -15
os.kill(os.getpid(), signal.SIGINT)  # the default handler would raise KeyboardInterrupt
print("survived", flush=True)
sys.exit(code)
"""


def test_a_preempted_run_exits_75_in_one_line_and_ignores_further_signals():
    p = subprocess.run([sys.executable, "-c", EXIT_PATH], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 75, p.stderr  # sysexits.h EX_TEMPFAIL, literal: docs/failures.md and scripts/slurm/
    assert p.stdout == "survived\n"
    assert p.stderr.strip().splitlines()[-1] == "preempted: SIGTERM at step 3: checkpoint written"
    assert "Traceback" not in p.stderr


_BOUNDED = """
import os, signal, sys, time
from recipes.preemption import StopSignal
stop = StopSignal()
stop.install()
with stop.bounded("a long compile", wait_s=float(sys.argv[1])):
    if sys.argv[2] == "signal":
        os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(float(sys.argv[3]))  # the compile
print("compile ended; received", stop.received, flush=True)
"""


def test_a_stop_during_a_long_compile_leaves_within_the_bound_with_exit_75():
    """A signal inside the first compile of a phase: the process leaves after the bound, not when the compile ends.
    Judged by what the process did, not by the wall clock: a process that waited for the compile would print
    "compile ended" and exit 0 after its 30 s (the subprocess's timeout is far from both)."""
    p = subprocess.run(
        [sys.executable, "-c", _BOUNDED, "0.5", "signal", "30"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == EXIT_PREEMPTED, p.stdout + p.stderr
    assert p.stderr.startswith("preempted: SIGTERM during a long compile, which did not end within 0.5 s") and (
        "rerun the same train.py command" in p.stderr
    )
    assert "compile ended" not in p.stdout


def test_a_compile_that_ends_in_time_leaves_the_stop_to_the_step_boundary():
    p = subprocess.run(
        [sys.executable, "-c", _BOUNDED, "5", "signal", "0.2"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0 and "compile ended; received ['SIGTERM']" in p.stdout, p.stderr
    quiet = subprocess.run(
        [sys.executable, "-c", _BOUNDED, "0.1", "none", "0.5"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert quiet.returncode == 0 and "received []" in quiet.stdout
