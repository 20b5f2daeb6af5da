"""DALI's prefetch depth and hardware-decoder load as config keys (defaults from NVIDIA's MLPerf ResNet-50 config for
DGX H100: 5 and 0.99), the executor that keeps the loader's work off the training thread, and the note when the
hardware-decoder load cannot apply (DALI on the CPU)."""

from __future__ import annotations

import pytest
import torch
from support import run_context, tiny_config

from base.errors import ConfigError
from data.dali_loader import DaliPipeline, _decoder_args
from data.folder import scan_split
from recipes.config import load_config
from recipes.distributed import DistInfo
from recipes.schedule import Schedule


def test_defaults_follow_nvidias_mlperf_config():
    cfg = load_config(None, ["data.backend=dali"])
    assert (cfg.data.dali_prefetch, cfg.data.dali_hw_decoder_load) == (5, 0.99)


def test_hw_decoder_load_outside_0_1_is_refused():
    with pytest.raises(ConfigError, match=r"data.dali_hw_decoder_load: expected a number in \[0, 1\], got 1.5"):
        load_config(None, ["data.dali_hw_decoder_load=1.5"])


def test_gpu_decoders_get_the_hardware_share_and_cpu_decoders_do_not():
    assert _decoder_args(True, 0.99) == {"device": "mixed", "hw_decoder_load": 0.99}
    assert _decoder_args(False, 0.99) == {"device": "cpu"}  # DALI's CPU decoder has no such argument


def _pipe(tiny_root, tmp_path, *overrides):
    cfg = tiny_config(
        tiny_root, tmp_path, "data.backend=dali", "phases=[{epochs: 1, image_size: 16, batch_size: 8}]", *overrides
    )
    train, val = scan_split(tiny_root, "train"), scan_split(tiny_root, "val")
    dist = DistInfo(0, 1, 0, 1, torch.device("cpu"))
    pipe = DaliPipeline(cfg.data, dist, run_context(cfg), train, val, {"full": (train, val)})
    return pipe, Schedule(cfg.phases, cfg.optim, num_images=len(train), world_size=1)


def test_the_training_pipeline_runs_pipelined_and_async_with_the_configured_prefetch(tiny_root, tmp_path, capsys):
    pipe, plan = _pipe(tiny_root, tmp_path, "data.dali_prefetch=3")
    batches = list(pipe.train_batches(plan.epoch_info(0)))
    assert len(batches) == plan.epoch_info(0).steps
    dali = pipe._train[1]
    assert (dali.prefetch_queue_depth, dali.exec_pipelined, dali.exec_async) == (3, True, True)
    list(pipe.val_batches(plan.epoch_info(0).phase))
    assert pipe._val[1].prefetch_queue_depth == 3
    pipe.close()
    assert "dali_hw_decoder_load" not in capsys.readouterr().err  # the default: nothing to say


def test_a_hardware_decoder_load_on_the_cpu_is_noted_as_ignored(tiny_root, tmp_path, capsys):
    pipe, plan = _pipe(tiny_root, tmp_path, "data.dali_hw_decoder_load=0.5")
    assert len(list(pipe.train_batches(plan.epoch_info(0)))) == plan.epoch_info(0).steps  # trains all the same
    pipe.close()
    err = capsys.readouterr().err
    assert "note: data.dali_hw_decoder_load=0.5 is ignored: DALI decodes on the CPU here" in err
