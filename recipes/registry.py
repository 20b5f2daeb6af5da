"""The plug-ins a config may choose at each seam, each described by one record: its name, where its implementation
lives, and what the rest of the tree shows or checks of it.

    Allreduce   comm.backend: the class, its label in tables, its rows in the time model, whether comm.compression
                applies to it, whether its work can be captured in the step's CUDA graph across ranks
    Optimizer   optim.name: the builder, the optim.* keys it reads (the others are inert for it: said when set,
                marked by --print-config)

The config schema takes its `Literal` types from these tables, so a wrong name is a `ConfigError` (with "did you
mean") when the config loads; the factories (`recipes.comm.create_allreduce`, `data.create_input`,
`recipes.optim.create_optimizer`, `models.create_model`) import the implementation from here when it is asked
for; the time model, `train.py --plan --gpu`, scripts/predict.py and compare_runs list the backends from
`ALLREDUCE_BACKENDS`, and `--print-config` the inert keys from `OPTIMIZERS`. A new backend or optimizer is one
record here plus its module (a backend: also its step-time model in recipes/comm/stepmodel.py). The records are
plain data, and nothing of this repository is imported at import time: the schema and the torch-free tools read
them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from recipes.errors import ConfigError


@dataclass(frozen=True)
class Allreduce:
    """A gradient allreduce backend (comm.backend)."""

    name: str
    impl: str  # "module:Class" implementing recipes.comm.base.AllreduceBackend
    label: str  # in tables: predict.py, train.py --plan --gpu, compare_runs
    compression: bool  # reads comm.compression (the gradients' wire format)
    # The time model's rows (recipes/timemodel/estimate.py::backends): TCP flows per communicator of each, modelled
    # by recipes/comm/stepmodel.py under `name`. ddp has two: NCCL's one flow, and 4 (comm.nccl_preset flows-4),
    # the strongest plain-DDP baseline.
    time_flows: tuple[int, ...] = (1,)
    # Why its work cannot be captured in the step's CUDA graph across ranks (run.cuda_graph; recipes/steps.py
    # graph_decision); "" = it can (one rank always can: nothing to reduce).
    eager_across_ranks: str = ""
    # What its comm_seconds (recipes/comm/stats.py CommStats) times, per step: backends time different windows
    # (docs/allreduce.md, "What each backend measures"), so compare_runs names it beside every comm column.
    comm_window: str = "the backend's own (docs/allreduce.md)"

    def row_label(self, flows: int = 1) -> str:
        """The label of its time-model row or run with `flows` TCP flows per peer ("ddp (4 flows)")."""
        return self.label if flows <= 1 else f"{self.label} ({flows} flows)"


# comm.backend -> its record
ALLREDUCE_BACKENDS = {
    r.name: r
    for r in (
        Allreduce(
            "ddp",
            "recipes.comm.ddp:DDPBackend",
            "ddp",
            compression=False,
            time_flows=(1, 4),
            eager_across_ranks="DDP's reducer runs host logic per step",
            comm_window="first bucket -> last bucket reduced",
        ),
        Allreduce(
            "multistream",
            "recipes.comm.multistream:MultiStreamBackend",
            "multistream",
            compression=True,
            comm_window="backward + sync",
        ),
        Allreduce(
            "horovod",
            "recipes.comm.horovod_backend:HorovodBackend",
            "horovod",
            compression=True,
            eager_across_ranks="Horovod's allreduce runs on its own thread",
            comm_window="first gradient -> synchronize()",
        ),
    )
}

# comm.nccl_preset -> (NCCL_SOCKET_NTHREADS, NCCL_NSOCKS_PERTHREAD, NCCL_MIN_NCHANNELS); None leaves NCCL's
# default. Threads x sockets = TCP flows per channel connection (recipes/comm/ncclenv.py).
NCCL_PRESETS: dict[str, tuple[int | None, int | None, int | None]] = {
    "nccl-default": (None, None, None),  # whatever NCCL picks for the NIC (1 x 1 on a generic NIC)
    "single-flow": (1, 1, None),  # one connection per channel: the one-flow baseline
    "flows-4": (2, 2, None),
    "flows-8": (2, 4, None),
    "aws-ena": (2, 8, None),  # NCCL's own choice on AWS ENA NICs
    "gcp-gvnic": (4, 1, None),  # NCCL's own choice on GCP gVNIC
    "flows-16-ch4": (4, 4, 4),
}

# data.backend -> a class implementing data.pipeline.InputPipeline
INPUT_PIPELINES = {
    "torch": "data.torch_loader:TorchPipeline",
    "dali": "data.dali_loader:DaliPipeline",
    "synthetic": "data.synthetic:SyntheticPipeline",
}


@dataclass(frozen=True)
class Optimizer:
    """An optimizer (optim.name): its builder and the optim.* keys it reads."""

    name: str
    impl: str  # "module:function" (optim_cfg, param_groups) -> torch.optim.Optimizer
    reads: tuple[str, ...]  # optim.* keys its update reads, besides those of every optimizer (OPTIM_SHARED_KEYS)


# Every optimizer reads these: the LR schedule, the decay and its groups, the loss's smoothing.
OPTIM_SHARED_KEYS = ("name", "lr", "lr_scaling", "warmup_epochs", "warmup_start_lr", "final_lr", "weight_decay")
OPTIM_SHARED_KEYS += ("no_bn_decay", "label_smoothing", "clip_grad_norm")
_MOMENTUM = ("momentum", "momentum_end", "momentum_schedule", "nesterov")  # SGD's heavy ball (Lamb has Adam's betas)
_LAYER_ADAPTIVE = (*_MOMENTUM, "eta", "lars_momentum", "adapt_bn_bias")

# optim.name -> its record
OPTIMIZERS = {
    r.name: r
    for r in (
        Optimizer("sgd", "recipes.optim:build_sgd", _MOMENTUM),
        Optimizer("lars", "recipes.optim:build_lars", _LAYER_ADAPTIVE),
        Optimizer("hybrid", "recipes.optim:build_hybrid", (*_LAYER_ADAPTIVE, "trust_clip_min", "trust_clip_max")),
        Optimizer("lamb", "recipes.optim:build_lamb", ("adapt_bn_bias",)),
    )
}

# model.name -> timm architecture. `resnet50_tweaked` is ResNet-D (deep stem, average-pool downsampling in the
# shortcut) = timm's resnet50d; the BN tweaks (zero-init last gamma, BN momentum/eps, no BN decay) are applied
# from the config on top (models/factory.py).
MODELS = {
    "resnet50_tweaked": "resnet50d",
    "resnet50d": "resnet50d",
    "resnet50": "resnet50",
    "resnet26d": "resnet26d",
    "resnet18": "resnet18",
    "resnet10t": "resnet10t",
}


def check_name(table: dict[str, Any], name: str, key: str, what: str) -> None:
    """ConfigError naming `key` and the choices when `name` is not in `table` (configs built without the loader)."""
    if name not in table:
        raise ConfigError(f"{key}: unknown {what} '{name}' (expected one of {', '.join(table)})")


def load(table: dict[str, Any], name: str, key: str, what: str) -> Any:
    """The implementation registered under `name` (a record's `impl`, or the table's 'module:attribute'), imported
    now."""
    check_name(table, name, key, what)
    entry = table[name]
    module, _, attr = getattr(entry, "impl", entry).partition(":")
    return getattr(importlib.import_module(module), attr)
