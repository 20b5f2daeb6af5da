"""Resume agreed by all ranks: one checkpoint chosen, read by the rank that has it, sent to every rank.

Each rank's host may have its own run directory (local disks). The lowest rank of each distinct directory reads
the newest valid checkpoint of the current run there and reports its step; the rank with the newest sends the
whole checkpoint (model, optimizer, scaler, schedule and data position, every rank's RNG state and, mid-epoch,
every rank's BN running statistics) to all ranks over the process group. The checkpoint's recipe is then
compared with the current one: a change that alters the training refuses with the list of differences, unless
`checkpoint.resume=force`, which is recorded.

`State` is what a checkpoint restores besides the modules' state_dicts (steps, epoch, data position, training
time, restart accounting); `snapshot` makes a checkpoint, `restore` reads the agreed one back into the modules
and counts a restart and the steps it redoes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from models.factory import check_compatible, describe_model
from recipes import checkpoint as ckpt
from recipes import run_files as files
from recipes.checkpoint import CheckpointError
from recipes.config import Config, to_dict
from recipes.distributed import DistInfo, all_gather_object, broadcast_bytes
from recipes.rundir import RunDir, RunDirError
from recipes.schedule import Plan

# Keys that do not change what is trained: logging, output, checkpointing, where the data lives, how long a
# collective may take, the targets that are only reported, and the DAWNBench entry's labels.
NOT_TRAINING = (
    "run.name",
    "run.out_dir",
    "run.threads",
    "run.target_top1",
    "run.target_top5",
    "run.stop_at_target",
    "run.nodes",
    "run.procs_per_node",
    "data.root",
    "data.roots",
    "data.workers",
    "data.val_batch_size",
    "data.dali_prefetch",
    "dist.",
    "log.",
    "checkpoint.",
    "dawnbench.",
    "comm.tune_cache",
)


@dataclass
class State:
    """Everything that a resume must restore besides the modules' own state_dicts."""

    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps taken
    train_seconds: float = 0.0  # training time only (DAWNBench excludes validation and checkpointing)
    wall_seconds: float = 0.0
    images: int = 0  # training images processed, all ranks
    history: list = field(default_factory=list)  # one dict per epoch: epoch, train_seconds, top1, top5, ...
    skipped_steps: int = 0
    epoch_step: int = 0  # steps done inside the current epoch (mid-epoch checkpoint = data position)
    epoch_seconds: float = 0.0  # training time already spent in the current epoch
    epoch_images: int = 0
    restarts: int = 0  # recoveries from a checkpoint after a failure
    redone_steps: int = 0  # steps trained twice because they came after the last checkpoint
    forced: list = field(default_factory=list)  # recipe differences accepted with checkpoint.resume=force


@dataclass
class Parts:
    """What a checkpoint holds the state_dicts of."""

    model: object
    optimizer: object
    scaler: object
    comm: object


def _flatten(value, prefix: str = "") -> dict:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        out = {f"{prefix}length": len(value)}
        for i, v in enumerate(value):
            out.update(_flatten(v, f"{prefix}{i}."))
        return out
    return {prefix[:-1]: value}


def recipe_differences(old: dict, new: dict) -> list[str]:
    """`key: old -> new` for every training-changing key that differs (missing keys count as different)."""
    a, b = _flatten(old), _flatten(new)
    out = []
    for key in sorted(set(a) | set(b)):
        if key.startswith(NOT_TRAINING) or a.get(key, "<absent>") == b.get(key, "<absent>"):
            continue
        out.append(f"{key}: {a.get(key, '<absent>')!r} -> {b.get(key, '<absent>')!r}")
    return out


def compare(state: dict, cfg: Config, classes: list, num_train: int, world: int) -> tuple[list[str], list[str]]:
    """(differences that change the training, notes) between a checkpoint and the current start."""
    problems = recipe_differences(state.get("config", {}), to_dict(cfg))
    old_classes = (state.get("model_info") or {}).get("classes")
    if old_classes is not None and list(old_classes) != list(classes):
        gone = [c for c in old_classes if c not in classes]
        new = [c for c in classes if c not in old_classes]
        what = f"missing {gone[:5]}" * bool(gone) + ", " * bool(gone and new) + f"new {new[:5]}" * bool(new)
        problems.append(f"class list: {len(old_classes)} -> {len(classes)} classes ({what or 'reordered'})")
    old_n = state.get("num_train")
    if old_n is not None and old_n != num_train:
        problems.append(f"training images: {old_n} -> {num_train}")
    notes = []
    old_world = state.get("world_size", len(state.get("rng", [])))
    if old_world != world:
        a = [e.steps for e in Plan(cfg, num_train, old_world).epochs]
        b = [e.steps for e in Plan(cfg, num_train, world).epochs]
        if a != b:
            problems.append(
                f"world size: {old_world} -> {world} processes changes the steps per epoch ({a[:3]}... -> "
                f"{b[:3]}...): the schedule and data position of step {state['state']['step']} do not carry over; "
                f"resume with {old_world} processes"
            )
        else:
            notes.append(
                f"world size {old_world} -> {world}: every step reads the same global batch as before (one "
                f"permutation per epoch, split by rank), so the data order carries over; the per-rank "
                f"augmentation RNG streams (and, mid-epoch, the per-rank BN statistics) start afresh, so the result "
                f"is not bit-identical to an unchanged run"
            )
    return problems, notes


@dataclass
class Agreed:
    state: dict
    source: str  # "<path> on host <h> (rank r)"
    reached: int  # the highest step any rank's progress.json recorded (work done after the checkpoint)
    restarted: bool  # some agent restarted its workers (TORCHELASTIC_RESTART_COUNT > 0 on any rank)


def _progress(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / files.PROGRESS).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def agree_state(run: RunDir, dist: DistInfo, resume_from: str | None, resume, warn) -> Agreed | None:
    """The checkpoint every rank resumes from (the same on all ranks), or None for a fresh start."""
    local = None  # (state, path) read here
    if resume_from is not None:
        path = Path(resume_from)
        if run.leader and path.is_file():
            local = (ckpt.load(path), path)
    elif resume is not False and run.leader:
        local = ckpt.load_latest(run.path, warn=warn, run_id=None if run.legacy else run.run_id)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    mine = {
        "rank": dist.rank,
        "host": socket.gethostname(),
        "step": None,
        "path": None,
        "reached": _progress(run.path),
        "restart": restart,
    }
    if local is not None:
        mine.update(step=int(local[0]["state"]["step"]), path=str(local[1]))
    reports = all_gather_object(mine, dist)
    have = [r for r in reports if r["step"] is not None]
    if not have:
        if resume_from is not None:
            raise CheckpointError(f"--resume: checkpoint '{resume_from}' not found (on no rank's host)")
        return None
    best = max(have, key=lambda r: (r["step"], -r["rank"]))
    data = ckpt.to_bytes(local[0]) if dist.rank == best["rank"] else None
    data = broadcast_bytes(data, best["rank"], dist)
    state = local[0] if dist.rank == best["rank"] else ckpt.from_bytes(data, f"from rank {best['rank']}")
    if run.legacy and state.get("run_id"):
        run.run_id = state["run_id"]
    elif resume_from is None and state.get("run_id") not in (None, run.run_id):
        raise RunDirError(f"checkpoint '{best['path']}' belongs to run {state['run_id']}, not {run.run_id}")
    return Agreed(
        state,
        f"{best['path']} on host {best['host']} (rank {best['rank']})",
        max(r["reached"] for r in reports),
        any(r["restart"] for r in reports),
    )


def bn_statistics(model: nn.Module) -> dict[str, torch.Tensor]:
    """This rank's BN running statistics (CPU copies), by state_dict name.

    They stay per rank during an epoch (no buffer broadcast; averaged before validation), so a mid-epoch
    checkpoint keeps every rank's own: restoring rank 0's on every rank would change the epoch's averaged result.
    """
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            prefix = f"{name}." if name else ""
            out[prefix + "running_mean"] = m.running_mean.detach().cpu().clone()
            out[prefix + "running_var"] = m.running_var.detach().cpu().clone()
    return out


def load_bn_statistics(model: nn.Module, stats: dict, path: str) -> None:
    """Copy one rank's `bn_statistics` back into `model`'s buffers."""
    buffers = dict(model.named_buffers())
    for name, value in stats.items():
        if name not in buffers or not isinstance(value, torch.Tensor) or value.shape != buffers[name].shape:
            raise CheckpointError(f"checkpoint '{path}': entry 'bn_per_rank' does not fit the model at '{name}'")
        with torch.no_grad():
            buffers[name].copy_(value)


def snapshot(
    parts: Parts, st: State, rngs: list, cfg: Config, run_id: str, world_size: int, data, bn: list | None = None
) -> dict:
    """The checkpoint of the run at step `st.step`: what `restore` reads back (`rngs`: every rank's RNG state;
    `bn`: every rank's `bn_statistics`, for a mid-epoch checkpoint of several ranks)."""
    extra = {"bn_per_rank": bn} if bn is not None else {}
    return {
        **extra,
        "model": parts.model.state_dict(),
        "optimizer": parts.optimizer.state_dict(),
        "scaler": parts.scaler.state_dict(),
        "comm": parts.comm.state_dict(),
        "state": st.__dict__,
        "rng": rngs,
        "config": to_dict(cfg),
        "run_id": run_id,
        "world_size": world_size,
        "num_train": data.num_train,
        "model_info": {
            "name": cfg.model.name,
            "num_classes": data.num_classes,
            "classes": data.classes,
            "num_params": describe_model(parts.model)["num_params"],
        },
    }


def restore(run: RunDir, dist: DistInfo, cfg: Config, data, parts: Parts, resume_from: str | None, log) -> State:
    """The State to train on from: a fresh one, or the agreed checkpoint's, loaded into `parts` on every rank.

    Counts a restart (and the steps it redoes: those after the checkpoint that some rank had logged) when an
    agent restarted its workers or a rank's progress.json is ahead of the checkpoint.
    """
    agreed = agree_state(run, dist, resume_from, cfg.checkpoint.resume, log.warn)
    if agreed is None:
        log.info(f"run {run.run_id}: starting from step 0")
        return State()
    state, path = agreed.state, agreed.source
    problems, notes = compare(state, cfg, data.classes, data.num_train, dist.world_size)
    if problems and cfg.checkpoint.resume != "force":
        raise RunDirError(
            f"cannot resume from {path}: the recipe differs from the checkpoint's in what it trains:\n  "
            + "\n  ".join(problems)
            + "\nrestore these values, start a new run (another run.name, or checkpoint.resume=false, which "
            "moves the old run's files aside), or continue anyway with checkpoint.resume=force (recorded)"
        )
    ckpt.check_resumable(state, path, {f.name for f in dataclasses.fields(State)})
    check_compatible(parts.model, state["model"], str(path))
    parts.model.load_state_dict(state["model"])
    parts.optimizer.load_state_dict(state["optimizer"])
    parts.scaler.load_state_dict(state["scaler"])
    parts.comm.load_state_dict(state.get("comm", {}))
    st = State(**state["state"])
    for line in notes:
        log.info(f"resume: {line}")
    if problems:
        st.forced.append({"step": st.step, "differences": problems})
        log.warn("checkpoint.resume=force: continuing despite " + "; ".join(problems))
    rngs = state["rng"]
    if len(rngs) == dist.world_size:
        ckpt.set_rng_state(rngs[dist.rank])
    bn = state.get("bn_per_rank")
    if bn is not None and len(bn) == dist.world_size:
        load_bn_statistics(parts.model, bn[dist.rank], str(path))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    lost = max(0, agreed.reached - st.step)
    redo = agreed.restarted or lost
    if redo:
        st.restarts += 1
        st.redone_steps += lost
    log.info(
        f"resumed from {path}: {st.epoch} epoch(s) + {st.epoch_step} step(s) into epoch {st.epoch + 1}, "
        f"{st.step} step(s) done, run {run.run_id}"
        + (f"; restart {restart} after a failure" if restart else "")
        + (f"; the run had reached step {st.step + lost}: {lost} step(s) will be redone" if redo else "")
    )
    return st
