"""The input pipeline interface: what the trainer and the evaluator ask of `data.create_input`.

A pipeline is named by `data.backend` in base/registry.py and built by `data.create_input`;
`BasePipeline` holds what every pipeline shares (the dataset's classes and sizes, given to its constructor) and
the no-op default of `close()`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sized
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class Batches(Sized, Iterable):
    """`len()` batches of (images, labels) on the device, normalized, this rank's share."""


@runtime_checkable
class InputPipeline(Protocol):
    num_classes: int
    classes: list[str]  # class names (wnids); label = index
    num_train: int  # training images of the whole dataset (all ranks)
    num_val: int
    val_excluded: int  # validation images left out by data.val_blacklist

    def train_batches(self, info, start_step: int = 0) -> Batches:
        """Exactly `info.steps - start_step` batches of epoch `info.epoch` (a `recipes.schedule.EpochInfo`),
        continuing at `start_step` after a mid-epoch resume; every rank gets the same number."""

    def val_batches(self, phase) -> Batches:
        """This rank's disjoint share of the validation set at `phase`'s resolution: every image exactly once
        over all ranks, no padding."""

    def close(self) -> None:
        """Release workers and device memory."""


@dataclass(frozen=True)
class RunContext:
    """What an input pipeline needs from outside the config's data section, named where `create_input` is called."""

    phases: list  # the schedule's phases: each one's epochs and dataset copy (`root`)
    seed: int  # run.seed: shuffling and augmentation
    channels_last: bool  # run.channels_last: the memory format of the batches
    amp: str  # run.amp: 'fp16' makes DALI hand over half-precision images on a GPU (data.dali_dtype=auto)


class BasePipeline:
    """The dataset's identity, set once by the constructor, and the no-op defaults of the interface. A pipeline whose
    record reads folders (base/registry.py `Input.reads_folders`) is built as Pipeline(data, dist, run, train,
    val, roots) from the scanned data.root; one that does not as Pipeline(data, dist, run)."""

    def __init__(
        self, data, dist, run: RunContext, classes: list[str], *, num_train: int, num_val: int, val_excluded=0
    ):
        """`data`: the config's data section; `run`: what the input needs from the rest of the config."""
        self.data_cfg, self.dist, self.run = data, dist, run
        self.val_excluded = val_excluded  # validation images left out (data.val_blacklist, skipped), not counted
        self.val_skipped = 0  # of those, undecodable files skipped (data.skip_corrupt)
        self.train_skipped = 0  # undecodable training files skipped (data.skip_corrupt); num_train still counts them
        self.classes = list(classes)
        self.num_classes = len(self.classes)
        self.num_train = num_train
        self.num_val = num_val

    def close(self) -> None:
        pass
