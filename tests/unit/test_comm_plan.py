"""The fusion plan: balanced contiguous buckets, slices, communicator assignment, the cross-rank digest."""

from __future__ import annotations

import itertools
import random

import pytest
import timm
import torch
from torch import nn

from recipes.comm.plan import (
    Settings,
    TensorSpec,
    balanced_buckets,
    build_plan,
    grad_specs,
    split_even,
)


@pytest.fixture(scope="module")
def resnet50_specs():
    with torch.device("meta"):
        model = timm.create_model("resnet50")
    return grad_specs(model)[0]


def test_resnet50_gradient_list(resnet50_specs):
    assert len(resnet50_specs) == 161
    assert sum(s.numel for s in resnet50_specs) == 25_557_032
    # gradient-ready order is reverse registration: the classifier comes first, the stem last
    assert resnet50_specs[0].name == "fc.bias" and resnet50_specs[-1].name == "conv1.weight"


@pytest.mark.parametrize("target_mb", [1, 4, 8, 25, 50])
def test_buckets_cover_every_gradient_in_order(resnet50_specs, target_mb):
    plan = build_plan(resnet50_specs, Settings(target_mb, 2, 2))
    assert [i for b in plan.buckets for i in b] == list(range(161))
    assert sum(plan.bucket_bytes(b) for b in range(len(plan.buckets))) == plan.total_bytes == 25_557_032 * 4


def test_buckets_are_balanced_around_the_target(resnet50_specs):
    total_mb = 25_557_032 * 4 / 2**20
    for target in (16, 25, 50):
        plan = build_plan(resnet50_specs, Settings(target, 1, 1))
        sizes = [plan.bucket_bytes(b) / 2**20 for b in range(len(plan.buckets))]
        assert len(sizes) == round(total_mb / target)
        assert max(sizes) - min(sizes) < 0.5 * target, sizes  # balanced, unlike a greedy cap (which leaves a stub)
    # below the largest tensor (9 MB), big tensors travel alone and small ones are fused, never in tiny buckets
    plan = build_plan(resnet50_specs, Settings(4, 1, 1))
    sizes = [plan.bucket_bytes(b) / 2**20 for b in range(len(plan.buckets))]
    assert min(sizes) > 3.5 and max(sizes) <= 9.01


def _brute_force_cost(sizes: list[int], target: int) -> int:
    best = None
    for cuts in itertools.product([0, 1], repeat=len(sizes) - 1):
        cost, acc = 0, sizes[0]
        for size, cut in zip(sizes[1:], cuts, strict=True):
            if cut:
                cost += (acc - target) ** 2
                acc = 0
            acc += size
        cost += (acc - target) ** 2
        best = cost if best is None else min(best, cost)
    return best


def test_bucket_cuts_are_optimal():
    rng = random.Random(5)
    for _ in range(30):
        sizes = [rng.choice([4, 40, 400, 4000, 36000]) * rng.randint(1, 3) for _ in range(rng.randint(1, 9))]
        target = rng.choice([100, 1000, 10000, 50000])
        buckets = balanced_buckets(sizes, ["float32"] * len(sizes), target)
        cost = sum((sum(sizes[i] for i in b) - target) ** 2 for b in buckets)
        assert cost == _brute_force_cost(sizes, target)


def test_dtype_change_forces_a_cut():
    buckets = balanced_buckets([10, 10, 10, 10], ["float32", "float32", "float16", "float16"], 1000)
    assert buckets == [[0, 1], [2, 3]]


def test_split_even_gives_unequal_slices_of_at_most_one_element():
    for n, s in [(10, 3), (7, 4), (145, 2), (3, 4), (1, 1), (100, 1)]:
        bounds = split_even(n, s)
        lengths = [hi - lo for lo, hi in bounds]
        assert bounds[0][0] == 0 and bounds[-1][1] == n and sum(lengths) == n
        assert all(bounds[i][1] == bounds[i + 1][0] for i in range(len(bounds) - 1))
        assert max(lengths) - min(lengths) <= 1 and min(lengths) >= 1
        assert len(bounds) == min(s, n)
    assert [hi - lo for lo, hi in split_even(10, 3)] == [4, 3, 3]


def test_slice_j_of_bucket_b_goes_to_communicator_b_s_plus_j_mod_k():
    specs = [TensorSpec(f"t{i}", (1000,), "float32") for i in range(6)]
    plan = build_plan(specs, Settings(4000 / 2**20, 3, 2))  # one tensor per bucket
    assert len(plan.buckets) == 6
    got = [[plan.communicator(b, j) for j in range(2)] for b in range(6)]
    assert got == [[0, 1], [2, 0], [1, 2], [0, 1], [2, 0], [1, 2]]
    # every communicator carries the same number of slices: the load is spread evenly
    assert sorted(k for row in got for k in row) == [0] * 4 + [1] * 4 + [2] * 4


def test_digest_identifies_the_plan():
    model = nn.Sequential(nn.Linear(10, 20), nn.BatchNorm1d(20), nn.Linear(20, 3))
    specs = grad_specs(model)[0]
    base = build_plan(specs, Settings(0.0003, 2, 2))
    assert base.digest() == build_plan(grad_specs(model)[0], Settings(0.0003, 2, 2)).digest()
    variants = [
        build_plan(specs, Settings(0.0003, 3, 2)),
        build_plan(specs, Settings(0.0003, 2, 3)),
        build_plan(specs, Settings(0.0003, 2, 2), "fp16"),
        build_plan(specs, Settings(100, 2, 2)),
        build_plan(
            grad_specs(nn.Sequential(nn.Linear(10, 21), nn.BatchNorm1d(21), nn.Linear(21, 3)))[0],
            Settings(0.0003, 2, 2),
        ),
    ]
    assert len({base.digest(), *(v.digest() for v in variants)}) == 6


def test_build_plan_rejects_bad_input():
    specs = [TensorSpec("w", (4,), "float32")]
    with pytest.raises(ValueError, match="compression"):
        build_plan(specs, Settings(1, 1, 1), "int8")
    with pytest.raises(ValueError, match="no trainable parameters"):
        build_plan([], Settings(1, 1, 1))
    with pytest.raises(ValueError, match="invalid multistream settings"):
        build_plan(specs, Settings(1, 0, 1))
