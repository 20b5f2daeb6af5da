"""Gradient allreduce backends, chosen by `comm.backend` here and nowhere else.

A backend's `prepare(model, optimizer) -> (train_model, optimizer)` returns the module to run forward and
backward through and the optimizer to step; after `optimizer.step()` every rank holds identical weights.
`stats()` reports communication counters for the log; `state_dict()/load_state_dict()` carry any tuned state;
`on_step_end(step, log)` is called after every optimizer step (the multistream auto-tuner runs there).
"""

from __future__ import annotations

from recipes.comm.ddp import DDPBackend
from recipes.comm.horovod_backend import HorovodBackend
from recipes.comm.multistream import MultiStreamBackend
from recipes.config import ConfigError

BACKENDS = {"ddp": DDPBackend, "multistream": MultiStreamBackend, "horovod": HorovodBackend}


def create_allreduce(cfg, dist):
    """The backend named by `cfg.comm.backend`."""
    name = cfg.comm.backend
    if name not in BACKENDS:
        raise ConfigError(f"comm.backend: unknown backend '{name}' (expected one of {', '.join(BACKENDS)})")
    return BACKENDS[name](cfg, dist)
