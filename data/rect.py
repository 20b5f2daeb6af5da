"""Rectangular validation (fast.ai's ImageNet in 18 minutes; the record's last phase): no center crop.

The validation images are sorted by aspect ratio (width / height) and cut into batches; every image of a batch
is resized, without cropping, to the batch's shape: the shorter side is the validation size, the longer side
follows the batch's mean aspect ratio, rounded to a multiple of 8. Batches are dealt to the ranks round-robin,
so the ranks read disjoint images that cover the set, each exactly once, with no padding. Both the torch and
the dali backends use this plan.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from PIL import UnidentifiedImageError

from base.errors import DataError
from data.check import header_size

MULTIPLE = 8  # the longer side is a multiple of this (friendlier to convolution kernels)


@dataclass(frozen=True)
class RectBatch:
    indices: np.ndarray  # into the split's files
    height: int
    width: int


def _size(path: str) -> tuple[int, int]:
    try:
        return header_size(path)  # the header only, however large the image says it is
    except (OSError, UnidentifiedImageError, ValueError) as e:
        raise DataError(f"cannot read the size of '{path}' for rectangular validation: {e}") from None


def image_sizes(files: list[str], threads: int = 4) -> np.ndarray:
    """(n, 2) array of (width, height) read from the image headers."""
    with ThreadPoolExecutor(max(1, threads)) as pool:
        return np.array(list(pool.map(_size, files, chunksize=256)), dtype=np.int64).reshape(-1, 2)


def batch_shape(aspect: float, size: int) -> tuple[int, int]:
    """(height, width) of a batch whose mean aspect ratio (w / h) is `aspect`; the shorter side is `size`."""
    if aspect >= 1.0:
        return size, max(size, int(round(size * aspect / MULTIPLE)) * MULTIPLE)
    return max(size, int(round(size / aspect / MULTIPLE)) * MULTIPLE), size


def plan_rect_batches(sizes: np.ndarray, batch_size: int, size: int) -> list[RectBatch]:
    """All validation batches: images sorted by aspect ratio, `batch_size` per batch (the last may be short)."""
    aspect = sizes[:, 0] / sizes[:, 1]
    order = np.argsort(aspect, kind="stable")
    batches = []
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        h, w = batch_shape(float(aspect[idx].mean()), size)
        batches.append(RectBatch(idx, h, w))
    return batches


def rank_rect_batches(batches: list[RectBatch], rank: int, world: int) -> list[RectBatch]:
    """This rank's batches (round-robin): disjoint across ranks, together every image exactly once."""
    return batches[rank::world]
