"""Gradient allreduce backends, chosen by `comm.backend` here and nowhere else.

Each backend implements `recipes.comm.base.AllreduceBackend` (no-op defaults in `BackendDefaults`) and reports a
`recipes.comm.stats.CommStats`; the names are in recipes/registry.py. The backends' modules (and torch) are
imported only when one is created.
"""

from __future__ import annotations

from recipes import registry
from recipes.comm.stats import CommStats

BACKENDS = registry.ALLREDUCE_BACKENDS  # comm.backend -> "module:Class"


def backend_class(name: str) -> type:
    """The class registered as `comm.backend: name`."""
    return registry.load(BACKENDS, name, "comm.backend", "backend")


def create_allreduce(cfg, dist):
    """The backend named by `cfg.comm.backend`."""
    return backend_class(cfg.comm.backend)(cfg, dist)


__all__ = ["BACKENDS", "CommStats", "backend_class", "create_allreduce"]
