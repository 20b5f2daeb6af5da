"""Preemption of a two-rank run under torchrun: SIGTERM to one rank stops both at the same step with a checkpoint
and exit code 75; the rerun with --resume ends with the weights of the uninterrupted run, bit for bit."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from support import TINY_OVERRIDES, start_torchrun, wait_for_step, worker_pid

from recipes.rundir import checkpoint_files as ckpt

STEPS = 24  # 6 epochs x ceil(48 / 12)
TINY = [
    "-c",
    "configs/base.yaml",
    *TINY_OVERRIDES,
    "run.deterministic=true",
    "checkpoint.keep=30",
    "phases=[{epochs: 6, image_size: 32, batch_size: 12}]",
]


def _start(run_dir: Path, data: Path, *extra: str) -> subprocess.Popen:
    return start_torchrun(0, "--run-dir", str(run_dir), *TINY, f"data.root={data}", *extra)


def _finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


@pytest.mark.slow
def test_sigterm_to_one_rank_checkpoints_exits_75_and_the_resume_is_bit_identical(tiny_root, tmp_path):
    ref, run = tmp_path / "ref", tmp_path / "run"
    out, err = _finish(_start(ref, tiny_root))
    assert f"{STEPS} steps" in out + err, (out + err)[-3000:]

    proc = _start(run, tiny_root)
    wait_for_step(run, proc, 5)
    victim = worker_pid(proc.pid, 1)
    assert victim, "rank 1 not found"
    os.kill(victim, signal.SIGTERM)
    out, err = _finish(proc)
    stops = re.findall(r"preempted: stopped by (.+?) at step (\d+) ", err)
    assert sorted(who for who, _ in stops) == ["SIGTERM", "a signal on another rank"], (out + err)[-4000:]
    step = int(stops[0][1])
    assert stops[1][1] == str(step) and 5 <= step < STEPS  # both ranks stopped at one step boundary
    assert len(re.findall(r"exitcode\s+:\s+75 \(pid", err)) == 2, err[-3000:]  # torchrun's report of both ranks
    assert err.count("Traceback") == 1 and "KeyboardInterrupt" not in err  # torchrun's own (ChildFailedError)
    saved = ckpt.load(run / "checkpoint.pt")
    assert saved["state"]["step"] == step and not (run / "summary.json").exists()

    out, err = _finish(_start(run, tiny_root, "--resume"))
    assert f"resumed from {run / 'checkpoint.pt'}" in out + err, (out + err)[-3000:]
    a = ckpt.load(ref / f"ckpt-{STEPS:08d}.pt")["model"]
    b = ckpt.load(run / f"ckpt-{STEPS:08d}.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((run / "summary.json").read_text())["steps"] == STEPS
