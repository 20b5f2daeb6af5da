"""Which samples each rank reads, and so how many steps an epoch has: the same rule for every input backend."""

from __future__ import annotations

import math

import numpy as np


def train_shard(num: int, rank: int, world: int, epoch: int, seed: int, shuffle: bool = True) -> np.ndarray:
    """Rank's indices for one epoch: one global permutation, padded by wrap-around to a multiple of world.

    Every rank gets ceil(num / world) indices, so every rank runs the same number of steps (a collective per
    step must never wait on a rank that ran out of data).
    """
    order = np.random.default_rng([seed, epoch]).permutation(num) if shuffle else np.arange(num)
    per_rank = -(-num // world)
    padded = np.resize(order, per_rank * world)
    return padded[rank::world]


def steps_per_epoch(num_images: int, global_batch: int, world_size: int) -> int:
    """Iterations per epoch when each rank reads ceil(N / world) images (train_shard) in local batches of B / world."""
    local_batch = max(1, global_batch // world_size)
    shard = math.ceil(num_images / world_size)
    return math.ceil(shard / local_batch)


def val_shard(num: int, rank: int, world: int) -> np.ndarray:
    """Rank's validation indices: disjoint, covering every image exactly once, no padding."""
    return np.arange(rank, num, world)
