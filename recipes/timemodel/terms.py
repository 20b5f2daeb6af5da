"""The terms besides compute and communication: each a dataclass with its value, range and source."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Sync:
    """Per-step multi-host cost that is not bandwidth: the step's collective waits for the slowest GPU."""

    sigma_s: float = 4.5e-3  # one GPU's step-time jitter (standard deviation), fitted on the record
    low_high: tuple[float, float] = (0.5, 1.5)  # x sigma
    source: str = (
        "sigma fitted on the record (16 x 8 entry minus 1 x 8 entry minus modelled exposed comm, per step); "
        "expected max of N normal draws: sqrt(2 ln N) sigma"
    )

    def seconds(self, hosts: int, gpus_per_host: int) -> float:
        if hosts <= 1:
            return 0.0
        n, g = hosts * gpus_per_host, max(gpus_per_host, 1)
        return self.sigma_s * (math.sqrt(2 * math.log(n)) - (math.sqrt(2 * math.log(g)) if g > 1 else 0.0))


@dataclass(frozen=True)
class Validation:
    """Validation after each epoch (wall clock only): forward passes, about a third of a training step per image."""

    forward_share: float = 1 / 3  # backward costs about twice the forward (two matmuls per forward matmul)
    low_high: tuple[float, float] = (0.7, 2.0)  # the input pipeline of 48k JPEGs can dominate a short forward
    source: str = "forward = 1/3 of a training step (backward ~ 2x forward FLOPs), validation set without blacklist"


@dataclass(frozen=True)
class BnAllreduce:
    """The BN running statistics averaged over all ranks before validation (wall clock only), once per epoch."""

    source: str = "one allreduce of every BN layer's running mean and variance (fp32): latency-bound"


@dataclass(frozen=True)
class StartUp:
    """Process launch, imports, NCCL communicators, model build, first pipeline fill (wall clock only, once)."""

    seconds: tuple[float, float, float] = (15.0, 30.0, 90.0)
    source: str = "estimate (torchrun + imports ~5 s, NCCL init over H hosts, DALI build, first batches)"


@dataclass(frozen=True)
class CommUncertainty:
    low_high: tuple[float, float] = (0.7, 1.3)
    source: str = "recipes/comm/stepmodel.py; lab validation within +-10% for ddp/multistream, outliers to -31%"
