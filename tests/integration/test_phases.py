"""Progressive-resizing phases: the schedule as data, and every backend feeding it batch-exactly."""

from __future__ import annotations

import math

import pytest
import torch
from support import ROOT, input_args, tiny_config, torchrun

from base import registry
from data import create_input
from recipes.config import load_config
from recipes.distributed import DistInfo
from recipes.schedule import Schedule

RECORD = """
extends: {base}
data:
  roots: {{160: /imagenet-160, full: /imagenet}}
phases:
  #  epochs  size  global batch            (the 2020 record: 28 epochs, 1159 iterations on 128 GPUs)
  - {{epochs: 13, image_size: 96,  batch_size: 32768, root: '160'}}
  - {{epochs: 11, image_size: 128, batch_size: 32768, root: '160'}}
  - {{epochs: 3,  image_size: 224, batch_size: 32768}}
  - {{epochs: 1,  image_size: 288, batch_size: 16384, rect_val: true}}
"""


def test_record_schedule_reads_as_data_and_gives_its_1159_iterations(tmp_path):
    path = tmp_path / "record.yaml"
    path.write_text(RECORD.format(base=ROOT / "configs" / "base.yaml"))
    cfg = load_config(path)
    assert cfg.data.roots == {"160": "/imagenet-160", "full": "/imagenet"}
    assert [p.root for p in cfg.phases] == ["160", "160", "full", "full"]
    assert [p.rect_val for p in cfg.phases] == [False, False, False, True]
    plan = Schedule(cfg.phases, cfg.optim, num_images=1281167, world_size=128)
    shard = math.ceil(1281167 / 128)
    assert [e.phase.image_size for e in plan.epochs] == [96] * 13 + [128] * 11 + [224] * 3 + [288]
    assert [e.steps for e in plan.epochs] == [math.ceil(shard / 256)] * 27 + [math.ceil(shard / 128)]
    assert plan.total_steps == 1159
    assert plan.image_size(0) == 96 and plan.image_size(1158) == 288 and plan.batch_size(1158) == 16384
    assert plan.image_size(plan.epochs[13].first_step) == 128 and plan.image_size(plan.epochs[13].first_step - 1) == 96


@pytest.mark.parametrize("backend", list(registry.INPUT_PIPELINES))
def test_every_backend_gives_the_plans_steps_at_each_phases_size(tiny_root, tmp_path, backend):
    world = 5  # 48 images: shards of 10 and 9, so a rank's last batch wraps around
    phases = (
        "phases=[{epochs: 1, image_size: 16, batch_size: 10}, {epochs: 2, image_size: 24, batch_size: 20, "
        "val_image_size: 20}]"
    )
    cfg = tiny_config(
        tiny_root, tmp_path, f"data.backend={backend}", "data.synthetic_size=48", "data.synthetic_classes=4", phases
    )
    for rank in range(world):
        pipe = create_input(cfg.data, DistInfo(rank, world, 0, world, torch.device("cpu")), **input_args(cfg))
        plan = Schedule(cfg.phases, cfg.optim, num_images=pipe.num_train, world_size=world)
        assert [e.steps for e in plan.epochs] == [5, 3, 3]  # ceil(ceil(48/5) / (batch/5))
        for info in plan.epochs:
            batches = list(pipe.train_batches(info))
            assert len(batches) == info.steps
            size, local = info.phase.image_size, info.phase.batch_size // world
            assert all(x.shape[1:] == (3, size, size) and x.shape[0] == y.shape[0] <= local for x, y in batches)
            assert batches[0][0].shape[0] == local
        resumed = plan.epochs[1]  # resumed after its first step: the rest of the epoch, batch-exact
        assert sum(1 for _ in pipe.train_batches(resumed, start_step=1)) == resumed.steps - 1
        val = list(pipe.val_batches(cfg.phases[1]))
        assert all(x.shape[1:] == (3, 20, 20) for x, _ in val)
        pipe.close()


@pytest.mark.slow
def test_dali_training_switches_phases_under_torchrun(tiny_root, tmp_path):
    """2 processes, DALI on the CPU, a phase switch with rectangular validation: exact counts end to end."""
    args = [
        "train.py",
        "-c",
        "configs/base.yaml",
        f"data.root={tiny_root}",
        f"run.out_dir={tmp_path}",
        "run.name=dali",
        "run.threads=1",
        "model.name=resnet10t",
        "data.backend=dali",
        "data.val_batch_size=6",
        "log.tensorboard=false",
        "optim.lr=0.1",
        "phases=[{epochs: 1, image_size: 32, batch_size: 12}, {epochs: 1, image_size: 48, batch_size: 8,"
        " val_image_size: 40, rect_val: true}]",
    ]
    proc = torchrun(2, args, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    state = torch.load(tmp_path / "dali" / "checkpoint.pt", weights_only=True)["state"]
    assert [h["val_count"] for h in state["history"]] == [20, 20]  # every validation image once, no padding
    assert state["step"] == math.ceil(24 / 6) + math.ceil(24 / 4)  # the plan's steps, per phase
