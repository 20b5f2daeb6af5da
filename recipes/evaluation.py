"""Checkpoint evaluation (exact top-1/top-5), shared by evaluate.py and the tests."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from recipes import checkpoint as ckpt
from recipes.config import Config, ConfigError, _build


def config_from_checkpoint(state: dict, path: str) -> Config:
    if "config" not in state or "model_info" not in state:
        raise ckpt.CheckpointError(f"checkpoint '{path}' has no config: not written by this trainer")
    return _build(Config, state["config"], "")


def load_model(state: dict, cfg: Config, path: str):
    from models import create_model
    from models.factory import check_compatible

    model = create_model(cfg.model, state["model_info"]["num_classes"])
    check_compatible(model, state["model"], path)
    model.load_state_dict(state["model"])
    return model


def evaluate_checkpoint(path: str, data_root: str | None = None, image_size: int | None = None,
                        batch_size: int = 64, backend: str | None = None) -> dict:  # fmt: skip
    """Top-1/top-5 of the checkpoint on `<data_root>/val`, every image counted once over all ranks."""
    from data import create_input
    from recipes.distributed import setup, teardown
    from recipes.trainer import evaluate

    state = ckpt.load(path)
    cfg = config_from_checkpoint(state, path)
    data = {"val_batch_size": batch_size, "workers": min(cfg.data.workers, 2)}
    if data_root:
        data["root"], data["roots"] = data_root, {}
    if backend:
        data["backend"] = backend
    last = cfg.phases[-1]
    phase = dataclasses.replace(last, root="full", val_image_size=image_size or last.val_image_size)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **data), phases=[phase])
    dist = setup(cfg)
    try:
        pipe = create_input(cfg, dist)
        if pipe.classes != state["model_info"]["classes"]:
            raise ConfigError(
                f"{cfg.data.root}: its classes differ from the checkpoint's ({len(pipe.classes)} vs "
                f"{len(state['model_info']['classes'])} classes, or other names)"
            )
        model = load_model(state, cfg, path).to(dist.device)
        result = evaluate(model, pipe.val_batches(phase), dist)
        pipe.close()
    finally:
        teardown()
    result.update({"checkpoint": str(path), "data": cfg.data.root, "image_size": phase.val_image_size or
                   phase.image_size, "world_size": dist.world_size})  # fmt: skip
    return result


def run_evaluate_cli(args) -> int:
    from data.folder import DataError

    try:
        res = evaluate_checkpoint(args.checkpoint, args.data, args.image_size, args.batch_size, args.backend)
    except (ConfigError, DataError, ckpt.CheckpointError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    import os

    if int(os.environ.get("RANK", "0")) == 0:
        print(f"top-1 {res['top1']:.2f}%  top-5 {res['top5']:.2f}%  on {res['count']} images "
              f"({res['image_size']} px, {res['world_size']} process(es))")  # fmt: skip
        if args.out:
            Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


__all__ = ["evaluate_checkpoint"]
