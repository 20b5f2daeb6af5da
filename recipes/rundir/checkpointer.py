"""One object that saves and restores a run: `Checkpointer.save(step)` and `Checkpointer.restore(resume_from)`.

It holds the objects whose state a checkpoint keeps (model, optimizer, grad scaler, allreduce backend) and the
training `State` (steps, epoch, data position, time, restart accounting), like torchtitan's checkpoint manager
over its stateful objects. What it writes is a `Checkpoint` (recipes/rundir/payload.py); where, how and under which
names is recipes/rundir/checkpoint_files.py and recipes/rundir/files.py; which checkpoint every rank resumes from is
recipes/rundir/resume.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from base.errors import CheckpointError, RunDirError
from models.factory import check_compatible, describe_model
from recipes.config import Config, to_dict
from recipes.distributed import DistInfo, all_gather_object, collective_guard
from recipes.metrics import format_seconds
from recipes.optim import apply_config
from recipes.rundir import checkpoint_files as ckpt
from recipes.rundir.directory import RunDir
from recipes.rundir.payload import Checkpoint, ModelInfo, State
from recipes.rundir.resume import agree_state, compare
from recipes.rundir.state_checks import comm_state_problem, optimizer_state_problem, scaler_state_problem
from recipes.schedule import Schedule


@dataclass
class Parts:
    """The objects a checkpoint holds the state_dicts of."""

    model: object
    optimizer: object
    scaler: object
    comm: object
    ema: object = None  # timm's ModelEmaV3 (run.ema), or None


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


# Settings whose change makes a checkpoint's state of that part meaningless to the new part: with
# checkpoint.resume=force the part starts afresh (and says so) instead of loading a state of another kind.
_STATE_KIND = {"optimizer": ("optim.name",), "scaler": ("run.amp",), "comm": ("comm.backend",)}


def fresh_parts(old: dict, new: dict) -> dict[str, str]:
    """{part: 'key: old -> new'} for the parts whose state in the checkpoint is of another kind than the run's."""
    out = {}
    for part, keys in _STATE_KIND.items():
        for key in keys:
            section, name = key.split(".")
            a, b = (d[section].get(name) if isinstance(d.get(section), dict) else None for d in (old, new))
            if a != b:
                out[part] = f"{key} {a!r} -> {b!r}"
    return out


class Checkpointer:
    """Saves the run's state into its directory and restores it from there (or from `--resume`)."""

    def __init__(self, run: RunDir, dist: DistInfo, cfg: Config, data, parts: Parts, log):
        self.run, self.dist, self.cfg, self.data, self.parts, self.log = run, dist, cfg, data, parts, log
        self.state = State()

    def check_space(self) -> None:
        """Fail before training when the directory cannot hold two checkpoints (the new one and the previous)."""
        if self.dist.is_main:
            needed = ckpt.estimate_bytes(self.parts.model, self.dist.world_size)
            if self.parts.ema is not None:  # its weights and BN statistics again (overestimated by an optimizer slot)
                needed += ckpt.estimate_bytes(self.parts.ema.module, self.dist.world_size)
            ckpt.check_writable(self.run.path, 2 * needed)

    def snapshot(self, rngs: list, bn: list | None = None, ema_bn: list | None = None) -> Checkpoint:
        """The checkpoint of the run at step `state.step` (`rngs`: every rank's RNG state; `bn` and `ema_bn`: every
        rank's `bn_statistics` of the model and of its EMA, for a mid-epoch checkpoint of several ranks)."""
        p, cfg = self.parts, self.cfg
        return Checkpoint(
            model=p.model.state_dict(),
            optimizer=p.optimizer.state_dict(),
            scaler=p.scaler.state_dict(),
            comm=p.comm.state_dict(),
            state=self.state.__dict__,
            rng=rngs,
            config=to_dict(cfg),
            run_id=self.run.run_id,
            world_size=self.dist.world_size,
            num_train=self.data.num_train,
            model_info=ModelInfo(
                name=cfg.model.name,
                num_classes=self.data.num_classes,
                classes=self.data.classes,
                num_params=describe_model(p.model)["num_params"],
            ),
            bn_per_rank=bn,
            ema=p.ema.module.state_dict() if p.ema is not None else None,
            ema_bn_per_rank=ema_bn,
        )

    def save(self, step: int) -> None:
        """Write the checkpoint of step `step` (all ranks call it: it gathers every rank's RNG state)."""
        if step != self.state.step:
            raise RuntimeError(f"checkpoint of step {step} asked for, but the training state is at {self.state.step}")
        # Mid-epoch, each rank's BN running statistics are its own until validation averages them: keep them all.
        mid_epoch = self.state.epoch_step > 0 and self.dist.world_size > 1
        ema = self.parts.ema
        mine = {"rng": ckpt.rng_state(), "bn": bn_statistics(self.parts.model) if mid_epoch else None}
        mine["ema_bn"] = bn_statistics(ema.module) if mid_epoch and ema is not None else None
        with collective_guard("checkpoint RNG-state gather", step, self.cfg.dist.timeout_s):
            gathered = all_gather_object(mine, self.dist)
        rngs, bn = [g["rng"] for g in gathered], ([g["bn"] for g in gathered] if mid_epoch else None)
        ema_bn = [g["ema_bn"] for g in gathered] if mid_epoch and ema is not None else None
        if self.run.leader:  # one writer per distinct run directory: every host with a disk of its own keeps a copy
            state = self.snapshot(rngs, bn, ema_bn).to_dict()
            ckpt.save_step_checkpoint(state, self.run.path, step, self.cfg.checkpoint.keep)

    def restore(self, resume_from: str | None = None) -> State:
        """The State to train on from: a fresh one, or the agreed checkpoint's, loaded into the parts on every rank.

        Counts a restart (and the steps it redoes: those after the checkpoint that some rank had logged) when an
        agent restarted its workers or a rank's progress.json is ahead of the checkpoint.
        """
        run, dist, cfg, log, parts = self.run, self.dist, self.cfg, self.log, self.parts
        agreed = agree_state(run, dist, resume_from, cfg.checkpoint.resume, log.warn)
        if agreed is None:
            log.info(f"run {run.run_id}: starting from step 0")
            self.state = State()
            return self.state
        ck, path = agreed.checkpoint, agreed.source
        problems, notes = compare(ck, cfg, self.data.classes, self.data.num_train, dist.world_size)
        if problems and cfg.checkpoint.resume != "force":
            raise RunDirError(
                f"cannot resume from {path}: the recipe differs from the checkpoint's in what it trains:\n  "
                + "\n  ".join(problems)
                + "\nrestore these values, start a new run (another run.name, or checkpoint.resume=false, which "
                "moves the old run's files aside), or continue anyway with checkpoint.resume=force (recorded)"
            )
        ck.path = path
        st = ck.training_state()
        plan = Schedule(cfg.phases, cfg.optim, num_images=self.data.num_train, world_size=dist.world_size)
        where = position_problem(st, plan, exact=not problems)
        if where:
            raise CheckpointError(f"checkpoint '{path}': entry 'state' {where}")
        check_compatible(parts.model, ck.model, str(path))
        parts.model.load_state_dict(ck.model)
        fresh = fresh_parts(ck.config or {}, to_dict(cfg)) if problems else {}
        for name in ("optimizer", "scaler", "comm"):
            if name in fresh:
                notes.append(f"checkpoint.resume=force: {fresh[name]}: the {name} state starts afresh")
                continue
            state = getattr(ck, name) or {}
            problem = {"scaler": scaler_state_problem, "comm": comm_state_problem}.get(name, lambda _: None)(state)
            if problem is None:
                try:
                    getattr(parts, name).load_state_dict(state)
                except (KeyError, ValueError, RuntimeError, TypeError, IndexError, AttributeError) as e:
                    problem = f"does not fit this run's {name} ({ckpt.first_line(e)})"
            if problem is None and name == "optimizer":
                # checked against the parameters before any step reads it: a wrong shape crashes fused kernels
                problem = optimizer_state_problem(parts.optimizer)
            if problem is not None:
                raise CheckpointError(f"checkpoint '{path}': entry '{name}' {problem}")
        if "optimizer" not in fresh:
            # load_state_dict restored the checkpoint's weight decay, eta, trust clip, ...: train with the config's
            # (they differ only under checkpoint.resume=force)
            notes += [f"optimizer group {c} (config)" for c in apply_config(parts.optimizer, cfg.optim, parts.model)]
        for line in notes:
            log.info(f"resume: {line}")
        if problems:
            st.forced.append({"step": st.step, "differences": problems})
            log.warn("checkpoint.resume=force: continuing despite " + "; ".join(problems))
        if len(ck.rng) == dist.world_size:
            ckpt.set_rng_state(ck.rng[dist.rank])
        if ck.bn_per_rank is not None and len(ck.bn_per_rank) == dist.world_size:
            load_bn_statistics(parts.model, ck.bn_per_rank[dist.rank], str(path))
        self._restore_ema(ck, str(path))
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        lost = max(0, min(agreed.reached, plan.total_steps) - st.step)  # no rank logged a step the plan lacks
        redo = agreed.restarted or lost
        # the lost steps' first run: between the checkpoint and the last logged step, not in wall_seconds
        lost_s = max(0.0, agreed.reached_wall - st.wall_seconds) if lost else 0.0
        if redo:
            st.restarts += 1
            st.redone_steps += lost
            st.lost_seconds += lost_s
        log.info(
            f"resumed from {path}: {st.epoch} epoch(s) + {st.epoch_step} step(s) into epoch {st.epoch + 1}, "
            f"{st.step} step(s) done, run {run.run_id}"
            + (f"; restart {restart} after a failure" if restart else "")
            + (
                f"; the run had reached step {st.step + lost}: {lost} step(s) will be redone"
                + (f" ({format_seconds(lost_s)} of work lost)" if lost_s else "")
                if redo
                else ""
            )
        )
        self.state = st
        return st

    def _restore_ema(self, ck: Checkpoint, path: str) -> None:
        """Load the EMA of run.ema from the checkpoint; one without it starts the EMA from the restored weights."""
        ema = self.parts.ema
        if ema is None:
            if ck.ema is not None:
                self.log.info("resume: the checkpoint's EMA weights are dropped (run.ema=false)")
            return
        if ck.ema is None:
            ema.set(self.parts.model)
            self.log.info("resume: the checkpoint has no EMA (run.ema was off): the EMA starts from its weights")
            return
        check_compatible(ema.module, ck.ema, f"{path} (entry 'ema')")
        ema.module.load_state_dict(ck.ema)
        per_rank = ck.ema_bn_per_rank
        if per_rank is not None and len(per_rank) == self.dist.world_size:
            load_bn_statistics(ema.module, per_rank[self.dist.rank], path)


def position_problem(st: State, plan: Schedule, *, exact: bool) -> str | None:
    """Why the training position of a checkpoint cannot be one of this plan's (None: it can). `exact`: the recipe is
    the checkpoint's, so step must be the epoch's first step plus the steps done in it; under resume=force with
    another schedule only the bounds hold."""
    n, total = len(plan.epochs), plan.total_steps
    if st.epoch > n or st.step > total:
        return f"is at epoch {st.epoch}, step {st.step}: beyond this recipe's {n} epochs and {total} steps"
    if st.epoch == n:
        return None if st.epoch_step == 0 else f"has finished every epoch, yet 'epoch_step' is {st.epoch_step}"
    info = plan.epoch_info(st.epoch)
    if st.epoch_step >= info.steps:
        return f"has 'epoch_step' {st.epoch_step}: epoch {st.epoch + 1} has {info.steps} steps"
    if exact and st.step != info.first_step + st.epoch_step:
        return (
            f"has step {st.step}, but epoch {st.epoch + 1} + {st.epoch_step} step(s) is step "
            f"{info.first_step + st.epoch_step} of this recipe"
        )
    return None
