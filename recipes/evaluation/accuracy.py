"""Exact top-1/top-5: `evaluate` counts every validation image once over all ranks (the trainer's validation and
`evaluate.py`'s); `evaluate_checkpoint` reads a checkpoint and its validation set for it."""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as td
from torch import nn

from base.errors import CheckpointError, ConfigError, NonFiniteError
from recipes.config import Config, config_from_dict
from recipes.distributed import DistInfo, all_reduce_sum
from recipes.rundir.checkpoint_files import load_checkpoint
from recipes.rundir.payload import Checkpoint


def _accuracy_counts(logits: torch.Tensor, labels: torch.Tensor) -> tuple[int, int]:
    k = min(5, logits.shape[1])
    top = logits.topk(k, dim=1).indices
    hit = top.eq(labels.view(-1, 1))
    return int(hit[:, :1].sum()), int(hit.any(dim=1).sum())


def check_logits(bad: int, n: int, what: str = "validation") -> None:
    """The one rule for every accuracy this repository reports (validation, evaluate.py, --latency): no image may
    have non-finite logits, and there must be images. top-k of NaN or inf logits picks arbitrary classes, so an
    accuracy computed from them means nothing."""
    if bad:
        raise NonFiniteError(
            f"{what}: {bad} of {n} images got non-finite logits (NaN/inf weights or activations); "
            "no accuracy is reported"
        )
    if n == 0:
        raise NonFiniteError(f"{what}: no image was classified; no accuracy is reported")


@torch.no_grad()
def evaluate(model: nn.Module, batches, dist: DistInfo, amp_ctx=nullcontext) -> dict:
    """Top-1/top-5 over every validation image exactly once: each rank counts its disjoint share, then sum."""
    model.eval()
    c1 = c5 = n = bad = 0
    loss_sum = 0.0
    for images, labels in batches:
        with amp_ctx():
            logits = model(images)
        logits = logits.float()
        bad += int((~torch.isfinite(logits).all(dim=1)).sum())
        loss_sum += float(nn.functional.cross_entropy(logits, labels, reduction="sum"))
        a, b = _accuracy_counts(logits, labels)
        c1, c5, n = c1 + a, c5 + b, n + labels.numel()
    c1, c5, n, loss_sum, bad = all_reduce_sum([c1, c5, n, loss_sum, bad], dist)
    n = int(n)
    check_logits(int(bad), n)
    return {"top1": 100.0 * c1 / max(n, 1), "top5": 100.0 * c5 / max(n, 1), "count": n, "loss": loss_sum / max(n, 1)}


def average_bn_stats(model: nn.Module, dist: DistInfo) -> None:
    """Average BN running statistics over ranks (each rank saw other images) before eval or checkpoint."""
    if not dist.enabled:
        return
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            for buf in (m.running_mean, m.running_var):
                td.all_reduce(buf)
                buf.div_(dist.world_size)


def config_from_checkpoint(ck: Checkpoint) -> Config:
    ck.require_model_info()
    return config_from_dict(ck.config, f"checkpoint '{ck.path}' config")


def load_model(ck: Checkpoint, cfg: Config):
    from models import create_model
    from models.factory import check_compatible

    bad, total, first = ck.non_finite_weights()
    if bad:
        raise CheckpointError(
            f"checkpoint '{ck.path}' has {bad} non-finite values among {total} weights (first in '{first}'): "
            "the training diverged; no accuracy or latency is reported for it"
        )
    model = create_model(cfg.model, ck.require_model_info().num_classes)
    check_compatible(model, ck.model, ck.path)
    model.load_state_dict(ck.model)
    per_rank = ck.bn_per_rank
    if per_rank:  # a mid-epoch checkpoint of several ranks: their average, as validation would use (average_bn_stats)
        mean = {k: torch.stack([r[k] for r in per_rank]).mean(0) for k in per_rank[0]}
        model.load_state_dict(mean, strict=False)
    return model


def resolve_data_root(path: str | Path) -> str:
    """The dataset root for `--data`: a root holding val/, or the val folder itself (then its parent)."""
    p = Path(path)
    if (p / "val").is_dir() or not p.is_dir():
        return str(p)  # a missing root gets the data layer's error, which names the expected layout
    if p.name == "val":
        return str(p.parent)
    return str(p)


class FlipTTA(nn.Module):
    """Test-time augmentation: mean of the softmax of the image and of its mirror image, returned as log-probabilities
    (valid logits: top-k and cross-entropy treat them like the model's own)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.model(x).float().softmax(-1) + self.model(x.flip(-1)).float().softmax(-1)
        return (p / 2).log()


TTA = {"none": lambda m: m, "flip": FlipTTA}


def validated_phase(cfg, state: dict | None) -> tuple[int, str]:
    """(index of the phase the trainer last validated at, where that comes from, in words): the phase of the last
    finished epoch; phase 0 before any epoch finished; the last phase for a finished run or one without state."""
    total = sum(p.epochs for p in cfg.phases)
    done = (state or {}).get("epoch")
    last = len(cfg.phases) - 1
    if not isinstance(done, int) or done >= total:
        why = "the run finished" if isinstance(done, int) else "the checkpoint records no training state"
        return last, f"phase {last}'s, the last ({why})"
    if done == 0:
        return 0, f"phase 0's: no epoch validated yet (0 of {total} epochs)"
    index, end = 0, cfg.phases[0].epochs
    while end < done:
        index += 1
        end += cfg.phases[index].epochs
    return index, f"phase {index}'s, where the trainer last validated (after epoch {done} of {total})"


def eval_config(
    ck: Checkpoint,
    *,
    data_root: str | None = None,
    image_size: int | None = None,
    batch_size: int = 64,
    backend: str | None = None,
    rect: bool = False,
    val_blacklist: str | None = None,
):
    """(cfg, phase) that evaluate_checkpoint hands to the input pipeline: the phase the trainer last validated at
    (validated_phase), at the requested resolution, reading `<data_root>/val` (without the checkpoint's
    data.val_blacklist images, or `val_blacklist`'s; '' counts every image)."""
    cfg = config_from_checkpoint(ck)
    data = {"val_batch_size": batch_size, "workers": min(cfg.data.get("workers", 1), 2)}
    if val_blacklist is not None:
        data["val_blacklist"] = val_blacklist
    if data_root:
        data["root"], data["roots"] = resolve_data_root(data_root), {}
    if backend:
        data["backend"] = backend
    if image_size is not None and image_size <= 0:
        raise ConfigError(f"--image-size: expected a positive integer, got {image_size}")
    last = cfg.phases[validated_phase(cfg, ck.state)[0]]
    phase = dataclasses.replace(last, root="full", val_image_size=image_size or last.val_image_size, rect_val=rect)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **data), phases=[phase])
    return cfg, phase


def evaluate_checkpoint(
    path: str,
    data_root: str | None = None,
    *,
    image_size: int | None = None,
    batch_size: int = 64,
    backend: str | None = None,
    tta: str = "none",
    rect: bool = False,
    val_blacklist: str | None = None,
    ema: bool = False,
) -> dict:
    """Top-1/top-5 of the checkpoint (its EMA weights with `ema`) on `<data_root>/val`, every image counted once
    over all ranks."""
    from data import create_input
    from recipes.comm import process_env
    from recipes.distributed import setup, teardown

    if tta not in TTA:
        raise ConfigError(f"--tta: unknown '{tta}' (expected one of {', '.join(TTA)})")
    ck = load_checkpoint(path)
    ck = ck.ema_weights() if ema else ck
    cfg, phase = eval_config(
        ck,
        data_root=data_root,
        image_size=image_size,
        batch_size=batch_size,
        backend=backend,
        rect=rect,
        val_blacklist=val_blacklist,
    )
    dist = setup(cfg, env=process_env(cfg.comm))
    try:
        classes = ck.require_model_info().classes  # val/ alone is enough
        pipe = create_input(
            cfg.data,
            dist,
            phases=cfg.phases,
            seed=cfg.run.seed,
            channels_last=cfg.run.channels_last,
            amp=cfg.run.amp,
            val_classes=classes,
        )
        _check_classes(pipe.classes, ck, cfg.data.get("root", ""))
        model = TTA[tta](load_model(ck, cfg)).to(dist.device)
        if cfg.run.channels_last:
            model = model.to(memory_format=torch.channels_last)
        # The input pipeline may hand fp16 images (DALI's `data.dali_dtype`, `auto` under fp16 training) to this
        # fp32 model, which runs without autocast: cast them to the model's own dtype.
        dtype = next(model.parameters()).dtype
        result = evaluate(model, ((x.to(dtype), y) for x, y in pipe.val_batches(phase)), dist)
        result.update(blacklisted=getattr(pipe, "val_excluded", 0), val_blacklist=cfg.data.get("val_blacklist", ""))
        pipe.close()
    finally:
        teardown()
    result.update(
        {
            "checkpoint": str(path),
            "data": cfg.data.get("root", ""),
            "image_size": phase.val_image_size or phase.image_size,
            "image_size_from": "--image-size"
            if image_size
            else validated_phase(config_from_checkpoint(ck), ck.state)[1],
            "world_size": dist.world_size,
            "tta": tta,
            "rect_val": phase.rect_val,
            "backend": cfg.data.backend,
            "weights": "ema" if ema else "model",
        }
    )
    return result


def _check_classes(classes: list[str], ck: Checkpoint, root: str) -> None:
    if classes != ck.model_info.classes:
        raise ConfigError(
            f"{root}: its classes differ from the checkpoint's ({len(classes)} vs "
            f"{len(ck.model_info.classes)} classes, or other names)"
        )
