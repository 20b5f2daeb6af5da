"""The DAWNBench JSON entry of a run (`<run_dir>/dawnbench.json`, beside the TSV of recipes/logger.py).

Fields as in the DAWNBench entries repository (stanford-futuredata/dawn-bench-entries, ImageNet/train/*.json):
version, author, authorEmail, framework, codeURL, model, hardware, costPerHour, timestamp, misc, usedBlacklist.
`misc` describes the schedule the way the record's entry does (imageSize and batchSize per block of epochs, the LR
and momentum shape, the optimizer) and adds what this run measured.
"""

from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path

import torch

from recipes.config import Config


def hardware_description(world_size: int, local_world_size: int, device: torch.device) -> str:
    """'2 machine(s) x 8 x NVIDIA H100 80GB HBM3' or '1 machine(s) x 2 x CPU (x86_64)'."""
    machines = max(1, world_size // max(1, local_world_size))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.machine()})"
    return f"{machines} machine(s) x {local_world_size} x {name}"


def _blocks(phases, key: str) -> list[dict]:
    """Consecutive phases with the same value of `key` merged: [{key: v, "epochs": n}, ...]."""
    out: list[dict] = []
    for p in phases:
        if out and out[-1][key] == getattr(p, key):
            out[-1]["epochs"] += p.epochs
        else:
            out.append({key: getattr(p, key), "epochs": p.epochs})
    return out


def entry(cfg: Config, summary: dict, hardware: str, day: datetime.date | None = None) -> dict:
    """The JSON entry as a dict; `summary` is the trainer's summary (summary.json)."""
    d, o = cfg.dawnbench, cfg.optim
    e: dict = {"version": "v1.0", "author": d.author}
    if d.author_email:
        e["authorEmail"] = d.author_email
    e["framework"] = d.framework or f"PyTorch {torch.__version__.split('+')[0]}"
    if d.code_url:
        e["codeURL"] = d.code_url
    e["model"] = d.model or cfg.model.name
    e["hardware"] = d.hardware or hardware
    if d.cost_per_hour is not None:
        e["costPerHour"] = d.cost_per_hour
    e["timestamp"] = (day or datetime.date.today()).isoformat()
    momentum = {"momentum": o.momentum_schedule, "max_momentum": o.momentum}
    if o.momentum_end is not None and o.momentum_schedule != "constant":
        momentum = {"momentum": o.momentum_schedule, "max_momentum": max(o.momentum, o.momentum_end),
                    "min_momentum": min(o.momentum, o.momentum_end)}  # fmt: skip
    misc = {
        "optimizer": o.name,
        "use_nesterov": o.nesterov,
        "weight_decay": o.weight_decay,
        "no_bn_bias_decay": o.no_bn_decay,
        "smooth_label": o.label_smoothing,
        "warmup_epochs": o.warmup_epochs,
        "schedule": {
            "learning_rate": "linear warm-up, then linear decay",
            "warmup_start_lr": o.warmup_start_lr,
            "max_lr": o.lr,
            "min_lr": o.final_lr,
            "lr_scaling": o.lr_scaling,
            **momentum,
        },  # fmt: skip
        "imageSize": [
            {
                "image_size": p.image_size,
                "epochs": p.epochs,
                "rect_val": p.rect_val,
                "min_scale": p.min_scale,
                "val_image_size": p.val_image_size or p.image_size,
                "data": p.root,
            }
            for p in cfg.phases
        ],  # fmt: skip
        "batchSize": _blocks(cfg.phases, "batch_size"),
        "mixed_precision": cfg.run.amp,
        "channels_last": cfg.run.channels_last,
        "distributed training backend": cfg.comm.backend,
        "input pipeline": cfg.data.backend,
        "deployment backend": "scripts/launch.py (torchrun c10d / horovodrun)",
        "processes": summary["world_size"],
        "epochs": summary["epochs"],
        "iterations": summary["steps"],
        "target": {k: v for k, v in (("top1", cfg.run.target_top1), ("top5", cfg.run.target_top5)) if v is not None},
        "time_to_target_seconds": summary["time_to_target_seconds"],
        "train_seconds": summary["train_seconds"],
        "wall_seconds": summary["wall_seconds"],
        "final_top1": summary["final_top1"],
        "final_top5": summary["final_top5"],
        "images_per_s": summary["images_per_s"],
    }
    if d.cost_per_hour is not None:
        # DAWNBench's cost: the price of the machines for the training time in the TSV.
        hours = (summary["time_to_target_seconds"] or summary["train_seconds"]) / 3600
        misc["cost_usd"] = round(d.cost_per_hour * hours, 4)
    e["misc"] = misc
    e["usedBlacklist"] = False  # every image of the validation folder is counted
    return e


def write_entry(path: Path, cfg: Config, summary: dict, dist) -> dict:
    """Write the entry for this run (rank 0 calls it at the end of `fit`)."""
    e = entry(cfg, summary, hardware_description(dist.world_size, dist.local_world_size, dist.device))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(e, indent=4) + "\n")
    tmp.replace(path)
    return e


__all__ = ["entry", "write_entry", "hardware_description"]
