"""Errors a user reads: one import path per class, one `error:` line and the documented exit code."""

from __future__ import annotations

import argparse

import pytest
import torch

import recipes.trainer
from base.errors import CheckpointError, CommError, ConfigError, DeviceError, PlanMismatchError, TrainingError
from recipes.cli import run_cli
from recipes.config import load_config
from recipes.distributed import setup


def _args(**kw) -> argparse.Namespace:
    base = dict(help_config=False, config=None, overrides=[], print_config=False, plan=False, run_dir=None)
    base.update(resume=None, stop_after_epochs=None, world_size=None, num_images=None)
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize(
    "error", [CommError("gradient allreduce timed out after 5 s"), PlanMismatchError("rank 1 derived another plan")]
)
def test_comm_errors_are_training_errors_printed_as_one_line_with_exit_3(error, monkeypatch, tmp_path, capsys):
    assert isinstance(error, TrainingError)

    def fail(*_a, **_k):
        raise error

    monkeypatch.setattr(recipes.trainer, "train", fail)
    assert run_cli(_args(run_dir=str(tmp_path))) == 3
    err = capsys.readouterr().err
    assert err == f"error: {type(error).__name__}: {error}\n"


def test_cuda_without_cuda_is_a_device_error_a_user_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    cfg = load_config(None, ["run.device=cuda"])
    with pytest.raises(DeviceError, match="run.device: 'cuda' requested but no CUDA device is available"):
        setup(cfg, env={})
    assert issubclass(DeviceError, ConfigError)  # exit 2, like every config mistake


def test_a_checkpoint_that_does_not_fit_the_model_is_a_checkpoint_error():
    from models import create_model
    from models.factory import check_compatible
    from recipes.config import ModelConfig

    model = create_model(ModelConfig(name="resnet10t"), 4)
    with pytest.raises(CheckpointError, match="ck.pt: checkpoint was made for a different model"):
        check_compatible(model, {"fc.weight": torch.zeros(3, 3)}, "ck.pt")
