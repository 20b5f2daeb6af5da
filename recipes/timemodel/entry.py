"""The entry points for other tools: `predict` (scripts, docs/scaling.md), `predicted_seconds` (a config's
prediction for `train.py --plan --gpu` and the hardware presets) and `calibrated_compute` (the allreduce autotuner's
start)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from base import registry
from base.errors import ConfigError
from recipes.timemodel.estimate import Cluster, backends, estimate, schedule_phases, step_compute
from recipes.timemodel.inputs import input_rate
from recipes.timemodel.profile import profile_model
from recipes.timemodel.rates import DTYPES, ProfileError, gpu_for_device, load_gpu_profile, published


def predict(
    hosts: int,
    gpus_per_host: int,
    gpu: str = "v100",
    dtype: str = "fp16",
    *,
    config: str | None = None,
    backend: str = "multistream",  # a label of backends(): "ddp", "ddp (4 flows)", "horovod", "multistream"
    link_gbit: float = 32.0,
    flow_gbit: float | None = 10.0,
    flows_per_comm: int = 1,
    gpu_profile: str | None = None,
    clock: str = "train",
) -> tuple[float, float, float]:
    """(low, mid, high) seconds of `config`'s schedule (default: the record's) on hosts x gpus_per_host GPUs."""
    from recipes.config import load_config

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(config or str(root / "configs" / "dawnbench_158s.yaml"), [])
    rates = load_gpu_profile(gpu_profile) if gpu_profile else published(gpu, dtype)
    cluster = Cluster(hosts, gpus_per_host, link_gbit, flow_gbit or None, flows_per_comm)
    be = {b.label: b for b in backends(cfg)}  # by label: two rows run the stepmodel's "ddp" (1 and 4 flows)
    if backend not in be:
        raise ValueError(f"backend: expected one of {', '.join(repr(k) for k in be)}, got {backend!r}")
    prof = profile_model(cfg.model.name)
    est = estimate(schedule_phases(cfg, cluster.world), cluster, rates, backend=be[backend], prof=prof)
    return est.range(clock)


def calibrated_compute(cfg, specs, world: int, gpus_per_host: int, device_name: str | None) -> tuple:
    """(stepmodel.Compute or None, what it is): one GPU's step at the run's first image size and per-GPU batch, from
    recipes/timemodel/'s calibrated rates of the run's GPU (comm.gpu_profile: measured ones), with the gradient-
    ready times of the model's FLOP profile. None where no rate is known (a CPU run, an unlisted GPU)."""
    if cfg.comm.gpu_profile:
        try:
            rates = load_gpu_profile(cfg.comm.gpu_profile)
        except ProfileError as e:
            raise ConfigError(f"comm.gpu_profile: {e}") from None
    elif device_name is None:
        return None, "no calibrated compute on the CPU"
    else:
        gpu = gpu_for_device(device_name)
        try:
            rates = published(gpu, cfg.run.amp) if gpu is not None else None
        except ValueError:
            rates = None
        if rates is None:
            why = f"no published or measured rates for {device_name} with run.amp={cfg.run.amp}"
            return None, f"{why} (comm.gpu_profile takes make gpu-check's file)"
    phase = schedule_phases(cfg, world)[0]
    prof = profile_model(cfg.model.name)
    if len(prof.ready) != len(specs):  # another model than the profiled one: no gradient is ready before the end
        prof = dataclasses.replace(prof, ready=tuple(1.0 for _ in specs))
    comp = step_compute(rates, phase.image_size, phase.batch, gpus_per_host, prof)
    what = (
        f"compute {(comp.forward_s + comp.backward_s) * 1000:.0f} ms per step ({rates.name}, {phase.image_size} px, "
        f"{phase.batch} per GPU)"
    )
    return comp, what


def cluster_shape(world: int, gpus_per_host: int = 8) -> tuple[int, int]:
    """(hosts, GPUs per host) of `world` GPUs: whole hosts of `gpus_per_host`, or one smaller host."""
    if world <= gpus_per_host:
        return 1, world
    if world % gpus_per_host:
        raise ValueError(f"--world-size {world}: expected at most {gpus_per_host} or a multiple of it")
    return world // gpus_per_host, gpus_per_host


def predicted_seconds(cfg, world: int, gpu: str, clock: str = "train") -> tuple[tuple[float, float, float] | None, str]:
    """The time model's (low, mid, high) seconds of `cfg` on `world` GPUs (`clock`: "train" or "wall") and what
    it assumed, or None and why not."""
    est, what = predicted_estimate(cfg, world, gpu)
    return (est.range(clock) if est is not None else None), what


def predicted_estimate(cfg, world: int, gpu: str):
    """The time model's `Estimate` of `cfg` on `world` GPUs (every term of every phase; an accumulating phase counts
    the step floor once per micro-batch) and what it assumed, or None and why not."""
    dtype = cfg.run.amp if cfg.run.amp in DTYPES else "fp16"
    try:
        rates = published(gpu, dtype)
        hosts, per_host = cluster_shape(world)
    except ValueError as e:
        return None, str(e)
    be = next((b for b in backends(cfg) if b.name == cfg.comm.backend), None)  # its first row: the fewest flows
    if be is None:
        rows = ", ".join(dict.fromkeys(b.name for b in backends(cfg)))
        return None, f"comm.backend {cfg.comm.backend!r} has no row in the time model (backends: {rows})"
    prof = profile_model(cfg.model.name, 64)
    est = estimate(
        schedule_phases(cfg, world), Cluster(hosts, per_host), rates, backend=be, prof=prof, inputs=input_rate(cfg)
    )
    named = rates.name if dtype in rates.name else f"{rates.name} {dtype}"  # the rates' name may say it already
    what = f"{hosts} x {per_host} {named}, {be.label}, 32 Gbit/s links"
    if not registry.MODELS[cfg.model.name].time_rates:
        what += f"; per-image rates measured on ResNet-50, not {cfg.model.name}"
    return est, what
