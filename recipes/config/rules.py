"""Rules between keys: each written once, as a function of the section(s) it reads, and declared on its fields
(`cross=` in recipes/config/schema.py). The loader runs every declared rule (`check_all`); a part that takes a
section built without the loader calls the same function (recipes/optim.py: `trust_clip`), so both raise the same
ConfigError naming the keys and values. Torch-free: the loader and the torch-free tools import it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from base import registry
from base.errors import ConfigError


@dataclass(frozen=True)
class Rule:
    """A rule between keys: what holds, in words (the fields' `cross` metadata), and its check of a whole Config."""

    text: str
    check: Callable[[Any], None]  # (Config) -> None; raises ConfigError naming the keys and values


def trust_clip(optim) -> None:
    """The hybrid optimizer's clip of the layer trust ratio is an interval: optim.trust_clip_min <= trust_clip_max."""
    lo, hi = optim.get("trust_clip_min"), optim.get("trust_clip_max")
    if lo is not None and hi is not None and lo > hi:
        raise ConfigError(
            f"optim.trust_clip_min: {optim.trust_clip_min} is above optim.trust_clip_max ({optim.trust_clip_max})"
        )


def warmup_within_schedule(cfg) -> None:
    """The warm-up ends inside the schedule: optim.warmup_epochs <= the phases' epochs."""
    if cfg.optim.warmup_epochs > cfg.epochs:
        raise ConfigError(
            f"optim.warmup_epochs: {cfg.optim.warmup_epochs} is longer than the schedule ({cfg.epochs} epochs)"
        )


def max_gpu_batch_by_size(cfg) -> None:
    """run.max_gpu_batch_by_size names phases' image sizes, each with a micro-batch of at least one image."""
    sizes = sorted({p.image_size for p in cfg.phases})
    for size, cap in cfg.run.max_gpu_batch_by_size.items():
        if size not in sizes:
            raise ConfigError(
                f"run.max_gpu_batch_by_size: {size} px is no phase's image size ({', '.join(map(str, sizes))})"
            )
        if cap < 1:
            raise ConfigError(f"run.max_gpu_batch_by_size.{size}: expected an integer >= 1 (images), got {cap}")


def hop_level_on_host(cfg) -> None:
    """comm.balance_level=hop runs its ring on gloo process groups: refused where the process group is NCCL
    (dist.backend=nccl, or auto with run.device=cuda) unless a hierarchy runs the ring on the host
    (comm.hierarchy=host). With run.device=auto the backend is known only at start-up, where multistream refuses it."""
    comm = cfg.comm
    if getattr(comm, "balance_level", "communicator") != "hop" or getattr(comm, "hierarchy", "none") == "host":
        return
    nccl = cfg.dist.backend == "nccl" or (cfg.dist.backend == "auto" and cfg.run.device == "cuda")
    if nccl:
        why = "dist.backend=nccl" if cfg.dist.backend == "nccl" else "dist.backend=auto with run.device=cuda: nccl"
        raise ConfigError(
            f"comm.balance_level=hop: the hop-balanced ring runs on gloo process groups, not NCCL ({why}); use "
            "comm.balance_level=communicator on GPUs"
        )


BY_SIZE = Rule("run.max_gpu_batch_by_size: phases' image sizes, each at least 1 image", max_gpu_batch_by_size)
TRUST_CLIP = Rule("optim.trust_clip_min <= optim.trust_clip_max", lambda cfg: trust_clip(cfg.optim))
WARMUP = Rule("optim.warmup_epochs <= the schedule's epochs", warmup_within_schedule)
HOP_ON_HOST = Rule("comm.balance_level=hop: not on NCCL unless comm.hierarchy=host", hop_level_on_host)


def declared(cls: type) -> list[Rule]:
    """Every rule declared on the fields of schema class `cls` and its sections (a seam's section: its parts' own
    configs too, base/registry.py), once each, in field order."""
    import dataclasses
    import typing

    classes = [cls]
    if getattr(cls, "SEAM", ""):  # recipes.config.schema.PluginSection
        classes += [registry.resolve(r.config) for r in registry.SEAMS[cls.SEAM].records.values() if r.config]
    out: list[Rule] = []
    for c in classes:
        hints = typing.get_type_hints(c)
        for f in dataclasses.fields(c):
            rule = f.metadata.get("cross")
            if isinstance(rule, Rule) and rule not in out:
                out.append(rule)
            tp = hints[f.name]
            if typing.get_origin(tp) is list:
                tp = typing.get_args(tp)[0]
            if dataclasses.is_dataclass(tp):
                out += [r for r in declared(tp) if r not in out]
    return out


def check_all(cfg) -> None:
    """Run every rule the schema declares on `cfg` (a Config); the first broken one raises its ConfigError."""
    for rule in declared(type(cfg)):
        rule.check(cfg)
