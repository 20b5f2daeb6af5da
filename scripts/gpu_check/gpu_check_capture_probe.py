"""What every case of the capture probe (gpu_check_capture.py) runs on: `Probe`, the record's step on one device;
stand-in allreduce backends; the small network's config, runners, batches and moving schedule; and the judge of
weights, each parameter group against its own update."""

from __future__ import annotations

import sys
import weakref

CONFIG = "configs/dawnbench_158s_resnet50d.yaml"
OPTIM_WARMUP = 2  # eager steps before a GraphStep captures (the optimizers case: 2 eager, the capture, replays)
BLOCKED = "the capture probe blocks capture (stream and allocator churn of eager steps)"


class NoComm:
    """No allreduce backend (one rank: nothing wraps the model)."""

    def prepare(self, model, optimizer):
        return model, optimizer

    def on_step_end(self, step, log=None):
        pass


class Blocked(NoComm):
    """A backend that keeps every step eager, as multistream does while its tuner measures."""

    def capture_blocker(self):
        return BLOCKED


class Probe:
    """The record's step on one device (gpu_check_speed.Bench: the one-rank group, config, model and batches), the
    runners it builds (a capture stand-in on the CPU puts back what they wrote, `written`), and the run's mode."""

    def __init__(self, device: str, *, smoke: bool, capture: bool | None = None):
        """`capture`: whether GraphStep captures (default: on CUDA; True on the CPU only under a stand-in)."""
        import torch

        from scripts.gpu_check.gpu_check_speed import Bench

        self.torch, self.smoke = torch, smoke
        self.bench = Bench(device, smoke, config=CONFIG, capture=capture)
        self.device, self.capture = self.bench.device, self.bench.capture
        self.cuda = self.device.type == "cuda"
        self.runners: weakref.WeakSet = weakref.WeakSet()
        self.log = StderrLog()

    def track(self, runner):
        self.runners.add(runner)
        return runner

    def written(self) -> list:
        """Every tensor a step of a built runner may write: weights, buffers, optimizer state, the scaler's."""
        torch, out = self.torch, []
        for r in list(self.runners):
            state = [t for s in r.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
            scaler = [getattr(r.scaler, k, None) for k in ("_scale", "_growth_tracker")]
            out += [*r.model.parameters(), *r.model.buffers(), *state, *(t for t in scaler if t is not None)]
        return out

    def decision(self, cfg, *, world_size: int = 1) -> tuple[bool, str]:
        """graph_decision with run.cuda_graph=true, on this device (a stand-in capture counts as CUDA)."""
        import dataclasses

        from recipes.steps import graph_decision

        run = dataclasses.replace(cfg.run, cuda_graph=True)
        kind = "cuda" if self.capture else self.device.type
        return graph_decision(run, cfg.comm, optim=cfg.optim.name, device_type=kind, world_size=world_size)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def close(self) -> None:
        self.bench.close()


class StderrLog:
    """The runners' log lines, on stderr."""

    def warn(self, msg):
        print(f"capture: {msg}", file=sys.stderr)

    info = warn


def small_cfg(probe: Probe, *overrides: str):
    from recipes.config import load_config

    return load_config(None, [f"run.device={probe.device.type}", "optim.lr=0.05", "run.amp=none", *overrides])


def small_runner(probe: Probe, cfg, *, graph: bool, comm=None, capture: bool | None = None, warmup: int = OPTIM_WARMUP):
    """The worker's small network (gpu_check_worker.net) with `cfg`'s optimizer, fp32, through StepRunner or
    GraphStep (capturing as the probe does, or as `capture` says); `comm`: a stub, else the config's backend engaged
    as the trainer does."""
    torch = probe.torch
    from torch import nn

    from recipes.comm import create_allreduce
    from recipes.optim import create_optimizer
    from recipes.step_builder import build_step
    from scripts.gpu_check.gpu_check_worker import net

    torch.manual_seed(0)
    model = net().to(probe.device).to(memory_format=torch.channels_last)
    opt = create_optimizer(cfg.optim, model)
    if comm is None:
        comm = create_allreduce(cfg.comm, probe.bench.dist, timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name)
    train_model, opt = comm.prepare(model, opt)
    parts = dict(model=model, train_model=train_model, optimizer=opt, comm=comm, device=probe.device)
    fixed = dict(criterion=nn.CrossEntropyLoss(), on_nonfinite="skip")  # the probe's own: plain loss, skip a bad step
    scaler = torch.amp.GradScaler(probe.device.type, enabled=False)
    if graph:
        capture = probe.capture if capture is None else capture
        extra = dict(warmup=warmup, dist=probe.bench.dist)
        return probe.track(build_step(cfg, **parts, scaler=scaler, graph=True, capture=capture, **fixed, **extra))
    return probe.track(build_step(cfg, **parts, scaler=scaler, **fixed))


def small_batches(probe: Probe, n: int) -> list:
    torch = probe.torch
    size, batch = (16, 8) if probe.smoke else (32, 32)
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(n):
        x = torch.randn(batch, 3, size, size, generator=g).contiguous(memory_format=torch.channels_last)
        out.append((x.to(probe.device), torch.randint(0, 10, (batch,), generator=g).to(probe.device)))
    return out


def train(probe: Probe, runner, batches) -> int:
    """Run `runner` over `batches` with a moving schedule (a frozen lr or momentum would show); steps run."""
    from recipes.optim import set_lr_momentum
    from recipes.rundir.payload import State

    st = State()
    for i, (x, y) in enumerate(batches):
        set_lr_momentum(runner.optimizer, 0.05 + 0.01 * i, 0.95 - 0.02 * i)
        runner(x, y, st, probe.log)
    runner.settle(st, probe.log)
    probe.sync()
    return st.step


def group_weights(optimizer) -> list[list]:
    """A copy of each parameter group's weights (the judges below compare group by group)."""
    return [[p.detach().clone() for p in g["params"]] for g in optimizer.param_groups]


def judge_groups(start: list[list], ref: list[list], new: list[list], *, rel: float) -> tuple[float, list[str]]:
    """(the worst group's |new - ref| over its own update |ref - start|, one problem per group beyond `rel`): each
    group is judged against its own update, so a small group's fault is not hidden under a large group's."""
    worst, problems = 0.0, []
    for i, (s0, r, n) in enumerate(zip(start, ref, new, strict=True)):
        update = max((float((b - a).abs().max()) for a, b in zip(s0, r, strict=True)), default=0.0)
        diff = max((float((c - b).abs().max()) for b, c in zip(r, n, strict=True)), default=0.0)
        ratio = diff / update if update > 0 else (0.0 if diff == 0 else float("inf"))
        worst = max(worst, ratio)
        if not ratio <= rel:
            problems.append(f"group {i}: |w - eager| {diff:.3g} is {ratio:.3g}x its own update {update:.3g}")
    return worst, problems


def finite(model) -> bool:
    return all(bool(p.detach().isfinite().all()) for p in model.parameters())
