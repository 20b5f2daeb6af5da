"""The fusion plan: which gradients are fused into which bucket, and how each bucket is sliced over communicators.

Every rank derives the same plan from the model alone (no per-step negotiation): gradients are taken in
gradient-ready order (reverse registration order, the order backward produces them in a feed-forward network),
cut into contiguous buckets of balanced byte size around a target, and each bucket is split into S slices
of near-equal length; slice j of bucket b goes to communicator (b*S + j) mod K. `FusionPlan.digest()` is a hash of
all of that, compared across ranks once when a plan is installed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import torch
from torch import nn

WIRE_DTYPES = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class TensorSpec:
    """One gradient: the parameter's name, shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()


@dataclass(frozen=True)
class Settings:
    """The tunable knobs of a plan: bucket target size (MB), communicators (K) and slices per bucket (S)."""

    bucket_mb: float
    streams: int
    slices: int

    def label(self) -> str:
        return f"bucket {self.bucket_mb:g} MB, K={self.streams}, S={self.slices}"


@dataclass(frozen=True)
class FusionPlan:
    tensors: tuple[TensorSpec, ...]  # gradient-ready order
    buckets: tuple[tuple[int, ...], ...]  # indices into `tensors`, contiguous runs
    settings: Settings
    compression: str = "none"
    # comm.balance (recipes/comm/balance.py): each communicator's share of every bucket, integers summing to
    # balance.SHARE_TOTAL; None = the static plan (S equal slices, slice j on communicator (b*S+j) mod K)
    shares: tuple[int, ...] | None = None
    # comm.balance_level=hop (recipes/comm/hopring.py): every bucket goes whole to a ring of point-to-point sends,
    # and row h is how host h cuts each chunk it sends over the K connections; None = collectives per slice
    hop_shares: tuple[tuple[int, ...], ...] | None = None

    @property
    def streams(self) -> int:
        return self.settings.streams

    @property
    def slices(self) -> int:
        return self.settings.slices

    def bucket_numel(self, b: int) -> int:
        return sum(self.tensors[i].numel for i in self.buckets[b])

    def bucket_bytes(self, b: int) -> int:
        return sum(self.tensors[i].nbytes for i in self.buckets[b])

    def slice_bounds(self, b: int) -> list[tuple[int, int]]:
        """[(start, end)) element ranges of bucket b's slices: S of lengths that differ by at most one element, or
        with shares, K whose lengths follow the shares (slice k on communicator k; a tiny bucket's may be empty)."""
        if self.shares is not None:
            return split_weighted(self.bucket_numel(b), self.shares)
        return split_even(self.bucket_numel(b), self.slices)

    def communicator(self, b: int, j: int) -> int:
        """Index of the communicator that carries slice j of bucket b."""
        if self.shares is not None:
            return j
        return (b * self.slices + j) % self.streams

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def digest(self) -> str:
        """sha256 of everything that must agree across ranks (tensors, bucket cuts, K, S, wire format)."""
        payload = {
            "tensors": [[t.name, list(t.shape), t.dtype] for t in self.tensors],
            "buckets": [list(b) for b in self.buckets],
            "streams": self.streams,
            "slices": self.slices,
            "compression": self.compression,
        }
        if self.shares is not None:
            payload["shares"] = list(self.shares)
        if self.hop_shares is not None:
            payload["hop_shares"] = [list(row) for row in self.hop_shares]
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()

    def describe(self) -> str:
        sizes = [self.bucket_bytes(b) / 2**20 for b in range(len(self.buckets))]
        return (
            f"{len(self.tensors)} gradients, {self.total_bytes / 2**20:.1f} MB in {len(self.buckets)} buckets "
            f"({min(sizes):.2f}-{max(sizes):.2f} MB), K={self.streams} communicators, S={self.slices} slices, "
            f"wire {self.compression}"
            + (f", shares {'/'.join(str(x) for x in self.shares)}" if self.shares is not None else "")
            + (f", hop-balanced ring, shares {describe_table(self.hop_shares)}" if self.hop_shares is not None else "")
        )


def describe_table(table: tuple[tuple[int, ...], ...]) -> str:
    """A hop table in one line: each host's shares, hosts separated by spaces."""
    return " ".join("/".join(str(x) for x in row) for row in table)


def split_even(n: int, parts: int) -> list[tuple[int, int]]:
    """Split range(n) into `parts` contiguous ranges whose lengths differ by at most one (empty ones dropped)."""
    parts = max(1, min(parts, n)) if n > 0 else 1
    base, extra = divmod(n, parts)
    bounds, start = [], 0
    for j in range(parts):
        end = start + base + (1 if j < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def split_weighted(n: int, weights: tuple[int, ...]) -> list[tuple[int, int]]:
    """Split range(n) into len(weights) contiguous ranges with lengths in proportion to the integer weights (exact
    integer arithmetic, so every rank cuts the same; a range may be empty)."""
    total, bounds, acc = sum(weights), [], 0
    for w in weights:
        lo = n * acc // total
        acc += w
        bounds.append((lo, n * acc // total))
    return bounds


def grad_specs(model: nn.Module) -> tuple[list[TensorSpec], list[nn.Parameter]]:
    """The trainable parameters in gradient-ready order (reverse registration), as specs and as tensors."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    named.reverse()
    specs = [TensorSpec(n, tuple(p.shape), str(p.dtype).removeprefix("torch.")) for n, p in named]
    return specs, [p for _, p in named]


def balanced_buckets(nbytes: list[int], dtypes: list[str], target_bytes: float) -> list[list[int]]:
    """Cut the sequence into contiguous buckets whose sizes are as close to `target_bytes` as possible.

    The cuts minimise the sum over buckets of (bucket bytes - target)^2, exactly (dynamic programming over the
    cut points, integer arithmetic, so every rank finds the same cuts). This keeps buckets balanced: small
    tensors join their neighbours instead of travelling alone, and a tensor larger than the target gets a bucket
    of its own. A change of dtype forces a cut, since a bucket is one flat buffer.
    """
    out: list[list[int]] = []
    start = 0
    for end in range(1, len(nbytes) + 1):
        if end == len(nbytes) or dtypes[end] != dtypes[start]:
            out += [[start + i for i in run] for run in _balanced_run(nbytes[start:end], int(target_bytes))]
            start = end
    return out


def _balanced_run(nbytes: list[int], target: int) -> list[list[int]]:
    n = len(nbytes)
    prefix = [0]
    for size in nbytes:
        prefix.append(prefix[-1] + size)
    best = [0] + [None] * n  # best[i]: least cost of cutting the first i tensors
    cut = [0] * (n + 1)
    for i in range(1, n + 1):
        for j in range(i - 1, -1, -1):
            size = prefix[i] - prefix[j]
            if size - target > 0 and best[i] is not None and (size - target) ** 2 >= best[i]:
                break  # growing the last bucket further only costs more
            cost = best[j] + (size - target) ** 2
            if best[i] is None or cost < best[i]:
                best[i], cut[i] = cost, j
    buckets, i = [], n
    while i > 0:
        buckets.append(list(range(cut[i], i)))
        i = cut[i]
    return buckets[::-1]


def build_plan(
    specs: list[TensorSpec],
    settings: Settings,
    compression: str = "none",
    shares: tuple[int, ...] | None = None,
    hop_shares: tuple[tuple[int, ...], ...] | None = None,
) -> FusionPlan:
    if settings.bucket_mb <= 0 or settings.streams < 1 or settings.slices < 1:
        raise ValueError(f"invalid multistream settings: {settings}")
    if compression not in WIRE_DTYPES:
        raise ValueError(f"compression: expected one of {', '.join(WIRE_DTYPES)}, got {compression!r}")
    if not specs:
        raise ValueError("the model has no trainable parameters: nothing to allreduce")
    buckets = balanced_buckets([s.nbytes for s in specs], [s.dtype for s in specs], settings.bucket_mb * 2**20)
    if shares is not None and (len(shares) != settings.streams or min(shares) < 1):
        raise ValueError(f"shares: expected {settings.streams} positive integers, got {shares}")
    if hop_shares is not None and (
        shares is not None or any(len(row) != settings.streams or min(row) < 1 for row in hop_shares)
    ):
        raise ValueError(f"hop shares: expected rows of {settings.streams} positive integers, got {hop_shares}")
    return FusionPlan(tuple(specs), tuple(tuple(b) for b in buckets), settings, compression, shares, hop_shares)
