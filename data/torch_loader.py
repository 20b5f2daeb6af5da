"""PyTorch input backend: PIL decode + torchvision ops in DataLoader workers, for users without DALI."""

from __future__ import annotations

import re
import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from base.errors import DataError
from data import transforms as T
from data.folder import Split
from data.pipeline import BasePipeline
from data.rect import image_sizes, plan_rect_batches, rank_rect_batches
from data.sharding import train_shard, val_shard
from data.transforms import load_rgb, normalize, rect_transform, val_transform


class _TrainSet(Dataset):
    """`transform(img, rng)` -> sample; timm's AugMixDataset replaces it with its first stage (crop and flip)."""

    max_pixels: int | None = None

    def __init__(self, split: Split, indices: np.ndarray, transform, seed: int, epoch: int, skip_corrupt: bool):
        self.split, self.indices, self.transform = split, indices, transform
        self.seed, self.epoch, self.skip_corrupt = seed, epoch, skip_corrupt

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        idx = int(self.indices[i])
        for attempt in range(len(self.split)):
            j = (idx + attempt) % len(self.split)
            try:
                img = load_rgb(self.split.files[j], self.max_pixels)
            except DataError as e:
                if not self.skip_corrupt:
                    raise
                print(f"warning: skipping corrupt file: {e}", file=sys.stderr)
                continue
            # Augmentation randomness depends only on (seed, epoch, sample): identical for any worker count
            # and after a resume.
            rng = np.random.default_rng([self.seed, self.epoch, idx])
            T.seed_global_random(rng)  # timm's augmentations (and AugMixDataset's views, drawn right after) use it
            return self.transform(img, rng), self.split.labels[j]
        raise DataError(f"no decodable image in '{self.split.root}'")


def _crop(img, rng, *, size: int, min_area: float):
    return T.crop_and_flip(img, size, min_area, rng)


class _ValSet(Dataset):
    max_pixels: int | None = None

    def __init__(self, split: Split, indices: np.ndarray, size: int, crop_ratio: float):
        self.split, self.indices, self.size, self.crop_ratio = split, indices, size, crop_ratio

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        j = int(self.indices[i])
        img = load_rgb(self.split.files[j], self.max_pixels)
        return val_transform(img, self.size, self.crop_ratio), self.split.labels[j]


class _RectValSet(Dataset):
    """Rectangular validation: items are (index, height, width) from the rank's batches of data/rect.py."""

    max_pixels: int | None = None

    def __init__(self, split: Split):
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, item: tuple[int, int, int]):
        j, h, w = item
        return rect_transform(load_rgb(self.split.files[j], self.max_pixels), h, w), self.split.labels[j]


def _worker_message(err: DataError) -> str:
    """The error's own line: a DataLoader worker's error arrives as 'Caught DataError in DataLoader worker process
    0.' followed by the worker's whole traceback, whose last line is the original 'module.DataError: message'."""
    lines = [ln for ln in str(err).splitlines() if ln.strip()]
    if len(lines) > 1 and lines[0].startswith("Caught "):
        return re.sub(r"^[\w.]*Error: ", "", lines[-1])
    return str(err)


class _DeviceBatches:
    """Iterates a DataLoader, moving each uint8 batch to the device and normalizing it there."""

    def __init__(self, loader: DataLoader, device: torch.device, channels_last: bool, steps: int):
        self.loader, self.device, self.channels_last, self.steps = loader, device, channels_last, steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        try:
            yield from self._batches()
        except DataError as e:
            raise DataError(_worker_message(e)) from None

    def _batches(self):
        for images, labels in self.loader:
            if isinstance(images, (list, tuple)):  # AugMix views: [clean; aug 1; ...], as timm's JsdCrossEntropy reads
                images, labels = torch.cat(images), labels.repeat(len(images))
            images = images.to(self.device, non_blocking=True)
            yield normalize(images, self.channels_last), labels.to(self.device, non_blocking=True)


class TorchPipeline(BasePipeline):
    """`data.backend: torch`."""

    def __init__(self, data, dist, run, train: Split, val: Split, roots: dict[str, tuple[Split, Split]]):
        super().__init__(
            data, dist, run, train.classes, num_train=len(train), num_val=len(val), val_excluded=val.excluded
        )
        self.train, self.val, self.roots = train, val, roots

    def _loader(self, dataset: Dataset, batch: int, seed: int, batch_sampler=None) -> DataLoader:
        workers = self.data_cfg.workers
        dataset.max_pixels = self.data_cfg.max_image_pixels
        return DataLoader(
            dataset,
            batch_size=batch if batch_sampler is None else 1,
            shuffle=False,
            batch_sampler=batch_sampler,
            num_workers=workers,
            pin_memory=self.dist.device.type == "cuda",
            drop_last=False,
            generator=torch.Generator().manual_seed(seed) if batch_sampler is None else None,
            prefetch_factor=4 if workers > 0 else None,
            multiprocessing_context="fork" if workers > 0 else None,
        )

    def train_batches(self, info, start_step: int = 0):
        phase = info.phase
        train, _ = self.roots.get(phase.root, (self.train, self.val))
        local = phase.batch_size // self.dist.world_size
        idx = train_shard(len(train), self.dist.rank, self.dist.world_size, info.epoch, self.run.seed)
        # Full batches only, as the DALI backend: the shard wraps around to fill the last one (a 1-image batch
        # would make BatchNorm fail, and the two backends would train on different batches).
        idx = np.resize(idx, info.steps * local)
        idx = idx[start_step * local :]  # resumed mid-epoch: skip done batches
        ds = self._train_set(train, idx, phase, info.epoch)
        loader = self._loader(ds, local, self.run.seed * 7919 + info.epoch)
        return _DeviceBatches(loader, self.dist.device, self.run.channels_last, len(loader))

    def _train_set(self, train: Split, idx: np.ndarray, phase, epoch: int) -> Dataset:
        """Crop and flip; then timm's RandAugment/AugMix (data.auto_augment), in AugMixDataset's views when
        data.aug_splits is set (the first view clean, as in timm's train.py with --aug-splits)."""
        from functools import partial

        import torchvision.transforms.functional as TF

        data = self.data_cfg
        crop = partial(_crop, size=phase.image_size, min_area=T.crop_min_area(phase))
        augment = T.timm_augmentation(data.auto_augment, phase.image_size) if data.auto_augment else None
        if data.aug_splits:
            from timm.data import AugMixDataset

            ds = _TrainSet(train, idx, None, self.run.seed, epoch, data.skip_corrupt)
            ds.transform = (crop, augment or (lambda img: img), TF.pil_to_tensor)
            ds.max_pixels = data.max_image_pixels  # the wrapper's attribute (set by _loader) does not reach it
            return AugMixDataset(ds, num_splits=data.aug_splits)

        def transform(img, rng):
            img = crop(img, rng)
            return TF.pil_to_tensor(augment(img) if augment else img)

        return _TrainSet(train, idx, transform, self.run.seed, epoch, data.skip_corrupt)

    def val_batches(self, phase):
        size = phase.val_image_size or phase.image_size
        if phase.rect_val:
            return self._rect_val_batches(size)
        idx = val_shard(len(self.val), self.dist.rank, self.dist.world_size)
        ds = _ValSet(self.val, idx, size, self.data_cfg.val_crop_ratio)
        loader = self._loader(ds, self.data_cfg.val_batch_size, 0)
        return _DeviceBatches(loader, self.dist.device, self.run.channels_last, len(loader))

    def _rect_val_batches(self, size: int):
        if getattr(self, "_val_sizes", None) is None:
            self._val_sizes = image_sizes(self.val.files, max(1, self.data_cfg.workers) * 2)
        batches = plan_rect_batches(self._val_sizes, self.data_cfg.val_batch_size, size)
        mine = rank_rect_batches(batches, self.dist.rank, self.dist.world_size)
        sampler = [[(int(j), b.height, b.width) for j in b.indices] for b in mine]
        loader = self._loader(_RectValSet(self.val), 1, 0, batch_sampler=sampler)
        return _DeviceBatches(loader, self.dist.device, self.run.channels_last, len(loader))
