"""Input pipelines. `create_input(cfg, dist)` is the only place that knows which backend is in use.

Every pipeline implements `data.pipeline.InputPipeline`: `num_classes`, `classes`, `num_train`, `num_val`,
`train_batches(epoch_info, start_step=0)` (exactly `epoch_info.steps - start_step` normalized batches on the
device for this rank), `val_batches(phase)` (this rank's disjoint share of the validation set, every image exactly
once over all ranks) and `close()`. The names of `data.backend` are in recipes/registry.py.
"""

from __future__ import annotations

from data.folder import DataError, scan_split
from data.pipeline import BasePipeline, InputPipeline
from recipes import registry


def _scan(cfg):
    train = scan_split(cfg.data.root, "train")
    val = scan_split(cfg.data.root, "val", classes=train.classes)
    roots = {"full": (train, val)}
    for name, path in cfg.data.roots.items():
        if name == "full" and path == cfg.data.root:
            continue
        roots[name] = (scan_split(path, "train", classes=train.classes), val)
    for i, phase in enumerate(cfg.phases):
        if phase.root not in roots:
            raise DataError(f"phases.{i}.root: '{phase.root}' is not in data.roots (known: {', '.join(sorted(roots))})")
    return train, val, roots


def create_input(cfg, dist) -> InputPipeline:
    """Build the input pipeline named by `data.backend`."""
    backend = cfg.data.backend
    pipeline = registry.load(registry.INPUT_PIPELINES, backend, "data.backend", "backend")
    if not pipeline.reads_folders:
        return pipeline(cfg, dist)
    return pipeline(cfg, dist, *_scan(cfg))  # Pipeline(cfg, dist, train split, val split, roots by name)


__all__ = ["BasePipeline", "DataError", "InputPipeline", "create_input"]
