"""The training loop: `train(cfg)` runs the whole plan; `train_one_epoch` and `evaluate` are its two halves.

The loop talks to four pieces through factories chosen by name in the config: the input pipeline
(`data.create_input`), the model (`models.create_model`), the optimizer (`recipes.optim.create_optimizer`)
and the gradient allreduce backend (`recipes.comm.create_allreduce`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as td
from torch import nn

from data import create_input
from models import create_model
from models.factory import check_compatible, describe_model
from recipes import checkpoint as ckpt
from recipes import run_files as files
from recipes.comm import create_allreduce
from recipes.config import Config, to_dict, to_yaml
from recipes.dawnbench import check_required, write_entry
from recipes.distributed import DistInfo, all_gather_object, all_reduce_sum, setup, teardown
from recipes.errors import NonFiniteError, TrainingError
from recipes.logger import RunLogger, format_seconds, write_tsv
from recipes.optim import create_optimizer, describe_groups, set_lr_momentum, skips_on_device
from recipes.resume import agree_state, compare
from recipes.rundir import RunDirError, open_run, write_run_file
from recipes.schedule import Plan


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


_PEER_FAILURE = ("timed out", "timeout", "connection closed", "connection reset", "broken pipe", "peer")


@contextmanager
def collective_guard(what: str, step: int, timeout_s: float):
    """Turn a collective's timeout or lost connection into an error that names the collective and the step."""
    try:
        yield
    except RuntimeError as e:
        text = str(e).lower()
        if isinstance(e, TrainingError) or not any(k in text for k in _PEER_FAILURE):
            raise
        first = str(e).strip().splitlines()[0][:300]
        raise TrainingError(
            f"{what} at step {step} failed: a peer is dead or hung (dist.timeout_s={timeout_s:g}); "
            f"underlying error: {first}"
        ) from e


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def run_dir_for(cfg: Config) -> Path:
    return Path(cfg.run.out_dir) / cfg.run.name


def _accuracy_counts(logits: torch.Tensor, labels: torch.Tensor) -> tuple[int, int]:
    k = min(5, logits.shape[1])
    top = logits.topk(k, dim=1).indices
    hit = top.eq(labels.view(-1, 1))
    return int(hit[:, :1].sum()), int(hit.any(dim=1).sum())


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
    if bad:
        # top-k of NaN logits picks arbitrary classes: an accuracy computed from them means nothing.
        raise NonFiniteError(
            f"validation: {int(bad)} of {n} images got non-finite logits (NaN/inf weights or activations); "
            "no accuracy is reported"
        )
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


class Trainer:
    """Holds the pieces of one run; `fit()` runs the plan."""

    def __init__(self, cfg: Config, run_dir: Path | None = None, resume_from: str | None = None):
        check_required(cfg)  # before any work: the entry written at the end must be complete
        self.cfg = cfg
        self.dist = setup(cfg)
        self.run_dir = Path(run_dir) if run_dir else run_dir_for(cfg)
        self.run = None
        self.log = RunLogger(self.run_dir, False, False)
        try:
            # Before anything is written there: the lock, and the one run id all ranks agree on.
            self.run = open_run(self.run_dir, self.dist, cfg.checkpoint.resume)
            self.log = RunLogger(self.run_dir, self.dist.is_main, cfg.log.tensorboard)
            self._build(resume_from)
        except BaseException:
            self.close()
            raise

    def _build(self, resume_from: str | None) -> None:
        cfg, dist = self.cfg, self.dist
        for note in self.run.notes:
            self.log.info(note)
        if cfg.run.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        torch.manual_seed(cfg.run.seed)  # identical initial weights on every rank
        self.data = create_input(cfg, dist)
        self.plan = Plan(cfg, self.data.num_train, dist.world_size)
        model = create_model(cfg.model, self.data.num_classes).to(dist.device)
        if cfg.run.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model
        self.optimizer = create_optimizer(cfg.optim, model)
        self.scaler = torch.amp.GradScaler(dist.device.type, enabled=cfg.run.amp == "fp16")
        self.comm = create_allreduce(cfg, dist)
        self.criterion = create_criterion(cfg)
        self.state = State()
        self._pending: list = []  # (step, epoch, non-finite flag, loss, fp16 scale) of steps not yet settled
        torch.manual_seed(cfg.run.seed + 1000 * dist.rank)  # per-rank randomness; a resume restores it
        if cfg.checkpoint.enabled and dist.is_main:
            ckpt.check_writable(self.run_dir, 2 * self._checkpoint_bytes())
        self._maybe_resume(resume_from)
        if self.run.leader:  # after the resume checks: a refused start leaves the run's files as they were
            write_run_file(self.run_dir, self.run.run_id)
        if dist.is_main:
            (self.run_dir / files.CONFIG).write_text(to_yaml(cfg))
            meta = {
                "git_commit": git_commit(),
                "world_size": dist.world_size,
                "device": str(dist.device),
                "torch": torch.__version__,
                "run_id": self.run.run_id,
            }
            (self.run_dir / files.META).write_text(json.dumps(meta, indent=1) + "\n")
        self.train_model, self.optimizer = self.comm.prepare(self.model, self.optimizer)
        amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.run.amp)
        if amp_dtype is None:
            self.amp_ctx = nullcontext
        else:
            self.amp_ctx = lambda: torch.autocast(dist.device.type, dtype=amp_dtype)
        self.log.info(
            f"run {self.run_dir}: {dist.world_size} process(es) on {dist.device}, model {cfg.model.name} "
            f"({sum(p.numel() for p in model.parameters()):,} params), optimizer {cfg.optim.name}, "
            f"data {cfg.data.backend} ({self.data.num_train} train / {self.data.num_val} val images, "
            f"{self.data.num_classes} classes), allreduce {cfg.comm.backend}"
        )
        for line in describe_groups(self.optimizer):
            self.log.info(line)
        self.log.info(self.plan.table())

    # -- checkpoints ------------------------------------------------------------------------------------
    def _checkpoint_bytes(self) -> int:
        """Rough size of a checkpoint: weights and buffers plus one optimizer slot per parameter, plus slack."""
        model = sum(t.numel() * t.element_size() for t in self.model.state_dict().values())
        params = sum(p.numel() * p.element_size() for p in self.model.parameters())
        return int(1.1 * (model + params)) + (1 << 20)

    def _progress_path(self) -> Path:
        return self.run_dir / files.PROGRESS

    def _maybe_resume(self, resume_from: str | None) -> None:
        cfg, dist = self.cfg, self.dist
        agreed = agree_state(self.run, dist, resume_from, cfg.checkpoint.resume, self.log.warn)
        if agreed is None:
            self.log.info(f"run {self.run.run_id}: starting from step 0")
            return
        state, path = agreed.state, agreed.source
        problems, notes = compare(state, cfg, self.data.classes, self.data.num_train, dist.world_size)
        if problems and cfg.checkpoint.resume != "force":
            raise RunDirError(
                f"cannot resume from {path}: the recipe differs from the checkpoint's in what it trains:\n  "
                + "\n  ".join(problems)
                + "\nrestore these values, start a new run (another run.name, or checkpoint.resume=false, which "
                "moves the old run's files aside), or continue anyway with checkpoint.resume=force (recorded)"
            )
        ckpt.check_resumable(state, path, {f.name for f in dataclasses.fields(State)})
        check_compatible(self.model, state["model"], str(path))
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.comm.load_state_dict(state.get("comm", {}))
        self.state = State(**state["state"])
        for line in notes:
            self.log.info(f"resume: {line}")
        if problems:
            self.state.forced.append({"step": self.state.step, "differences": problems})
            self.log.warn("checkpoint.resume=force: continuing despite " + "; ".join(problems))
        rngs = state["rng"]
        if len(rngs) == dist.world_size:
            ckpt.set_rng_state(rngs[dist.rank])
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        lost = max(0, agreed.reached - self.state.step)
        if agreed.restarted or lost:
            self.state.restarts += 1
            self.state.redone_steps += lost
        self.log.info(
            f"resumed from {path}: {self.state.epoch} epoch(s) + {self.state.epoch_step} step(s) into epoch "
            f"{self.state.epoch + 1}, {self.state.step} step(s) done, run {self.run.run_id}"
            + (f"; restart {restart} after a failure" if restart else "")
            + (
                f"; the run had reached step {self.state.step + lost}: {lost} step(s) will be redone"
                if agreed.restarted or lost
                else ""
            )
        )

    def save_checkpoint(self) -> None:
        with collective_guard("checkpoint RNG-state gather", self.state.step, self.cfg.dist.timeout_s):
            rngs = all_gather_object(ckpt.rng_state(), self.dist)
        if not self.run.leader:  # one writer per distinct run directory: every host with a disk of its own keeps a copy
            return
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "comm": self.comm.state_dict(),
            "state": self.state.__dict__,
            "rng": rngs,
            "config": to_dict(self.cfg),
            "run_id": self.run.run_id,
            "world_size": self.dist.world_size,
            "num_train": self.data.num_train,
            "model_info": {
                "name": self.cfg.model.name,
                "num_classes": self.data.num_classes,
                "classes": self.data.classes,
                "num_params": describe_model(self.model)["num_params"],
            },
        }
        ckpt.save_step_checkpoint(state, self.run_dir, self.state.step, self.cfg.checkpoint.keep)

    # -- the loop ---------------------------------------------------------------------------------------
    def _nonfinite_flag(self) -> torch.Tensor:
        """1.0 if any gradient is inf/nan, else 0.0: a float tensor on the device (GradScaler's found_inf form)."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if not grads:
            return torch.zeros(1, device=self.dist.device)
        return (~torch.isfinite(torch.stack(torch._foreach_norm(grads)).sum())).float().reshape(1)

    def _step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One optimizer step; returns the loss. Non-finite gradients halt or skip per run.on_nonfinite.

        The step is skipped on the device (`found_inf`, as GradScaler does for fused optimizers), and the host
        learns of it in `_settle`, every log.every_steps steps and before a checkpoint: no sync per step.
        """
        st = self.state
        with self.amp_ctx():
            loss = self.criterion(self.train_model(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        with collective_guard(
            f"gradient allreduce (comm.backend={self.cfg.comm.backend})", st.step, self.cfg.dist.timeout_s
        ):
            self.scaler.scale(loss).backward()
            if self.scaler.is_enabled():
                scale_before = self.scaler._get_scale_async().clone()
                self.scaler.step(self.optimizer)
                self.scaler.update()
                # GradScaler lowers the scale exactly when it skipped the step (fp16 overflow)
                bad = self.scaler._get_scale_async() < scale_before
                self._pending.append((st.step, st.epoch, bad, loss.detach(), scale_before))
            else:
                # Gradients are already averaged over ranks here, so every rank takes the same decision.
                found = self._nonfinite_flag()
                if skips_on_device(self.optimizer):
                    self.optimizer.found_inf = found
                    try:
                        self.optimizer.step()
                    finally:
                        del self.optimizer.found_inf
                elif not bool(found):  # an optimizer without device-side skipping (lamb): decided on the host
                    self.optimizer.step()
                self._pending.append((st.step, st.epoch, found, loss.detach(), None))
        st.step += 1
        st.epoch_step += 1
        self.comm.on_step_end(st.step, self.log)
        return loss

    def _settle(self) -> None:
        """Read the pending steps' non-finite flags (one host sync) and count, log or halt as each step would."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        flags = torch.cat([f.reshape(1).float() for _, _, f, _, _ in pending]).tolist()
        st = self.state
        for (step, epoch, _, loss, scale), bad in zip(pending, flags, strict=True):
            if not bad:
                continue
            st.skipped_steps += 1
            if scale is not None:
                self.log.warn(f"step {step}: fp16 gradients overflowed; step skipped (scale {float(scale):g})")
                continue
            what = f"non-finite loss/gradients at step {step} (epoch {epoch + 1}, loss {float(loss):g})"
            if self.cfg.run.on_nonfinite == "halt":
                raise TrainingError(f"{what}: halting (run.on_nonfinite=halt; 'skip' skips such steps)")
            self.log.warn(f"{what}: step skipped ({st.skipped_steps} so far; run.on_nonfinite=skip)")

    def train_one_epoch(self, epoch: int) -> dict:
        """Train epoch `epoch` from the data position in the state (0 unless resumed mid-epoch)."""
        cfg, plan, st = self.cfg, self.plan, self.state
        info = plan.epoch_info(epoch)
        start = st.epoch_step
        t0 = mark = window_t = time.perf_counter()  # building the input pipeline (DALI: per phase) is training time
        batches = self.data.train_batches(info, start_step=start)
        self.train_model.train()
        every, ckpt_every = cfg.log.every_steps, cfg.checkpoint.every_steps
        window_imgs = 0
        loss_acc = torch.zeros((), device=self.dist.device)
        loss_n = 0
        i = start - 1
        for i, (x, y) in enumerate(batches, start=start):
            lr, mom = plan.lr(st.step), plan.momentum(st.step)
            set_lr_momentum(self.optimizer, lr, mom)
            loss = self._step(x, y)
            n = y.numel() * self.dist.world_size // max(1, cfg.data.aug_splits)  # images, not AugMix views
            st.images += n
            st.epoch_images += n
            window_imgs += n
            loss_acc += loss.detach()
            loss_n += 1
            done = i + 1 == info.steps
            if (i + 1) % every == 0 or done:
                self._settle()
                now = time.perf_counter()
                mean_loss = float(loss_acc) / loss_n
                img_s = window_imgs / max(now - window_t, 1e-9)
                eta = (now - t0) / (i + 1 - start) * (plan.total_steps - st.step)
                self.log.step_line(epoch, len(plan.epochs), i + 1, info.steps, img_s, mean_loss, lr, eta)
                self.log.scalars(
                    st.step,
                    **{"train/loss": mean_loss, "train/lr": lr, "train/momentum": mom, "train/images_per_s": img_s},
                )
                if self.dist.is_main:
                    self._progress_path().write_text(json.dumps({"step": st.step, "epoch": epoch}) + "\n")
                window_t, window_imgs = time.perf_counter(), 0
                loss_acc.zero_()
                loss_n = 0
            if cfg.checkpoint.enabled and ckpt_every and st.step % ckpt_every == 0 and not done:
                self._settle()  # the checkpoint's skipped_steps are exact
                now = time.perf_counter()
                st.train_seconds += now - mark
                st.epoch_seconds += now - mark
                self.save_checkpoint()  # mid-epoch: the data position is st.epoch_step
                mark = time.perf_counter()
                window_t += mark - now
        if i + 1 != info.steps:
            raise RuntimeError(f"input pipeline gave {i + 1} batches in epoch {epoch}, the plan says {info.steps}")
        now = time.perf_counter()
        st.train_seconds += now - mark
        st.epoch_seconds += now - mark
        result = {"seconds": st.epoch_seconds, "images": st.epoch_images}
        st.epoch_step, st.epoch_seconds, st.epoch_images = 0, 0.0, 0
        return result

    def validate(self, epoch: int) -> dict:
        with collective_guard(
            "validation (BN statistics and accuracy all_reduce)", self.state.step, self.cfg.dist.timeout_s
        ):
            average_bn_stats(self.model, self.dist)
            phase = self.plan.epoch_info(epoch).phase
            return evaluate(self.model, self.data.val_batches(phase), self.dist, self.amp_ctx)

    def fit(self, stop_after_epochs: int | None = None) -> dict:
        """Train to the end of the plan (or stop after `stop_after_epochs` more epochs; a rerun resumes)."""
        cfg, st = self.cfg, self.state
        last_epoch = len(self.plan.epochs) if stop_after_epochs is None else st.epoch + stop_after_epochs
        wall0 = time.perf_counter() - st.wall_seconds
        epochs = len(self.plan.epochs)
        if st.epoch >= epochs:
            self.log.info(f"nothing to do: all {epochs} epochs are done (checkpoint in {self.run_dir})")
        while st.epoch < min(epochs, last_epoch):
            epoch = st.epoch
            tr = self.train_one_epoch(epoch)
            ev = self.validate(epoch)
            st.epoch += 1
            row = {
                "epoch": st.epoch,
                "train_seconds": st.train_seconds,
                "top1": ev["top1"],
                "top5": ev["top5"],
                "val_loss": ev["loss"],
                "val_count": ev["count"],
                "step": st.step,
                "images_per_s": tr["images"] / max(tr["seconds"], 1e-9),
            }
            st.history.append(row)
            st.wall_seconds = time.perf_counter() - wall0
            row["wall_seconds"] = st.wall_seconds  # top-5 against wall-clock time (scripts/compare_runs.py)
            self.log.info(
                f"epoch {st.epoch}/{epochs}  val top1 {ev['top1']:.2f}%  top5 {ev['top5']:.2f}%  "
                f"({ev['count']} images)  train {format_seconds(st.train_seconds)}  "
                f"{row['images_per_s']:.1f} img/s"
            )
            self.log.scalars(
                st.step,
                **{
                    "val/top1": ev["top1"],
                    "val/top5": ev["top5"],
                    "val/loss": ev["loss"],
                    "epoch/images_per_s": row["images_per_s"],
                },
            )
            if self.dist.is_main:
                write_tsv(self.run_dir / files.TSV, st.history)
            if cfg.checkpoint.enabled:
                self.save_checkpoint()
            if cfg.run.stop_at_target and self._targets_reached(ev):
                self.log.info(f"targets reached after epoch {st.epoch}: stopping (run.stop_at_target)")
                break
        st.wall_seconds = time.perf_counter() - wall0
        summary = self.summary()
        if self.dist.is_main:
            (self.run_dir / files.SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
            write_entry(self.run_dir / files.ENTRY, cfg, summary, self.dist, commit=git_commit())
        self.log.info(summary_table(summary))
        return summary

    def _targets_reached(self, ev: dict) -> bool:
        t1, t5 = self.cfg.run.target_top1, self.cfg.run.target_top5
        if t1 is None and t5 is None:
            return False
        return (t1 is None or ev["top1"] >= t1) and (t5 is None or ev["top5"] >= t5)

    def summary(self) -> dict:
        st, cfg = self.state, self.cfg
        hit = next((r for r in st.history if self._targets_reached(r)), None)
        last = st.history[-1] if st.history else {"top1": float("nan"), "top5": float("nan")}
        return {
            "epochs": st.epoch,
            "steps": st.step,
            "world_size": self.dist.world_size,
            "wall_seconds": st.wall_seconds,
            "train_seconds": st.train_seconds,
            "target_top1": cfg.run.target_top1,
            "target_top5": cfg.run.target_top5,
            "time_to_target_seconds": hit["train_seconds"] if hit else None,
            "epoch_at_target": hit["epoch"] if hit else None,
            "final_top1": last["top1"],
            "final_top5": last["top5"],
            "val_count": last.get("val_count"),  # validation images counted (data.val_blacklist excluded)
            "val_excluded": getattr(self.data, "val_excluded", 0),
            "val_blacklist": cfg.data.val_blacklist,
            "images_per_s": st.images / max(st.train_seconds, 1e-9),
            "skipped_steps": st.skipped_steps,
            "restarts": st.restarts,
            "redone_steps": st.redone_steps,
            "run_id": self.run.run_id,
            "resume_forced": st.forced,
            "run_dir": str(self.run_dir),
            "comm_backend": cfg.comm.backend,
            "comm": self.comm.stats().to_dict(),  # recipes.comm.stats.CommStats; scripts/compare_runs.py reads it
            "history": st.history,
        }

    def close(self) -> None:
        if getattr(self, "data", None) is not None:
            self.data.close()
        self.log.close()
        if getattr(self, "run", None) is not None:
            self.run.close()
        teardown()


def create_criterion(cfg: Config) -> nn.Module:
    """Label-smoothed cross-entropy; with AugMix views (data.aug_splits), timm's JSD consistency loss on top."""
    if cfg.data.aug_splits:
        from timm.loss import JsdCrossEntropy

        return JsdCrossEntropy(num_splits=cfg.data.aug_splits, smoothing=cfg.optim.label_smoothing)
    return nn.CrossEntropyLoss(label_smoothing=cfg.optim.label_smoothing)


def summary_table(s: dict) -> str:
    target = []
    if s["target_top1"] is not None:
        target.append(f"top-1 >= {s['target_top1']:g}%")
    if s["target_top5"] is not None:
        target.append(f"top-5 >= {s['target_top5']:g}%")
    if not target:
        ttt = "no target set"
    elif s["time_to_target_seconds"] is None:
        ttt = "not reached"
    else:
        ttt = f"{format_seconds(s['time_to_target_seconds'])} (epoch {s['epoch_at_target']})"
    rows = [
        ("epochs", f"{s['epochs']} ({s['steps']} steps, {s['world_size']} process(es))"),
        ("wall time", format_seconds(s["wall_seconds"])),
        ("training time", f"{format_seconds(s['train_seconds'])} (excl. validation and checkpoints)"),
        (f"time to target ({' and '.join(target) or '-'})", ttt),
        ("final top-1 / top-5", f"{s['final_top1']:.2f}% / {s['final_top5']:.2f}%"),
        ("validation images counted", _counted(s)),
        ("images/s (training)", f"{s['images_per_s']:.1f}"),
        ("skipped steps (inf/nan gradients)", str(s.get("skipped_steps", 0))),
    ]
    width = max(len(k) for k, _ in rows)
    lines = ["", "| " + "summary".ljust(width) + " | value |", "|" + "-" * (width + 2) + "|-------|"]
    lines += [f"| {k.ljust(width)} | {v} |" for k, v in rows]
    return "\n".join(lines)


def _counted(s: dict) -> str:
    if s.get("val_count") is None:
        return "-"
    if s.get("val_excluded"):
        return f"{s['val_count']} ({s['val_excluded']} blacklisted not counted: {s['val_blacklist']})"
    return f"{s['val_count']} (every image)"


def train(
    cfg: Config, run_dir: str | Path | None = None, resume_from: str | None = None, stop_after_epochs: int | None = None
) -> dict:
    """Run the plan of `cfg`; returns the summary dict (also written to <run_dir>/summary.json)."""
    trainer = Trainer(cfg, Path(run_dir) if run_dir else None, resume_from)
    try:
        return trainer.fit(stop_after_epochs)
    finally:
        trainer.close()


__all__ = ["Trainer", "TrainingError", "NonFiniteError", "evaluate", "train", "summary_table"]
