"""The names a config may choose at each plug-in seam, and where each implementation lives.

The config schema takes its `Literal` types from these tables, so a wrong name is a `ConfigError` (with "did you
mean") when the config loads; the factories (`recipes.comm.create_allreduce`, `data.create_input`,
`recipes.optim.create_optimizer`, `models.create_model`) import the implementation from here when it is asked
for. A new backend, pipeline or optimizer is one line here plus its module. Nothing of this repository is
imported at import time.
"""

from __future__ import annotations

import importlib
from typing import Any

from recipes.errors import ConfigError

# comm.backend -> a class implementing recipes.comm.base.AllreduceBackend
ALLREDUCE_BACKENDS = {
    "ddp": "recipes.comm.ddp:DDPBackend",
    "multistream": "recipes.comm.multistream:MultiStreamBackend",
    "horovod": "recipes.comm.horovod_backend:HorovodBackend",
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

# optim.name -> a function (optim_cfg, param_groups) -> torch.optim.Optimizer
OPTIMIZERS = {
    "sgd": "recipes.optim:build_sgd",
    "lars": "recipes.optim:build_lars",
    "hybrid": "recipes.optim:build_hybrid",
    "lamb": "recipes.optim:build_lamb",
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


def load(table: dict[str, str], name: str, key: str, what: str) -> Any:
    """The implementation registered under `name` ('module:attribute'), imported now."""
    check_name(table, name, key, what)
    module, _, attr = table[name].partition(":")
    return getattr(importlib.import_module(module), attr)
