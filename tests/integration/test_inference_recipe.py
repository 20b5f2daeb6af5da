"""configs/dawnbench_inference_resnet26d.yaml: timm's AugMix views and RandAugment on the torch backend, the JSD
consistency loss, trained on CPU, and the DAWNBench inference entry from its checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from support import ROOT, input_args
from timm.loss import JsdCrossEntropy

import evaluate
from base.errors import ConfigError
from data import create_input
from recipes.config import load_config
from recipes.distributed import DistInfo
from recipes.schedule import Schedule
from recipes.trainer import Trainer, train

CONFIG = ROOT / "configs" / "dawnbench_inference_resnet26d.yaml"


def _short(root, out_dir, *extra):
    """The recipe as it is, cut to one 32 px epoch on CPU."""
    return load_config(
        CONFIG,
        [
            f"data.root={root}",
            f"run.out_dir={out_dir}",
            "run.amp=none",
            "run.channels_last=false",
            "run.threads=1",
            "run.target_top5=null",
            "data.workers=0",
            "data.val_batch_size=8",
            "log.tensorboard=false",
            "optim.warmup_epochs=0",
            "optim.lr=0.05",
            "phases=[{epochs: 1, image_size: 32, batch_size: 8}]",
            "dawnbench.author=Us",
            "dawnbench.author_email=us@example.org",
            *extra,
        ],
    )


def test_augmix_views_are_clean_first_then_randaugmented_and_seeded(tiny_root, tmp_path):
    cfg = _short(tiny_root, tmp_path)
    assert (cfg.model.name, cfg.data.backend, cfg.data.aug_splits) == ("resnet26d", "torch", 3)
    dist = DistInfo(0, 1, 0, 1, torch.device("cpu"))
    pipe = create_input(cfg.data, dist, **input_args(cfg))
    info = Schedule(cfg.phases, cfg.optim, num_images=pipe.num_train, world_size=1).epoch_info(0)
    x, y = next(iter(pipe.train_batches(info)))
    assert x.shape == (24, 3, 32, 32) and torch.equal(y, y[:8].repeat(3))  # [clean; aug 1; aug 2], labels repeated
    assert not torch.equal(x[:8], x[8:16]) and not torch.equal(x[8:16], x[16:])
    x2, _ = next(iter(create_input(cfg.data, dist, **input_args(cfg)).train_batches(info)))
    assert torch.equal(x, x2)  # the views depend only on (seed, epoch, sample)
    trainer = Trainer(cfg, run_dir=tmp_path / "t")
    try:
        assert isinstance(trainer.steps.criterion, JsdCrossEntropy) and trainer.steps.criterion.num_splits == 3
    finally:
        trainer.close()


def test_dali_is_refused_with_the_reason(tiny_root, tmp_path):
    with pytest.raises(ConfigError, match="timm's PIL augmentations run on data.backend=torch only"):
        _short(tiny_root, tmp_path, "data.backend=dali")
    with pytest.raises(ConfigError, match="data.aug_splits: expected 0"):
        _short(tiny_root, tmp_path, "data.aug_splits=1")


@pytest.mark.slow
def test_trains_on_cpu_and_evaluate_latency_writes_the_inference_entry(tiny_root, tmp_path, capsys):
    run_dir = tmp_path / "r26"
    summary = train(_short(tiny_root, tmp_path), run_dir=run_dir)
    assert summary["epochs"] == 1 and summary["steps"] == 6  # 48 images / 8: AugMix's views are not counted
    entry = tmp_path / "entry.json"
    threads = torch.get_num_threads()
    try:
        rc = evaluate.main(
            [
                str(run_dir / "checkpoint.pt"),
                "--data",
                str(tiny_root),
                "--latency",
                "--warmup",
                "1",
                "--threads",
                "1",
                "--entry",
                str(entry),
            ]
        )
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    e = json.loads(entry.read_text())
    real = json.loads((ROOT / "tests/data/dawnbench_entries/AlibabaCloud_resnet26d_ecs_npu_perseus.json").read_text())
    for key, value in real.items():
        if key == "codeURL":  # optional in the format
            continue
        assert key in e and (type(e[key]) is type(value) or {type(e[key]), type(value)} <= {int, float}), key
    assert e["model"] == real["model"] == "ResNet26d" and e["cost"] is None  # no --price-per-hour
    assert (e["author"], e["authorEmail"]) == ("Us", "us@example.org")
    assert e["misc"]["images"] == 20 and e["misc"]["all_validation_images"] is True  # every image, as the rules say
