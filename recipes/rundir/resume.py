"""Resume agreed by all ranks: one checkpoint chosen, read by the rank that has it, sent to every rank.

Each rank's host may have its own run directory (local disks). The lowest rank of each distinct directory reads
the newest valid checkpoint of the current run there and reports its step; the rank with the newest sends the
whole checkpoint (model, optimizer, scaler, schedule and data position, every rank's RNG state and, mid-epoch,
every rank's BN running statistics) to all ranks over the process group. The checkpoint's recipe is then
compared with the current one: a change that alters the training refuses with the list of differences, unless
`checkpoint.resume=force`, which is recorded.

`Checkpointer.restore` (recipes/rundir/checkpointer.py) loads the agreed checkpoint into the objects holding state.
"""

from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from base import reader, registry
from base.errors import CheckpointError, RunDirError
from recipes.config import Config, to_dict
from recipes.config.schema import default_of, knob_fields, not_training_keys
from recipes.distributed import DistInfo, all_gather_object, broadcast_bytes
from recipes.rundir import checkpoint_files as ckpt
from recipes.rundir import files
from recipes.rundir.directory import RunDir
from recipes.rundir.payload import Checkpoint
from recipes.schedule import Schedule

# Keys that do not change what is trained (logging, output, checkpointing, where the data lives, timeouts, the
# targets that are only reported, the DAWNBench entry's labels): `trains=False` in the schema.
NOT_TRAINING = not_training_keys()


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


def _inert_default(key: str, value) -> bool:
    """A plug-in's own key (recipes/config/plugins.py) at its default: a config written before each plug-in owned its
    keys holds every plug-in's, and one the chosen part does not read changes nothing."""
    section, _, name = key.partition(".")
    known = knob_fields(section) if section in registry.SEAMS else {}
    return name in known and value == default_of(known[name][0])


def recipe_differences(old: dict, new: dict) -> list[str]:
    """`key: old -> new` for every training-changing key that differs (missing keys count as different, but for a
    plug-in's own key at its default)."""
    a, b = _flatten(old), _flatten(new)
    out = []
    for key in sorted(set(a) | set(b)):
        if key.startswith(NOT_TRAINING) or a.get(key, "<absent>") == b.get(key, "<absent>"):
            continue
        if (key not in a or key not in b) and _inert_default(key, a.get(key, b.get(key))):
            continue
        out.append(f"{key}: {a.get(key, '<absent>')!r} -> {b.get(key, '<absent>')!r}")
    return out


def compare(ck: Checkpoint, cfg: Config, classes: list, num_train: int, world: int) -> tuple[list[str], list[str]]:
    """(differences that change the training, notes) between a checkpoint and the current start."""
    problems = recipe_differences(ck.config or {}, to_dict(cfg))
    old_classes = ck.model_info.classes if ck.model_info is not None else None
    if old_classes is not None and list(old_classes) != list(classes):
        gone = [c for c in old_classes if c not in classes]
        new = [c for c in classes if c not in old_classes]
        what = f"missing {gone[:5]}" * bool(gone) + ", " * bool(gone and new) + f"new {new[:5]}" * bool(new)
        problems.append(f"class list: {len(old_classes)} -> {len(classes)} classes ({what or 'reordered'})")
    old_n = ck.num_train
    if old_n is not None and old_n != num_train:
        problems.append(f"training images: {old_n} -> {num_train}")
    notes = []
    old_world = ck.ranks
    if old_world != world:
        a = [e.steps for e in Schedule(cfg.phases, cfg.optim, num_images=num_train, world_size=old_world).epochs]
        b = [e.steps for e in Schedule(cfg.phases, cfg.optim, num_images=num_train, world_size=world).epochs]
        if a != b:
            problems.append(
                f"world size: {old_world} -> {world} processes changes the steps per epoch ({a[:3]}... -> "
                f"{b[:3]}...): the schedule and data position of step {ck.step} do not carry over; "
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
    checkpoint: Checkpoint
    source: str  # "<path> on host <h> (rank r)"
    reached: int  # the highest step any rank's progress.json recorded (work done after the checkpoint)
    reached_wall: float  # the run's wall-clock seconds at that step (0.0 where progress.json does not say)
    restarted: bool  # some agent restarted its workers (TORCHELASTIC_RESTART_COUNT > 0 on any rank)


def _progress(run_dir: Path) -> tuple[int, float, str | None]:
    """(the step this rank's progress.json recorded, the run's wall seconds then, why it was ignored): a hint, so a
    file that is not one a run wrote (not strict JSON, a step that is not a count, a FIFO) counts as step 0 with a
    warning, never as a number that is not a step; a wall time that is not a finite number >= 0 counts as 0.0."""
    path = run_dir / files.PROGRESS
    if not os.path.lexists(path):
        return 0, 0.0, None
    try:
        value = reader.read_json_object(path, what=files.PROGRESS, error=RunDirError, max_bytes=64 << 10)
    except RunDirError as e:
        return 0, 0.0, f"{e}; ignored"
    step, wall = value.get("step"), value.get("wall_seconds")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return 0, 0.0, f"{files.PROGRESS} '{path}' has step {str(step)[:40]}: expected an integer >= 0; ignored"
    ok = isinstance(wall, int | float) and not isinstance(wall, bool) and math.isfinite(wall) and wall >= 0
    return step, float(wall) if ok else 0.0, None


def agree_state(run: RunDir, dist: DistInfo, resume_from: str | None, resume, warn) -> Agreed | None:
    """The checkpoint every rank resumes from (the same on all ranks), or None for a fresh start."""
    local = None  # (checkpoint as a dict, path) read here
    if resume_from is not None:
        path = Path(resume_from)
        if run.leader and path.is_file():
            local = (ckpt.load(path), path)
    elif resume is not False and run.leader:
        local = ckpt.load_latest(run.path, warn=warn, run_id=None if run.legacy else run.run_id)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    reached, reached_wall, why = _progress(run.path)
    if why:
        warn(why)
    mine = {
        "rank": dist.rank,
        "host": socket.gethostname(),
        "step": None,
        "path": None,
        "reached": reached,
        "reached_wall": reached_wall,
        "restart": restart,
    }
    if local is not None:
        mine.update(step=Checkpoint.from_dict(*local).step, path=str(local[1]))
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
    ck = Checkpoint.from_dict(state, best["path"])
    if run.legacy and ck.run_id:
        run.run_id = ck.run_id
    elif resume_from is None and ck.run_id not in (None, run.run_id):
        raise RunDirError(f"checkpoint '{best['path']}' belongs to run {ck.run_id}, not {run.run_id}")
    return Agreed(
        ck,
        f"{best['path']} on host {best['host']} (rank {best['rank']})",
        max(r["reached"] for r in reports),
        max(reports, key=lambda r: r["reached"])["reached_wall"],
        any(r["restart"] for r in reports),
    )
