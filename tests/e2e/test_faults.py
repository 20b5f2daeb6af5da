"""Faults injected for real: killed and hung workers, non-finite loss, damaged checkpoints, full disks."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from support import ROOT, free_port, start_torchrun, tiny_config, wait_for_step, worker_pid

from base.errors import CheckpointError, NonFiniteError, TrainingError
from recipes.rundir import checkpoint_files as ckpt
from recipes.trainer import train

DET = ("run.deterministic=true", "phases=[{epochs: 2, image_size: 32, batch_size: 12}]")


def test_step_checkpoints_keep_the_last_k(tiny_root, tmp_path):
    train(tiny_config(tiny_root, tmp_path, *DET, "checkpoint.every_steps=3", "checkpoint.keep=2"))
    run = tmp_path / "tiny"
    names = sorted(p.name for p in run.glob("ckpt-*.pt"))
    assert names == ["ckpt-00000006.pt", "ckpt-00000008.pt"]  # steps 3, 4 (epoch end), 6, 8: newest two
    assert os.path.samefile(run / "checkpoint.pt", run / "ckpt-00000008.pt")
    mid = ckpt.load(run / "ckpt-00000006.pt")["state"]
    assert (mid["epoch"], mid["epoch_step"], mid["step"]) == (1, 2, 6)  # data position: 2 steps into epoch 2


def test_mid_epoch_resume_neither_repeats_nor_skips(tiny_root, tmp_path):
    full = train(tiny_config(tiny_root, tmp_path / "a", *DET, "checkpoint.every_steps=1", "checkpoint.keep=100"))
    a = tmp_path / "a" / "tiny"
    b = tmp_path / "b" / "tiny"
    shutil.copytree(a, b)
    for p in ckpt.step_checkpoints(b):
        if int(p.stem.split("-")[1]) > 6:  # "crash" after step 6, mid-way through epoch 2
            p.unlink()
    (b / "summary.json").unlink()
    mid = ckpt.load(b / "ckpt-00000006.pt")["state"]
    reached = json.loads((b / "progress.json").read_text())
    # the mid-epoch checkpoint carries the wall time of its own step, not of the last epoch's end
    assert mid["wall_seconds"] > mid["history"][0]["wall_seconds"] > 0
    assert reached["step"] == 8 and reached["wall_seconds"] > mid["wall_seconds"]
    resumed = train(tiny_config(tiny_root, tmp_path / "b", *DET, "checkpoint.every_steps=1", "checkpoint.keep=100"))
    assert resumed["steps"] == full["steps"] == 8
    assert resumed["restarts"] == 1 and resumed["redone_steps"] == 2  # progress.json said step 8
    # steps 7 and 8's first run, thrown away: from the checkpoint's wall time to progress.json's
    assert resumed["lost_seconds"] == pytest.approx(reached["wall_seconds"] - mid["wall_seconds"], rel=1e-9)
    wa = ckpt.load(a / "ckpt-00000008.pt")["model"]
    wb = ckpt.load(b / "ckpt-00000008.pt")["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # the same samples, in the same order, once each


def test_damaged_newest_checkpoint_falls_back_to_previous(tiny_root, tmp_path):
    train(tiny_config(tiny_root, tmp_path, *DET, "checkpoint.every_steps=2", "checkpoint.keep=2"))
    run = tmp_path / "tiny"
    newest = run / "ckpt-00000008.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # truncated
    warnings = []
    state, path = ckpt.load_latest(run, warn=warnings.append)
    assert path.name == "ckpt-00000006.pt" and state["state"]["step"] == 6
    assert len(warnings) == 1 and "ckpt-00000008.pt' is damaged: sha256" in warnings[0]
    # A resumed run with a longer schedule (a change that checkpoint.resume=force accepts and records) starts
    # from step 6 and finishes the plan.
    more = ("run.deterministic=true", "phases=[{epochs: 3, image_size: 32, batch_size: 12}]")
    summary = train(tiny_config(tiny_root, tmp_path, *more, "checkpoint.every_steps=2", "checkpoint.resume=force"))
    assert summary["steps"] == 12 and summary["epochs"] == 3
    assert summary["resume_forced"] == [{"step": 6, "differences": ["phases.0.epochs: 2 -> 3"]}]


def test_nonfinite_loss_halts_naming_the_step(tiny_root, tmp_path):
    with pytest.raises(TrainingError, match=r"non-finite loss/gradients at step \d+ \(epoch 1"):
        train(tiny_config(tiny_root, tmp_path, "optim.lr=1e30", "optim.warmup_epochs=0"))


def test_nonfinite_loss_skip_mode_skips_and_counts(tiny_root, tmp_path, capsys):
    """lr=1e30: the non-finite steps are skipped and counted, but the finite ones blow the weights up, so the
    validation gets non-finite logits and reports no accuracy (it used to report one from NaN weights)."""
    with pytest.raises(NonFiniteError, match=r"validation: 20 of 20 images got non-finite logits"):
        train(tiny_config(tiny_root, tmp_path, "optim.lr=1e30", "run.on_nonfinite=skip"))
    assert "step skipped (1 so far; run.on_nonfinite=skip)" in capsys.readouterr().err


def test_nonfinite_cli_exit_code(tiny_root, tmp_path):
    args = [
        "train.py",
        "-c",
        "configs/base.yaml",
        f"data.root={tiny_root}",
        f"run.out_dir={tmp_path}",
        "model.name=resnet10t",
        "data.workers=0",
        "optim.lr=1e30",
        "phases=[{epochs: 1, image_size: 32, batch_size: 12}]",
    ]
    p = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 3
    assert "TrainingError: non-finite loss/gradients at step" in p.stderr and "Traceback" not in p.stderr


def test_unwritable_run_dir_fails_at_startup(tiny_root, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(CheckpointError, match="is not writable"):
        train(tiny_config(tiny_root, blocker))


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs (root only): a real full disk."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount tmpfs: {p.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_fails_at_startup(tiny_root, small_disk):
    with pytest.raises(CheckpointError, match=r"MiB free, but a checkpoint needs about"):
        train(tiny_config(tiny_root, small_disk))


def test_failed_checkpoint_write_keeps_last_good(small_disk):
    good = {"model": {"w": torch.ones(128, 1024)}}  # 0.5 MiB
    ckpt.save_step_checkpoint(good, small_disk, 1, keep=2)
    too_big = {"model": {"w": torch.ones(1024, 1024)}}  # 4 MiB: cannot fit
    with pytest.raises(CheckpointError, match=r"ckpt-00000002.pt' failed: No space left on device; the last good"):
        ckpt.save_step_checkpoint(too_big, small_disk, 2, keep=2)
    assert sorted(p.name for p in small_disk.iterdir()) == [
        "checkpoint.pt",
        "checkpoint.pt.sha256",
        "ckpt-00000001.pt",
        "ckpt-00000001.pt.sha256",
    ]
    assert torch.equal(ckpt.load(small_disk / "checkpoint.pt")["model"]["w"], good["model"]["w"])


# -- killed and hung workers under torchrun --------------------------------------------------------------------


# The restart mechanics on the tiny run (tests/tiny.yaml): 48 images, a global batch of 12 = 4 steps an epoch,
# 12 epochs; the quickstart's accuracy is test_distributed.py's and test_recipe_runs.py's claim, not these tests'.
TINY_LONG = ["phases=[{epochs: 12, image_size: 32, batch_size: 12}]"]
TINY_STEPS = 48


def _start_torchrun(run_dir: Path, root: Path, extra: list[str], max_restarts: int) -> subprocess.Popen:
    args = ["-c", "tests/tiny.yaml", "--run-dir", str(run_dir), f"data.root={root}", *TINY_LONG, *extra]
    return start_torchrun(max_restarts, *args)


@pytest.mark.slow
def test_sigkill_of_a_worker_restarts_and_finishes(tiny_root, tmp_path):
    run = tmp_path / "run"
    proc = _start_torchrun(run, tiny_root, ["checkpoint.every_steps=5"], max_restarts=3)
    try:
        wait_for_step(run, proc, 22, timeout=600)  # epoch 6 of 12, after the step-20 checkpoint
        victim = worker_pid(proc.pid, 1)
        assert victim, "rank 1 not found"
        os.kill(victim, signal.SIGKILL)
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == TINY_STEPS  # the same number of optimizer steps as an uninterrupted run
    assert summary["restarts"] == 1 and 0 <= summary["redone_steps"] <= 9
    assert "restart 1 after a failure" in out and "step(s) will be redone" in out


@pytest.mark.slow
def test_hung_peer_fails_with_timeout_naming_the_collective(tiny_root, tmp_path):
    run = tmp_path / "run"
    proc = _start_torchrun(run, tiny_root, ["dist.timeout_s=10"], max_restarts=0)
    victim = None
    try:
        wait_for_step(run, proc, 5, timeout=600)
        victim = worker_pid(proc.pid, 1)
        assert victim, "rank 1 not found"
        os.kill(victim, signal.SIGSTOP)
        t0 = time.time()
        out, err = proc.communicate(timeout=240)
        took = time.time() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    # Rank 0 waits in whichever collective of the loop it reached when rank 1 stopped: the step's gradient allreduce,
    # the preemption check of the log window (every step here), or validation's. The error names it.
    named = re.search(r"TrainingError: (.+?) at step \d+ failed: a peer is dead or hung \(dist.timeout_s=10\)", err)
    assert named, err[-3000:]
    assert named[1].startswith(("gradient allreduce (comm.backend=ddp)", "preemption check", "validation")), named[1]
    assert took < 120
    time.sleep(1)
    alive = victim is not None and Path(f"/proc/{victim}").exists()
    if alive:
        os.kill(victim, signal.SIGKILL)
    assert not alive, "the hung worker was left behind"


@pytest.mark.slow
def test_sigkill_through_the_launcher_with_two_local_hosts(tiny_root, tmp_path):
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("host-a addr=127.0.0.1\nhost-b addr=127.0.0.1\n")
    run = tmp_path / "run"
    cmd = [
        sys.executable,
        "scripts/launch.py",
        "--hostfile",
        str(hostfile),
        "--transport",
        "local",
        "--gpus-per-host",
        "1",
        "--port",
        str(free_port()),
        "--run-dir",
        str(run),
        "--max-restarts",
        "3",
        "--timeout",
        "1200",
        "-c",
        "tests/tiny.yaml",
        f"data.root={tiny_root}",
        *TINY_LONG,
        "checkpoint.every_steps=5",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        wait_for_step(run, proc, 22, timeout=600)
        victim = worker_pid(proc.pid, 1)
        assert victim, "rank 1 not found"
        os.kill(victim, signal.SIGKILL)
        out, _ = proc.communicate(timeout=1200)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-4000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == TINY_STEPS
    assert summary["restarts"] == 1
    # Rank 0's agent may not be the one that restarted (TORCHELASTIC_RESTART_COUNT is per agent), but it resumed.
    assert "step(s) will be redone" in out and "launch: all 2 host(s) finished" in out
