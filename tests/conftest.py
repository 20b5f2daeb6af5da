"""Fixtures only: the generated datasets and the tiny run's checkpoint (helpers are in tests/support.py)."""

from __future__ import annotations

import os

# Under pytest-xdist (make test) two workers share the cores: torch's OpenMP threads sleep when idle instead of
# spinning, so a worker's two-thread training does not spin on a core the other worker's run needs (set before any
# import of torch; the tests' subprocesses inherit it).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from support import register_two_layer, tiny_config  # noqa: E402

from data.make_sample import main as make_sample  # noqa: E402


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


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_root, tmp_path_factory) -> Path:
    """checkpoint.pt of resnet10t trained 2 epochs on `tiny_root` at 32 px (evaluation and inference tests)."""
    from recipes.trainer import train

    out = tmp_path_factory.mktemp("tiny_ckpt")
    train(tiny_config(tiny_root, out))
    return out / "tiny" / "checkpoint.pt"


@pytest.fixture()
def two_layer_model(monkeypatch) -> str:
    """model.name of a conv-BN-linear network for this test (tests/support.py TWO_LAYER)."""
    return register_two_layer(monkeypatch)
