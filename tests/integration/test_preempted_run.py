"""Preemption in a real run: SIGTERM stops it at a step boundary with a checkpoint and exit code 75; the rerun with
--resume ends with the weights of an uninterrupted run. (Two ranks under torchrun:
tests/e2e/test_preempted_torchrun.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch
from support import ROOT, TINY_CONFIG, free_port, quiet_env

from recipes.rundir import checkpoint_files as ckpt
from recipes.rundir.checkpointer import Checkpointer
from recipes.rundir.outputs import RunOutputs
from train import main as train_main

DET = ["run.deterministic=true", "phases=[{epochs: 2, image_size: 32, batch_size: 12}]"]  # 4 steps per epoch


def _args(root, out) -> list[str]:
    return ["-c", str(TINY_CONFIG), f"data.root={root}", f"run.out_dir={out}", *DET]


def _signal_at(monkeypatch, step: int, during_save: bool = False) -> None:
    """SIGTERM to this process when progress.json reaches `step` (and once more inside the next checkpoint save)."""
    progress, save = RunOutputs.progress, Checkpointer.save

    def on_progress(self, s, epoch, *window):
        progress(self, s, epoch, *window)
        if s == step:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_save(self, s):
        if during_save:
            os.kill(os.getpid(), signal.SIGTERM)  # a second signal: must not cut the save short
        save(self, s)

    monkeypatch.setattr(RunOutputs, "progress", on_progress)
    monkeypatch.setattr(Checkpointer, "save", on_save)


@pytest.fixture
def handlers():
    """train.py's exit path after a preemption ignores SIGTERM/SIGINT: put pytest's handlers back afterwards."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def _weights(run_dir) -> dict:
    return ckpt.load(run_dir / "checkpoint.pt")["model"]


def test_sigterm_mid_epoch_saves_exits_75_and_the_resume_ends_bit_identical(
    tiny_root, tmp_path, monkeypatch, capsys, handlers
):
    assert train_main(_args(tiny_root, tmp_path / "a")) == 0
    with monkeypatch.context() as m:
        _signal_at(m, 3, during_save=True)
        assert train_main(_args(tiny_root, tmp_path / "b")) == 75
    err = capsys.readouterr().err
    line = "preempted: stopped by SIGTERM at step 3 (epoch 1, 3 step(s) into it): checkpoint of step 3 in"
    assert line in err and "Traceback" not in err
    run = tmp_path / "b" / "tiny"
    st = ckpt.load(run / "checkpoint.pt")["state"]
    assert (st["step"], st["epoch"], st["epoch_step"]) == (3, 0, 3)
    assert not (run / "summary.json").exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # leaving: torchrun's SIGTERM must not kill it now
    assert train_main([*_args(tiny_root, tmp_path / "b"), "--resume"]) == 0
    wa, wb = _weights(tmp_path / "a" / "tiny"), _weights(run)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_sigterm_in_an_epochs_last_step_stops_after_its_validation(tiny_root, tmp_path, monkeypatch, capsys, handlers):
    with monkeypatch.context() as m:
        _signal_at(m, 4)
        assert train_main(_args(tiny_root, tmp_path)) == 75
    assert "stopped by SIGTERM at step 4 (epoch 2, 0 step(s) into it)" in capsys.readouterr().err
    st = ckpt.load(tmp_path / "tiny" / "checkpoint.pt")["state"]
    assert (st["step"], st["epoch"], st["epoch_step"], len(st["history"])) == (4, 1, 0, 1)


AGREE = """
import os, signal, torch, torch.distributed as td
from recipes.distributed import DistInfo
from recipes.preemption import StopSignal
td.init_process_group("gloo")
rank = td.get_rank()
stop = StopSignal()
stop.install()
first = stop.agreed(DistInfo(rank, 2, rank, 2, torch.device("cpu")), 1, 30)
if rank == 1:
    os.kill(os.getpid(), signal.SIGTERM)
print(first, stop.agreed(DistInfo(rank, 2, rank, 2, torch.device("cpu")), 2, 30), flush=True)
td.destroy_process_group()
"""


def test_a_signal_on_one_rank_stops_every_rank():
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", AGREE],
            cwd=ROOT,
            env=quiet_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(r), WORLD_SIZE="2"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [o.strip() for o, _ in outs] == ["False True", "False True"]
