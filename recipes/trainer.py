"""The training loop: `train(cfg)` runs the whole plan; `train_one_epoch` and `validate` are its two halves.

The loop talks to four pieces through factories chosen by name in the config: the input pipeline
(`data.create_input`), the model (`models.create_model`), the optimizer (`recipes.optim.create_optimizer`)
and the gradient allreduce backend (`recipes.comm.create_allreduce`). The rest is in one module each:

    recipes/steps.py       one optimizer step without a host sync, and the deferred finite-gradient check
    recipes/epoch_clock.py an epoch's training time, the log window's metrics, the ETA
    recipes/metrics.py     the metrics' names, units and formats: the console, TensorBoard and the files take them
    recipes/rundir/           the run directory: its files, the checkpoints (`Checkpointer.save` / `restore`)
    recipes/report.py      the end-of-run summary
    recipes/evaluation/    validation accuracy (and evaluate.py's checkpoint evaluation and latency)
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import torch

from base.errors import ConfigError, Preempted
from data import create_input
from models import create_model
from models.factory import compile_for_training, compile_report, compile_unavailable
from recipes.comm import create_allreduce, process_env
from recipes.config import Config
from recipes.dawnbench import check_required
from recipes.distributed import ProcessSettings, collective_guard, setup, teardown
from recipes.ema import create_ema, update_ema
from recipes.epoch_clock import EpochClock
from recipes.evaluation.accuracy import average_bn_stats, evaluate
from recipes.logger import RunLogger, format_seconds
from recipes.memory import accumulation, refuse_if_too_big
from recipes.metrics import IMAGES_PER_S, LR, MOMENTUM, ema_values, epoch_row, epoch_scalars, window_scalars
from recipes.optim import create_optimizer, describe_groups, set_lr_momentum
from recipes.preemption import StopSignal, rerun_hint
from recipes.report import summarize, summary_table, targets_reached
from recipes.rundir.checkpointer import Checkpointer, Parts
from recipes.rundir.directory import open_run
from recipes.rundir.outputs import RunOutputs
from recipes.rundir.payload import State
from recipes.schedule import Schedule
from recipes.step_builder import build_step
from recipes.steps import after_backend, describe_graph_decisions, phase_graph_decisions
from recipes.timemodel import calibrated_compute


def run_dir_for(cfg: Config) -> Path:
    return Path(cfg.run.out_dir) / cfg.run.name


class Trainer:
    """Holds the pieces of one run; `fit()` runs the plan."""

    def __init__(self, cfg: Config, run_dir: Path | None = None, resume_from: str | None = None):
        check_required(cfg)  # before any work: the entry written at the end must be complete
        self.cfg = cfg
        self.process = ProcessSettings()  # put back by close()
        try:
            self.dist = setup(cfg, env=process_env(cfg.comm))
        except BaseException:
            self.process.restore()
            raise
        why = compile_unavailable(self.dist.device) if cfg.run.compile != "none" else None
        if why:  # before the run directory is touched
            teardown()
            self.process.restore()
            raise ConfigError(f"run.compile={cfg.run.compile}: {why}; install one, or set run.compile=none")
        self.run_dir = Path(run_dir) if run_dir else run_dir_for(cfg)
        self.run = None
        self.log = RunLogger(self.run_dir, False, False)
        self.stop = StopSignal()  # records SIGTERM/SIGINT from fit() to close() (recipes/preemption.py)
        self._compiled: set = set()  # input shapes run.compile has compiled (their first step is bounded)
        try:
            # Before anything is written there: the lock, and the one run id all ranks agree on.
            self.run = open_run(self.run_dir, self.dist, cfg.checkpoint.resume)
            self.log = RunLogger(self.run_dir, self.dist.is_main, cfg.log.tensorboard)
            self.out = RunOutputs(self.run_dir, self.dist, self.run.leader)
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
        self.data = create_input(
            cfg.data, dist, phases=cfg.phases, seed=cfg.run.seed, channels_last=cfg.run.channels_last, amp=cfg.run.amp
        )
        self.plan = Schedule(
            cfg.phases, cfg.optim, num_images=self.data.num_train, world_size=dist.world_size, **accumulation(cfg)
        )
        refuse_if_too_big(cfg, self.plan, dist.device)  # a phase that will not fit fails now, not hours in
        model = create_model(cfg.model, self.data.num_classes).to(dist.device)
        if cfg.run.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model
        self.ema = create_ema(model, enabled=cfg.run.ema, decay=cfg.run.ema_decay, warmup=cfg.run.ema_warmup)
        self.optimizer = create_optimizer(cfg.optim, model)
        self.scaler = torch.amp.GradScaler(dist.device.type, enabled=cfg.run.amp == "fp16")
        self.comm = create_allreduce(
            cfg.comm,
            dist,
            timeout_s=cfg.dist.timeout_s,
            model_name=cfg.model.name,
            compute_start=functools.partial(calibrated_compute, cfg),
        )
        torch.manual_seed(cfg.run.seed + 1000 * dist.rank)  # per-rank randomness; a resume restores it
        parts = Parts(self.model, self.optimizer, self.scaler, self.comm, self.ema)
        self.checkpointer = Checkpointer(self.run, dist, cfg, self.data, parts, self.log)
        if cfg.checkpoint.enabled:
            self.checkpointer.check_space()
        self.state: State = self.checkpointer.restore(resume_from)
        self._wall0: float | None = None  # fit()'s start, earlier sessions' wall time taken off
        self.out.start(cfg, self.run.run_id)  # after the resume checks: a refused start leaves the files as they were
        self.train_model, self.optimizer = self.comm.prepare(self.model, self.optimizer)
        parts.optimizer = self.optimizer  # the backend may wrap it (Horovod): checkpoints hold the wrapped one's state
        # Compiled around the backend's wrapper (torch.compile(DDP(model)), as torch's DDP notes advise: dynamo splits
        # the graph at DDP's buckets so that their allreduce still overlaps the backward).
        shapes = len({(e.phase.image_size, e.phase.batch_size) for e in self.plan.epochs})
        self.train_model = compile_for_training(
            self.train_model, cfg.run.compile, shapes=shapes, cache=cfg.run.compile_cache
        )
        decisions = phase_graph_decisions(
            cfg.run,
            cfg.comm,
            optim=cfg.optim.name,
            micro_batches=self.plan.phase_micro_batches(),
            device_type=dist.device.type,
            world_size=dist.world_size,
            dali=cfg.data.backend == "dali",
        )
        decisions = after_backend(decisions, self.comm)  # blocked for good: StepRunner, not an eager GraphStep
        capture = any(ok for ok, _ in decisions)
        if cfg.run.cuda_graph is not False and dist.device.type == "cuda":
            for line in describe_graph_decisions(cfg.run.cuda_graph, cfg.phases, decisions):
                self.log.info(line)
        self.steps = build_step(
            cfg,
            model=model,
            train_model=self.train_model,
            optimizer=self.optimizer,
            comm=self.comm,
            scaler=self.scaler,
            device=dist.device,
            graph=capture,
            capture=capture,
            **({"dist": dist} if capture else {}),
        )
        self.log.info(
            f"run {self.run_dir}: {dist.world_size} process(es) on {dist.device}, model {cfg.model.name} "
            f"({sum(p.numel() for p in model.parameters()):,} params), optimizer {cfg.optim.name}, "
            f"data {cfg.data.backend} ({self.data.num_train} train / {self.data.num_val} val images, "
            f"{self.data.num_classes} classes), allreduce {cfg.comm.backend}"
        )
        for line in describe_groups(self.optimizer):
            self.log.info(line)
        self.log.info(self.plan.table())

    def train_one_epoch(self, epoch: int) -> dict:
        """Train epoch `epoch` from the data position in the state (0 unless resumed mid-epoch)."""
        cfg, plan, st = self.cfg, self.plan, self.state
        info, start = plan.epoch_info(epoch), st.epoch_step
        clock = EpochClock(st, self.dist.device, start)  # before the pipeline build (DALI: per phase): training time
        batches = self.data.train_batches(info, start_step=start)
        self.train_model.train()
        i = start - 1
        for i, (x, y) in enumerate(clock.timed(batches), start=start):  # each next(): the step's data wait
            hp = plan.logged(st.step)
            set_lr_momentum(self.optimizer, hp[LR.name], hp.get(MOMENTUM.name))
            shape = (tuple(x.shape), info.micro_batches)
            if cfg.run.compile != "none" and shape not in self._compiled:  # this step compiles: minutes, no boundary
                self._compiled.add(shape)
                with self.stop.bounded(f"the first compile of {list(x.shape)}"):
                    values = self.steps(x, y, st, self.log, info.micro_batches)
            else:
                values = self.steps(x, y, st, self.log, info.micro_batches)
            update_ema(self.ema, self.model, st.step)
            images = y.numel() * self.dist.world_size // max(1, cfg.data.get("aug_splits", 0))  # images, not views
            clock.add(images, values, hp)  # lr, and momentum where the optimizer reads one
            done = i + 1 == info.steps
            logged = (i + 1) % cfg.log.every_steps == 0 or done
            if logged:
                self.steps.settle(st, self.log)
                window = clock.window(i + 1, plan.total_steps - st.step)
                self.log.step_line(epoch, len(plan.epochs), i + 1, info.steps, window)
                self.log.scalars(st.step, **window_scalars(window))
                self.out.progress(st.step, epoch, window, self._wall())
                clock.restart_window()
            # Preemption is agreed at the log window (already a host sync); at an epoch's end, after its checkpoint.
            stop = logged and not done and self.stop.agreed(self.dist, st.step, cfg.dist.timeout_s)
            every = cfg.checkpoint.every_steps
            periodic = every and st.step % every == 0
            if cfg.checkpoint.enabled and (periodic or stop) and not done:
                self.steps.settle(st, self.log)  # the checkpoint's skipped_steps are exact
                with clock.paused():
                    st.wall_seconds = self._wall()  # a resume from this step goes on from its wall time
                    self.checkpointer.save(st.step)  # mid-epoch: the data position is st.epoch_step
            if stop:
                self._preempted()
        if i + 1 != info.steps:
            raise RuntimeError(f"input pipeline gave {i + 1} batches in epoch {epoch}, the plan says {info.steps}")
        clock.stop()
        result = clock.epoch()
        st.epoch_step, st.epoch_seconds, st.epoch_images = 0, 0.0, 0
        return result

    def validate(self, epoch: int) -> dict:
        what = "validation (BN statistics and accuracy all_reduce)"
        with collective_guard(what, self.state.step, self.cfg.dist.timeout_s):
            average_bn_stats(self.model, self.dist)
            phase = self.plan.epoch_info(epoch).phase
            ev = evaluate(self.model, self.data.val_batches(phase), self.dist, self.steps.amp_ctx)
            if self.ema is not None:
                average_bn_stats(self.ema.module, self.dist)
                ema = evaluate(self.ema.module, self.data.val_batches(phase), self.dist, self.steps.amp_ctx)
                ev.update(ema_values(ema))
            return ev

    def _wall(self) -> float:
        """Wall-clock seconds of the run so far, earlier sessions included (fit() sets the start)."""
        return self.state.wall_seconds if self._wall0 is None else time.perf_counter() - self._wall0

    def fit(self, stop_after_epochs: int | None = None) -> dict:
        """Train to the end of the plan (or stop after `stop_after_epochs` more epochs; a rerun resumes)."""
        cfg, st = self.cfg, self.state
        last_epoch = len(self.plan.epochs) if stop_after_epochs is None else st.epoch + stop_after_epochs
        self._wall0 = time.perf_counter() - st.wall_seconds
        epochs = len(self.plan.epochs)
        if st.epoch >= epochs:
            self.log.info(f"nothing to do: all {epochs} epochs are done (checkpoint in {self.run_dir})")
        self.stop.install()  # until close(): SIGTERM/SIGINT stop the run at the next step boundary
        while st.epoch < min(epochs, last_epoch):
            tr = self.train_one_epoch(st.epoch)
            ev = self.validate(st.epoch)
            st.epoch += 1
            row = epoch_row(epoch=st.epoch, step=st.step, train_seconds=st.train_seconds, train=tr, val=ev)
            st.history.append(row)
            st.wall_seconds = self._wall()
            row["wall_seconds"] = st.wall_seconds  # top-5 against wall-clock time (scripts/compare_runs.py)
            self.log.info(
                f"epoch {st.epoch}/{epochs}  val top1 {ev['top1']:.2f}%  top5 {ev['top5']:.2f}%  "
                f"({ev['count']} images)  "
                + (f"EMA top1 {ev['ema_top1']:.2f}%  top5 {ev['ema_top5']:.2f}%  " if "ema_top1" in ev else "")
                + f"train {format_seconds(st.train_seconds)}  {row[IMAGES_PER_S.name]:.1f} img/s"
            )
            self.log.scalars(st.step, **epoch_scalars(row))
            self.out.history(st.history)
            if cfg.checkpoint.enabled:
                self.checkpointer.save(st.step)
            if cfg.run.stop_at_target and targets_reached(cfg, ev):
                self.log.info(f"targets reached after epoch {st.epoch}: stopping (run.stop_at_target)")
                break
            if st.epoch < min(epochs, last_epoch) and self.stop.agreed(self.dist, st.step, cfg.dist.timeout_s):
                self._preempted()
        st.wall_seconds = self._wall()
        summary = self.summary()
        self.out.finish(cfg, summary)
        self.log.info(summary_table(summary))
        return summary

    def _preempted(self) -> None:
        """Every rank agreed to stop at this step boundary, after the checkpoint (if any) was written."""
        st, saved = self.state, self.cfg.checkpoint.enabled
        where = f"step {st.step} (epoch {st.epoch + 1}, {st.epoch_step} step(s) into it)"
        kept = f"checkpoint of step {st.step} in {self.run_dir}; {rerun_hint()}" if saved else "no checkpoint"
        raise Preempted(f"stopped by {self.stop.describe()} at {where}: {kept}")

    def summary(self) -> dict:
        excluded = getattr(self.data, "val_excluded", 0)
        summary = summarize(
            self.cfg,
            self.state,
            world_size=self.dist.world_size,
            run_id=self.run.run_id,
            run_dir=self.run_dir,
            val_excluded=excluded,
            comm_stats=self.comm.stats(),
            planned_epochs=len(self.plan.epochs),
            planned_steps=self.plan.total_steps,
            num_classes=self.data.num_classes,
            val_skipped=getattr(self.data, "val_skipped", 0),
            train_skipped=getattr(self.data, "train_skipped", 0),
        )
        return {**summary, **compile_report(self.train_model)}  # per input shape: compile seconds, cold or warm

    def close(self) -> None:
        if getattr(self, "data", None) is not None:
            self.data.close()
        self.log.close()
        if getattr(self, "run", None) is not None:
            self.run.close()
        teardown()
        self.process.restore()
        self.stop.restore()  # last: torchrun's own SIGTERM after a preemption must not kill a rank that is closing


def train(
    cfg: Config, run_dir: str | Path | None = None, resume_from: str | None = None, stop_after_epochs: int | None = None
) -> dict:
    """Run the plan of `cfg`; returns the summary dict (also written to <run_dir>/summary.json)."""
    trainer = Trainer(cfg, Path(run_dir) if run_dir else None, resume_from)
    try:
        return trainer.fit(stop_after_epochs)
    finally:
        trainer.close()


__all__ = ["Trainer", "train"]
