"""The torch input backend and the sharding rule shared by all backends."""

from __future__ import annotations

import numpy as np
import torch
from support import input_args, tiny_config

from data import create_input
from data.sharding import train_shard, val_shard
from recipes.distributed import DistInfo
from recipes.schedule import Schedule


def dist(rank=0, world=1):
    return DistInfo(rank, world, rank, world, torch.device("cpu"))


def test_train_shards_are_disjoint_cover_and_equal_length():
    for n, world in [(48, 3), (50, 4), (7, 2)]:
        shards = [train_shard(n, r, world, epoch=1, seed=0) for r in range(world)]
        assert len({len(s) for s in shards}) == 1
        allidx = np.concatenate(shards)
        assert set(allidx.tolist()) == set(range(n))
        assert len(allidx) - len(set(allidx.tolist())) == (-n) % world  # padding only
    assert not np.array_equal(train_shard(48, 0, 2, 0, 0), train_shard(48, 0, 2, 1, 0))  # reshuffled per epoch


def test_val_shards_count_every_image_once():
    for n, world in [(20, 3), (200, 7), (5, 8)]:
        allidx = np.concatenate([val_shard(n, r, world) for r in range(world)])
        assert sorted(allidx.tolist()) == list(range(n))


def test_torch_batches_shapes_steps_and_labels(tiny_root, tmp_path):
    cfg = tiny_config(tiny_root, tmp_path, "phases=[{epochs: 1, image_size: 40, batch_size: 10}]")
    pipe = create_input(cfg.data, dist(1, 2), **input_args(cfg))
    plan = Schedule(cfg.phases, cfg.optim, num_images=pipe.num_train, world_size=2)
    info = plan.epoch_info(0)
    batches = list(pipe.train_batches(info))
    assert len(batches) == info.steps == 5  # 24 images per rank, local batch 5
    x, y = batches[0]
    assert x.shape == (5, 3, 40, 40) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert -3 < float(x.mean()) < 3 and float(x.std()) > 0.1  # normalized, not raw 0..255
    assert set(torch.cat([b[1] for b in batches]).tolist()) <= set(range(4))
    val = list(pipe.val_batches(cfg.phases[0]))
    assert sum(len(v[1]) for v in val) == len(range(1, 20, 2))
    assert pipe.classes == sorted(p.name for p in (tiny_root / "train").iterdir())


def test_augmentation_is_deterministic_per_epoch(tiny_root, tmp_path):
    cfg = tiny_config(tiny_root, tmp_path)
    pipe = create_input(cfg.data, dist(), **input_args(cfg))
    info = Schedule(cfg.phases, cfg.optim, num_images=pipe.num_train, world_size=1).epoch_info(0)
    a = next(iter(pipe.train_batches(info)))[0]
    b = next(iter(pipe.train_batches(info)))[0]
    assert torch.equal(a, b)


def test_odd_files_decode_as_rgb(sample_root, tmp_path):
    from data.transforms import load_rgb

    for f in (sample_root / "train").rglob("*_odd_*.JPEG"):
        img = load_rgb(str(f))
        assert img.mode == "RGB" and img.width >= 150


def test_unreadable_class_folder_is_a_data_error(tiny_root, monkeypatch):
    """(Root reads any folder, so the PermissionError an ordinary user gets is raised by hand.)"""
    from pathlib import Path

    import pytest

    from base.errors import DataError
    from data.folder import scan_split

    victim = sorted((tiny_root / "train").iterdir())[1]
    real = Path.iterdir

    def iterdir(self):
        if self == victim:
            raise PermissionError(13, "Permission denied")
        return real(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    with pytest.raises(DataError) as e:
        scan_split(tiny_root, "train")
    assert str(e.value) == f"cannot list '{victim}': Permission denied"
