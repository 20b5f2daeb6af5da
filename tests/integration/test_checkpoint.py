"""Checkpoint loading is safe: a file that would run code when unpickled is refused (evaluate.py, --resume and the
automatic resume), a malformed one is named, and no accuracy is reported from non-finite weights or logits."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch
from support import ROOT, tiny_config

import evaluate
from base.errors import NonFiniteError
from recipes.distributed import DistInfo
from recipes.evaluation.accuracy import evaluate as evaluate_model
from recipes.rundir import checkpoint_files as ckpt


class _RunsCode:
    """Unpickling this calls os.system: what a planted checkpoint in a shared run directory would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def plant(path, marker, base: dict | None = None) -> None:
    state = dict(base or {"model": {}})
    state["payload"] = _RunsCode(marker)
    torch.save(state, path)


def cli(*args, timeout=300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_rng_state_round_trips_through_a_weights_only_load(tmp_path):
    import random

    import numpy as np

    state = ckpt.rng_state()
    ckpt.save_atomic({"model": {}, "rng": [state]}, tmp_path / "c.pt")
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    ckpt.set_rng_state(ckpt.load(tmp_path / "c.pt")["rng"][0])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_evaluate_refuses_a_code_running_checkpoint(tiny_checkpoint, tiny_root, tmp_path):
    marker = tmp_path / "ran"
    planted = tmp_path / "planted.pt"
    plant(planted, marker, ckpt.load(tiny_checkpoint))
    p = cli("evaluate.py", str(planted), "--data", str(tiny_root))
    assert p.returncode == 2 and not marker.exists()
    assert p.stderr.strip().splitlines() == [
        f"error: CheckpointError: checkpoint '{planted}' refused: it holds objects other than tensors and plain "
        "values (posix.system), which would run code when loaded"
    ]


def test_resume_refuses_a_code_running_checkpoint(tiny_root, tmp_path):
    marker = tmp_path / "ran"
    planted = tmp_path / "planted.pt"
    plant(planted, marker)
    p = cli(
        "train.py",
        "-c",
        "configs/base.yaml",
        "--run-dir",
        str(tmp_path / "run"),
        "--resume",
        str(planted),
        *_tiny_overrides(tiny_root, tmp_path),
    )
    assert p.returncode == 2 and not marker.exists(), p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith(f"error: CheckpointError: checkpoint '{planted}' refused")
    assert "Traceback" not in p.stderr


@pytest.mark.slow
def test_automatic_resume_skips_a_planted_newest_checkpoint(tiny_root, tmp_path):
    """A ckpt-<N>.pt with a higher N planted in the run directory is refused; the run resumes from the good one."""
    from recipes.trainer import train

    run_dir = tmp_path / "run"
    cfg = tiny_config(tiny_root, tmp_path, "checkpoint.keep=1")
    train(cfg, run_dir, stop_after_epochs=1)
    good = ckpt.step_checkpoints(run_dir)[0]
    marker = tmp_path / "ran"
    planted = run_dir / "ckpt-99999999.pt"
    plant(planted, marker, ckpt.load(good))
    p = cli("train.py", "-c", "configs/base.yaml", "--run-dir", str(run_dir), *_tiny_overrides(tiny_root, tmp_path))
    assert p.returncode == 0, p.stderr
    assert not marker.exists()
    assert f"warning: checkpoint '{planted}' refused: it holds objects other than tensors" in p.stderr + p.stdout
    assert f"resumed from {good}" in p.stderr + p.stdout


def _tiny_overrides(root, out) -> list[str]:
    return [
        f"data.root={root}",
        f"run.out_dir={out}",
        "run.threads=1",
        "model.name=resnet10t",
        "data.workers=0",
        "data.val_batch_size=8",
        "log.tensorboard=false",
        "phases=[{epochs: 2, image_size: 32, batch_size: 12}]",
        "checkpoint.keep=1",
    ]


@pytest.mark.parametrize(
    "state, message",
    [
        ({"model": 5}, ": entry 'model' must be a mapping of parameter names to tensors, got int"),
        ({"model": {"w": 5}}, ": entry 'model' must map names to tensors ('w' does not)"),
        ({"model": {}, "optimizer": [1]}, ": entry 'optimizer' must be an optimizer state_dict (a mapping), got list"),
        ({"model": {}, "config": "x"}, ": entry 'config' must be a config mapping, got str"),
        (
            {"model": {}, "ema": [1]},
            ": entry 'ema' must be a mapping of parameter names to tensors (the EMA weights, run.ema), got list",
        ),
        ({"model": {}, "ema": {"w": 5}}, ": entry 'ema' must map names to tensors ('w' does not)"),
        ([1, 2], " has no 'model' entry: not a checkpoint of this trainer"),
    ],
)
def test_malformed_checkpoint_is_named(tmp_path, tiny_root, capsys, state, message):
    torch.save(state, tmp_path / "bad.pt")
    assert evaluate.main([str(tmp_path / "bad.pt"), "--data", str(tiny_root)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"error: CheckpointError: checkpoint '{tmp_path / 'bad.pt'}'{message}"]


def test_resume_of_a_checkpoint_without_training_state_is_an_error(tiny_checkpoint, tiny_root, tmp_path):
    state = ckpt.load(tiny_checkpoint)
    del state["optimizer"]
    torch.save(state, tmp_path / "weights-only.pt")
    p = cli(
        "train.py",
        "-c",
        "configs/base.yaml",
        "--run-dir",
        str(tmp_path / "run"),
        "--resume",
        str(tmp_path / "weights-only.pt"),
        *_tiny_overrides(tiny_root, tmp_path),
    )
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1]  # the file, and the host and rank that read it
    assert last.startswith(f"error: CheckpointError: checkpoint '{tmp_path / 'weights-only.pt'} on host "), last
    assert last.endswith("' cannot be resumed: no 'optimizer' entry"), last


def test_no_accuracy_from_non_finite_weights_or_logits(tiny_checkpoint, tiny_root, tmp_path, capsys):
    state = ckpt.load(tiny_checkpoint)
    name = next(k for k, v in state["model"].items() if v.is_floating_point())
    state["model"][name] = torch.full_like(state["model"][name], float("nan"))
    torch.save(state, tmp_path / "nan.pt")
    assert evaluate.main([str(tmp_path / "nan.pt"), "--data", str(tiny_root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "non-finite values among" in err[0] and f"(first in '{name}')" in err[0]
    assert "top-1" not in capsys.readouterr().out

    class NaNModel(torch.nn.Module):
        def forward(self, x):
            out = torch.zeros(x.shape[0], 4)
            out[0, 0] = float("nan")
            return out

    one = DistInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, device=torch.device("cpu"))
    batches = [(torch.zeros(3, 3, 8, 8), torch.tensor([0, 1, 2]))]
    with pytest.raises(NonFiniteError, match="1 of 3 images got non-finite logits"):
        evaluate_model(NaNModel(), batches, one)
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_size_estimate_counts_every_ranks_bn_statistics():
    """A mid-epoch checkpoint of w ranks holds w copies of the BN running statistics
    (recipes/rundir/checkpointer.py)."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.BatchNorm2d(8))
    bn_bytes = 2 * 2 * 8 * 4  # two layers, mean and var, 8 float32 channels
    one, four = ckpt.estimate_bytes(model), ckpt.estimate_bytes(model, 4)
    assert abs((four - one) - 1.1 * 3 * bn_bytes) <= 1
