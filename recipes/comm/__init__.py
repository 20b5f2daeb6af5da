"""Gradient allreduce backends, chosen by `comm.backend` here and nowhere else.

Each backend implements `recipes.comm.base.AllreduceBackend` (no-op defaults in `BackendDefaults`) and reports a
`recipes.comm.stats.CommStats`; the names are in base/registry.py. The backends' modules (and torch) are
imported only when one is created.
"""

from __future__ import annotations

from base import registry
from recipes.comm.stats import CommStats

BACKENDS = registry.ALLREDUCE_BACKENDS  # comm.backend -> "module:Class"


def backend_class(name: str) -> type:
    """The class registered as `comm.backend: name`."""
    return registry.load(BACKENDS, name, "comm.backend", "backend")


def process_env(comm) -> dict[str, str]:
    """The environment the backend named by `comm.backend` needs before torch.distributed starts: what
    `recipes.distributed.setup(cfg, env=...)` sets."""
    return backend_class(comm.backend).process_env(comm)


def create_allreduce(comm, dist, *, timeout_s: float, model_name: str, compute_start=None):
    """The backend named by `comm.backend` (`comm`: the config's comm section); `timeout_s` (`dist.timeout_s`) bounds
    every collective, `model_name` (`model.name`) keys the multistream tuning cache."""
    return backend_class(comm.backend)(
        comm, dist, timeout_s=timeout_s, model_name=model_name, compute_start=compute_start
    )


__all__ = ["BACKENDS", "CommStats", "backend_class", "create_allreduce", "process_env"]
