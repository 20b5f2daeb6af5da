"""The DAWNBench JSON entry of a run (`<run_dir>/dawnbench.json`, beside the TSV of recipes/logger.py).

Fields as in the DAWNBench entries repository (stanford-futuredata/dawn-bench-entries, ImageNet/train/*.json):
version, author, authorEmail, framework, codeURL, commitHash, model, hardware, costPerHour, timestamp, misc,
usedBlacklist. `misc` describes the schedule the way the record's entry does (imageSize and batchSize per block of
epochs, the LR and momentum shape, the optimizer with its trust-ratio hyperparameters) and adds what this run
measured. The entry is also written under the repository's file name pattern,
`[author name]_[model name]_[hardware tag]_[framework].json` (and `.tsv`), to set beside the published entries;
`qualifies` (ours, top level) says whether the run is a DAWNBench result at all (top-5 >= 93% reached, every
validation image evaluated), and an entry that is not has `.not-qualifying` in its file name.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
from pathlib import Path

import torch

from base import registry
from base.errors import ConfigError
from base.writer import write_atomic, write_json
from data.folder import distinct_files
from recipes.config import Config
from recipes.environment import Environment, collect


def missing_required(cfg: Config) -> list[str]:
    """The dawnbench keys the entry needs but the config leaves empty (none unless dawnbench.require)."""
    if not cfg.dawnbench.require:
        return []
    return [k for k in ("author", "author_email") if not getattr(cfg.dawnbench, k).strip()]


def required_problem(cfg: Config) -> str | None:
    """The line that stops a run whose entry would lack a field the format requires (None: nothing lacks)."""
    missing = missing_required(cfg)
    if not missing:
        return None
    return (
        f"dawnbench.{missing[0]}: the DAWNBench entries format requires it (dawnbench.require=true); set "
        f"{' '.join(f'dawnbench.{k}=...' for k in missing)}, or dawnbench.require=false for a run not to submit"
    )


def check_required(cfg: Config) -> None:
    """With dawnbench.require, refuse to start a run whose entry would lack a field the format requires."""
    problem = required_problem(cfg)
    if problem:
        raise ConfigError(problem)


# DAWNBench's ImageNet training target and the validation set it is measured on (ILSVRC2012: 50,000 images,
# of which the devkit's blacklist names 1,762).
DAWNBENCH_TOP5 = 93.0
IMAGENET_VAL_IMAGES = 50_000
IMAGENET_CLASSES = 1_000
DEVKIT_BLACKLISTED = 1_762  # ILSVRC2015_clsloc_validation_blacklist.txt in the ILSVRC2012 devkit
NOT_QUALIFYING = "not-qualifying"  # in the file name of an entry that does not qualify


def qualification(cfg: Config, summary: dict) -> list[str]:
    """Why this run's entry does not qualify as a DAWNBench ImageNet training result (empty: it qualifies): the
    target must be DAWNBench's top-5 >= 93%, reached, measured on every validation image (blacklist aside)."""
    reasons = []
    if cfg.run.target_top5 is None or cfg.run.target_top5 < DAWNBENCH_TOP5:
        reasons.append(f"its target is not DAWNBench's top-5 >= {DAWNBENCH_TOP5:g}% (set run.target_top5=93)")
    elif summary.get("time_to_target_seconds") is None:
        top5 = summary.get("final_top5")
        at_end = "no epoch validated" if top5 is None else f"top-5 {top5:.2f}% at the end"
        reasons.append(f"it did not reach its target ({at_end}, target {cfg.run.target_top5:g}%)")
    counted, excluded = summary.get("val_count"), summary.get("val_excluded") or 0
    classes = summary.get("num_classes")
    if classes != IMAGENET_CLASSES:
        reasons.append(f"it classifies {'unknown' if classes is None else classes} classes, not ImageNet's 1,000")
    if counted is None or counted + excluded != IMAGENET_VAL_IMAGES:
        seen = "no" if counted is None else f"{counted + excluded:,}"
        reasons.append(f"it evaluated {seen} validation images, not ImageNet's {IMAGENET_VAL_IMAGES:,}")
    elif summary.get("val_skipped"):
        reasons.append(f"it skipped {summary['val_skipped']:,} undecodable validation images (data.skip_corrupt)")
    elif summary.get("val_files") is not None and summary["val_files"] < IMAGENET_VAL_IMAGES:
        # the count is ImageNet's, the files are not: links (hard or symbolic) to fewer images
        reasons.append(
            f"its {IMAGENET_VAL_IMAGES:,} validation images are {summary['val_files']:,} distinct images (links to or "
            "copies of the same images), not ImageNet's validation set"
        )
    elif excluded not in (0, DEVKIT_BLACKLISTED):
        # A list that makes the count add up is not the devkit's: only its 1,762 images may be left out.
        reasons.append(
            f"its blacklist left out {excluded:,} validation images, not the devkit's {DEVKIT_BLACKLISTED:,}"
        )
    return reasons


def qualification_line(e: dict) -> str:
    """One line for a run's summary: whether its entry qualifies, and why not."""
    if e.get("qualifies"):
        return "DAWNBench entry: qualifies (top-5 >= 93% on every validation image)"
    return "DAWNBench entry: does NOT qualify: " + "; ".join(e.get("notQualifyingBecause", []))


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


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "", text.lower()) or "unknown"


def file_stem(cfg: Config, world_size: int, local_world_size: int, device: torch.device) -> str:
    """`[author name]_[model name]_[hardware tag]_[framework]`, as in the entries repository
    (alibabacloud_resnet50_gn6e_16_machine_tensorflow): e.g. team_resnet50_2x8-h100_pytorch."""
    machines = max(1, world_size // max(1, local_world_size))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    chip = next((w for w in re.findall(r"[A-Za-z]+\d+\w*", name) if not w.lower().startswith("rtx")), name)
    tag = f"{machines}x{local_world_size}-{_slug(chip)}"
    return "_".join([_slug(cfg.dawnbench.author), _slug(cfg.dawnbench.model or cfg.model.name), tag, "pytorch"])


LAUNCHER_ENV = "DAWNBENCH_LAUNCHER"  # scripts/launch.py names itself and its engine here for every worker


def deployment(environ: dict | None = None) -> str:
    """How this process was started, for the entry's "deployment backend": what its environment shows."""
    env = os.environ if environ is None else environ
    if env.get(LAUNCHER_ENV):
        return env[LAUNCHER_ENV]
    if "HOROVOD_RANK" in env:
        return "horovodrun"
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    return "python train.py (one process)"


def entry(
    cfg: Config,
    summary: dict,
    hardware: str,
    day: datetime.date | None = None,
    commit: str = "",
    environment: Environment | None = None,
    *,
    environ: dict | None = None,
) -> dict:
    """The JSON entry as a dict; `summary` is the trainer's summary (summary.json); `environment` (from
    recipes.environment.collect()) adds the versions, driver, GPUs and instance both record entries list."""
    d, o = cfg.dawnbench, cfg.optim
    # author and authorEmail are required by the format: always present (empty unless configured; with
    # dawnbench.require the config refuses to start without them).
    e: dict = {"version": "v1.0", "author": d.author, "authorEmail": d.author_email}
    e["framework"] = d.framework or f"PyTorch {torch.__version__.split('+')[0]}"
    if d.code_url:
        e["codeURL"] = d.code_url
    if commit:
        e["commitHash"] = commit
    e["model"] = d.model or cfg.model.name
    if environment is not None and environment.instance_type and not d.hardware:
        hardware += f", {environment.provider or 'cloud'} {environment.instance_type}"
    e["hardware"] = d.hardware or hardware
    if d.cost_per_hour is not None:
        e["costPerHour"] = d.cost_per_hour
    e["timestamp"] = (day or datetime.date.today()).isoformat()
    momentum = {"momentum": o.momentum_schedule, "max_momentum": o.momentum} if o.get("momentum") is not None else {}
    if momentum and o.momentum_end is not None and o.momentum_schedule != "constant":
        momentum = {
            "momentum": o.momentum_schedule,
            "max_momentum": max(o.momentum, o.momentum_end),
            "min_momentum": min(o.momentum, o.momentum_end),
        }
    misc = {
        "optimizer": o.name,
        **_trust_ratio(o),
        "use_nesterov": o.get("nesterov", False),
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
        },
        "imageSize": [
            {
                "image_size": p.image_size,
                "epochs": p.epochs,
                "rect_val": p.rect_val,
                "min_scale": p.min_scale,
                "min_object_area": p.min_object_area,
                "val_image_size": p.val_image_size or p.image_size,
                "data": p.root,
            }
            for p in cfg.phases
        ],
        "batchSize": _blocks(cfg.phases, "batch_size"),
        "mixed_precision": cfg.run.amp != "none",
        "amp_dtype": cfg.run.amp,
        "channels_last": cfg.run.channels_last,
        "distributed training backend": cfg.comm.backend,
        "input pipeline": cfg.data.backend,
        "deployment backend": deployment(environ),
        "processes": summary["world_size"],
        "epochs": summary["epochs"],
        "iterations": summary["steps"],
        "target": {k: v for k, v in (("top1", cfg.run.target_top1), ("top5", cfg.run.target_top5)) if v is not None},
        "time_to_target_seconds": summary["time_to_target_seconds"],
        "train_seconds": summary["train_seconds"],
        "wall_seconds": summary["wall_seconds"],
        "final_top1": summary["final_top1"],
        "final_top5": summary["final_top5"],
        "val_images_counted": summary.get("val_count"),
        "val_images_blacklisted": summary.get("val_excluded", 0),
        "images_per_s": summary["images_per_s"],
    }
    if environment is not None:
        misc["environment"] = environment.to_dict()  # torch, cuda, cudnn, nccl, dali, driver, gpu_*, provider, ...
    if d.cost_per_hour is not None:
        # DAWNBench's cost: the price of the machines for the training time in the TSV.
        hours = (summary["time_to_target_seconds"] or summary["train_seconds"]) / 3600
        misc["cost_usd"] = round(d.cost_per_hour * hours, 4)
    e["misc"] = misc
    e["usedBlacklist"] = bool(cfg.data.get("val_blacklist", ""))  # the devkit's blacklisted images were not counted
    reasons = qualification(cfg, summary)
    e["qualifies"] = not reasons  # ours: a run that is no DAWNBench result says so at the top
    if reasons:
        e["notQualifyingBecause"] = reasons
    return e


def _trust_ratio(o) -> dict:
    """The layer trust-ratio hyperparameters under the record entry's names (etta, min/max_trust_ratio)."""
    reads = registry.OPTIMIZERS[o.name].reads
    if "eta" not in reads:
        return {"use_lars": False}
    out = {"use_lars": True, "etta": o.eta, "lars_momentum": o.lars_momentum, "adapt_bn_bias": o.adapt_bn_bias}
    if "trust_clip_min" in reads:
        out.update(min_trust_ratio=o.trust_clip_min, max_trust_ratio=o.trust_clip_max)
    return out


def write_entry(path: Path, cfg: Config, summary: dict, dist, commit: str = "") -> dict:
    """Write the entry for this run as `path` (rank 0 calls it at the end of `fit`), and a copy of it and of the
    TSV beside it under the entries repository's file name (`..._pytorch.not-qualifying.json` for a run that does
    not qualify, so that it cannot be taken for a result); prints `qualification_line`."""
    hardware = hardware_description(dist.world_size, dist.local_world_size, dist.device)
    counted = (summary.get("val_count") or 0) + (summary.get("val_excluded") or 0)
    root = cfg.data.get("root")  # None: a pipeline that makes its own images
    if counted == IMAGENET_VAL_IMAGES and root is not None and (Path(root) / "val").is_dir():
        # only a run whose count is ImageNet's pays for the 50,000 stat calls (a fraction of a second)
        summary = {**summary, "val_files": distinct_files(Path(root) / "val")}
    e = entry(cfg, summary, hardware, commit=commit, environment=collect())
    write_json(path, e, indent=4)
    stem = file_stem(cfg, dist.world_size, dist.local_world_size, dist.device)
    if not e["qualifies"]:
        stem = f"{stem}.{NOT_QUALIFYING}"
    print(qualification_line(e), flush=True)
    write_atomic(path.parent / f"{stem}.json", path.read_bytes())
    if path.with_suffix(".tsv").is_file():
        write_atomic(path.parent / f"{stem}.tsv", path.with_suffix(".tsv").read_bytes())
    return e


__all__ = [
    "check_required",
    "entry",
    "file_stem",
    "hardware_description",
    "missing_required",
    "required_problem",
    "qualification",
    "qualification_line",
    "write_entry",
]
