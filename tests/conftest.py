"""Shared fixtures: a generated sample dataset, small configs, and a helper to run torchrun for real."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from data.make_sample import main as make_sample  # noqa: E402
from recipes.config import load_config  # noqa: E402


@pytest.fixture(scope="session")
def sample_root(tmp_path_factory) -> Path:
    """The quickstart's dataset (10 classes, 80 train / 20 val each, plus the odd files)."""
    out = tmp_path_factory.mktemp("sample")
    make_sample(["--out", str(out), "--odd"])
    return out


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    """A small dataset for fast tests: 4 classes, 12 train / 5 val each (20 val: not divisible by 3)."""
    out = tmp_path_factory.mktemp("tiny")
    make_sample(["--out", str(out), "--classes", "4", "--train-per-class", "12", "--val-per-class", "5"])
    return out


def tiny_config(root: Path, out_dir: Path, *overrides: str):
    """A config that trains in seconds on CPU: resnet10t at 32 px, 2 epochs."""
    return load_config(
        ROOT / "configs" / "base.yaml",
        [
            f"data.root={root}",
            f"run.out_dir={out_dir}",
            "run.name=tiny",
            "run.threads=1",
            "model.name=resnet10t",
            "data.workers=0",
            "data.val_batch_size=8",
            "log.tensorboard=false",
            "log.every_steps=1",
            "optim.lr=0.1",
            "phases=[{epochs: 2, image_size: 32, batch_size: 12}]",
            *overrides,
        ],
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, args: list[str], timeout: float = 600, env: dict | None = None, cwd: Path = ROOT):
    """Run `torchrun --nproc-per-node nproc <args>` for real; returns the CompletedProcess."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        *args,
    ]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_root, tmp_path_factory) -> Path:
    """checkpoint.pt of resnet10t trained 2 epochs on `tiny_root` at 32 px (evaluation and inference tests)."""
    from recipes.trainer import train

    out = tmp_path_factory.mktemp("tiny_ckpt")
    train(tiny_config(tiny_root, out))
    return out / "tiny" / "checkpoint.pt"
