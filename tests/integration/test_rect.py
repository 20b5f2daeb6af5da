"""Rectangular validation plan (data/rect.py): aspect-ratio batches, shapes, rank split."""

from __future__ import annotations

import numpy as np
import pytest

from base.errors import DataError
from data.rect import MULTIPLE, batch_shape, image_sizes, plan_rect_batches, rank_rect_batches


def _sizes(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(100, 600, n), rng.integers(100, 600, n)], axis=1)


def test_batches_group_by_aspect_ratio_and_cover_every_image_once():
    sizes = _sizes(103)
    batches = plan_rect_batches(sizes, batch_size=10, size=224)
    assert [len(b.indices) for b in batches] == [10] * 10 + [3]
    order = np.concatenate([b.indices for b in batches])
    assert sorted(order.tolist()) == list(range(103))
    aspect = sizes[order, 0] / sizes[order, 1]
    assert np.all(np.diff(aspect) >= 0)  # sorted by aspect ratio, so a batch holds similar shapes
    for b in batches:
        assert min(b.height, b.width) == 224
        assert max(b.height, b.width) % MULTIPLE == 0 or b.height == b.width == 224
        mean = float((sizes[b.indices, 0] / sizes[b.indices, 1]).mean())
        assert b.width / b.height == pytest.approx(mean, rel=0.05)  # the batch's shape follows its mean ratio


def test_batch_shape_landscape_portrait_square():
    assert batch_shape(4 / 3, 288) == (288, 384)
    assert batch_shape(3 / 4, 288) == (384, 288)
    assert batch_shape(1.0, 100) == (100, 100)  # never below the validation size, even off the multiple


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_ranks_get_disjoint_batches_covering_the_set(world):
    batches = plan_rect_batches(_sizes(50), batch_size=8, size=64)
    seen = [i for r in range(world) for b in rank_rect_batches(batches, r, world) for i in b.indices.tolist()]
    assert sorted(seen) == list(range(50))


def test_image_sizes_reads_headers_and_names_a_bad_file(tiny_root, tmp_path):
    files = sorted(str(p) for p in (tiny_root / "val").rglob("*.JPEG"))[:3]
    sizes = image_sizes(files, threads=2)
    assert sizes.shape == (3, 2) and np.all(sizes >= 150) and np.all(sizes <= 500)
    bad = tmp_path / "empty.JPEG"
    bad.write_bytes(b"")
    with pytest.raises(DataError, match="empty.JPEG"):
        image_sizes([*files, str(bad)])
