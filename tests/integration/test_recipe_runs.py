"""End-to-end runs of the recipe pieces on CPU: fp16 skipped steps counted and logged, hybrid quickstart to target."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import ROOT, tiny_config

from base.errors import NonFiniteError
from recipes.trainer import train


def test_fp16_skipped_steps_are_counted_and_logged(tiny_root, tmp_path, capsys):
    # An absurd LR makes the first step blow the weights up; every later step has inf/nan gradients, so the
    # grad scaler skips it and halves the scale: 4 steps -> 1 taken, 3 skipped, scale 65536 / 2**3.
    cfg = tiny_config(
        tiny_root,
        tmp_path,
        "run.amp=fp16",
        "optim.name=hybrid",
        "optim.lr=1.0e30",
        "optim.warmup_start_lr=1.0e30",
        "optim.final_lr=1.0e30",
        "checkpoint.enabled=false",
        "phases.0.epochs=1",
    )
    # The one step taken left non-finite weights, so validation refuses to report an accuracy from them.
    with pytest.raises(NonFiniteError, match="no accuracy is reported"):
        train(cfg, tmp_path / "run")
    captured = capsys.readouterr()
    out, err = captured.out, captured.err
    for step, scale in [(1, 65536), (2, 32768), (3, 16384)]:
        assert f"step {step}: fp16 gradients overflowed; step skipped (scale {scale})" in err
    assert "step 0: fp16" not in err
    assert "param group 0 (weights): 15 tensors" in out and "adapt=True" in out


@pytest.mark.slow
def test_quickstart_with_hybrid_reaches_its_target(sample_root, tmp_path):
    run_dir = tmp_path / "qs"
    cmd = [
        sys.executable,
        "train.py",
        "-c",
        "configs/quickstart.yaml",
        "--run-dir",
        str(run_dir),
        f"data.root={sample_root}",
        "optim.name=hybrid",
        "run.stop_at_target=true",
        "run.threads=2",
        "data.workers=0",
        "log.tensorboard=false",
        "checkpoint.enabled=false",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "optimizer hybrid" in proc.stdout and "param group 1 (bn_bias)" in proc.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["target_top1"] == 90.0
    assert summary["time_to_target_seconds"] is not None, proc.stdout[-3000:]
    assert summary["final_top1"] >= 90.0 and summary["epochs"] <= 9
    tsv = (run_dir / "dawnbench.tsv").read_text().splitlines()
    assert len(tsv) == summary["epochs"] + 1 and float(tsv[-1].split("\t")[2]) >= 90.0
