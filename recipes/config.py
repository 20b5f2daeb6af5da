"""Typed configuration: one schema, YAML files with `extends:` inheritance, dotted `key=value` overrides.

Every hyperparameter is declared exactly once below, with its default and its meaning (the `help` metadata).
`load_config(path, overrides)` returns a validated `Config`; any problem raises `ConfigError` with the file,
key, expected type and value named.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from recipes import registry
from recipes.errors import ConfigError

# The names each plug-in seam accepts, from its registry: a wrong name fails when the config loads.
AllreduceName = Literal[tuple(registry.ALLREDUCE_BACKENDS)]
InputName = Literal[tuple(registry.INPUT_PIPELINES)]
ModelName = Literal[tuple(registry.MODELS)]
OptimizerName = Literal[tuple(registry.OPTIMIZERS)]


def _f(default: Any = dataclasses.MISSING, help: str = "", factory: Any = None, domain: str = "") -> Any:
    """A schema field: default (or factory), meaning, and `domain`: the values allowed besides the type
    (keys of DOMAINS, space-separated; on a list, "nonempty" is about the list and the others about its items)."""
    meta = {"help": help, "domain": domain}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _is_name(v: str) -> bool:
    return bool(v.strip()) and "/" not in v and "\\" not in v and "\0" not in v and v not in (".", "..")


# Domain -> (test, what the error and the reference say). Every number is also required to be finite.
DOMAINS: dict[str, tuple[Any, str]] = {
    ">0": (lambda v: v > 0, "> 0"),
    ">=0": (lambda v: v >= 0, ">= 0"),
    "(0,1]": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "[0,1]": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "[0,1)": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "[0,100]": (lambda v: 0 <= v <= 100, "in [0, 100]"),
    "nonempty": (lambda v: len(v) > 0 and (not isinstance(v, str) or bool(v.strip())), "that is not empty"),
    "name": (_is_name, "that is a single path component (not empty, no '/', not '.' or '..')"),
}


def domain_text(domain: str) -> str:
    """The allowed values of a domain, as the reference and the errors say them ('' = any value of the type)."""
    return ", ".join(DOMAINS[d][1].removeprefix("that is ") for d in domain.split())


@dataclass
class Phase:
    """One block of epochs of the progressive-resizing schedule."""

    epochs: int = _f(help="number of epochs in this phase", domain=">0")
    image_size: int = _f(help="training crop size in pixels (square)", domain=">0")
    batch_size: int = _f(help="GLOBAL batch size (summed over all ranks)", domain=">0")
    min_scale: float = _f(0.35, help="smallest area fraction of RandomResizedCrop", domain="(0,1]")
    min_object_area: float = _f(
        0.0,
        help="TF's min_object_covered with the whole image as the box: the crop covers at least this fraction "
        "of the image, so the crop area's lower bound is max(min_scale, min_object_area) (docs/input.md)",
        domain="[0,1]",
    )
    val_image_size: int | None = _f(None, help="validation crop size; default: image_size", domain=">0")
    rect_val: bool = _f(False, help="rectangular validation (aspect-ratio batches, no crop)")
    root: str = _f("full", help="which entry of data.roots this phase reads (pre-resized copies)", domain="nonempty")


@dataclass
class RunConfig:
    name: str = _f("run", help="run name; the run directory is <out_dir>/<name>", domain="name")
    out_dir: str = _f("runs", help="parent directory of run directories", domain="nonempty")
    seed: int = _f(0, help="global seed; rank r uses seed + r for its own randomness", domain=">=0")
    deterministic: bool = _f(False, help="use deterministic algorithms (slower; for exact resume tests)")
    device: Literal["auto", "cpu", "cuda"] = _f("auto", help="auto = cuda if available else cpu")
    threads: int = _f(0, help="torch intra-op threads per process; 0 = cores / local processes", domain=">=0")
    target_top1: float | None = _f(None, help="top-1 accuracy (%) whose first crossing is reported", domain="[0,100]")
    target_top5: float | None = _f(None, help="top-5 accuracy (%) whose first crossing is reported", domain="[0,100]")
    stop_at_target: bool = _f(False, help="stop training once every given target is reached")
    nodes: int = _f(1, help="machines the config is written for (launcher and --plan)", domain=">0")
    procs_per_node: int = _f(1, help="processes (GPUs) per machine the config is written for", domain=">0")
    amp: Literal["none", "bf16", "fp16"] = _f("none", help="mixed precision dtype")
    channels_last: bool = _f(False, help="NHWC memory format for model and inputs")
    on_nonfinite: Literal["halt", "skip"] = _f("halt", help="non-finite loss/gradients: stop, or skip the step")


@dataclass
class DataConfig:
    backend: InputName = _f("torch", help="input pipeline (recipes/registry.py)")
    root: str = _f("data/sample", help="dataset root with train/ and val/ in ImageNet folder layout", domain="nonempty")
    roots: dict[str, str] = _f(
        help="named dataset copies (e.g. pre-resized '160'); 'full' defaults to data.root", factory=dict
    )
    workers: int = _f(1, help="decoding workers (threads for DALI, processes for torch) per rank", domain=">=0")
    val_crop_ratio: float = _f(0.875, help="validation: resize shorter side to size/ratio, center crop", domain="(0,1]")
    val_batch_size: int = _f(64, help="per-rank validation batch size", domain=">0")
    skip_corrupt: bool = _f(False, help="skip undecodable files (and report them) instead of failing")
    synthetic_size: int = _f(1281167, help="synthetic backend: training images per epoch", domain=">0")
    synthetic_classes: int = _f(1000, help="synthetic backend: number of classes", domain=">0")
    dali_dtype: Literal["auto", "float32", "float16"] = _f(
        "auto", help="dali: output dtype; auto = float16 on CUDA with run.amp=fp16, else float32"
    )
    max_image_pixels: int = _f(
        89_478_485,
        help="refuse an image with more pixels (a decompression bomb) in every backend; default: PIL's limit",
        domain=">0",
    )
    dali_prefetch: int = _f(
        2, help="dali: batches prepared ahead of the training loop (prefetch_queue_depth)", domain=">0"
    )
    val_blacklist: str = _f(
        "",
        help="devkit's ILSVRC2012_validation_blacklist.txt (1-based indices into the sorted val file names), "
        "relative to data.root unless absolute: those images are not counted; '' = count every image",
    )
    auto_augment: str = _f(
        "",
        help="torch backend: timm augmentation after the crop, e.g. 'rand-m9-mstd0.5-inc1' (RandAugment) or "
        "'augmix-m3-w1'; '' = none",
    )
    aug_splits: int = _f(
        0,
        help="torch backend: AugMix splits (timm AugMixDataset: one clean view + aug_splits-1 augmented views) "
        "trained with timm's JsdCrossEntropy; 0 = off, else >= 2",
        domain=">=0",
    )


@dataclass
class ModelConfig:
    name: ModelName = _f("resnet18", help="model name (recipes/registry.py; built by models/factory.py)")
    bn_momentum: float = _f(0.1, help="BatchNorm momentum (PyTorch convention)", domain="[0,1]")
    bn_eps: float = _f(1e-5, help="BatchNorm epsilon", domain=">0")
    zero_init_last_bn: bool = _f(True, help="zero gamma of the last BN in each residual block")
    drop_rate: float = _f(0.0, help="dropout before the classifier", domain="[0,1)")


@dataclass
class OptimConfig:
    name: OptimizerName = _f("sgd", help="optimizer: sgd, lars, hybrid (LARS with clipped trust ratio), lamb")
    lr: float = _f(0.1, help="peak learning rate (after warm-up)", domain=">=0")
    lr_scaling: Literal["none", "linear"] = _f(
        "none", help="linear: the LR values are per 256 images, times global_batch / 256 of the current phase"
    )
    warmup_epochs: float = _f(0.0, help="epochs of linear warm-up from warmup_start_lr to lr", domain=">=0")
    warmup_start_lr: float = _f(0.0, help="learning rate at step 0", domain=">=0")
    final_lr: float = _f(0.0, help="learning rate at the last iteration (linear decay)", domain=">=0")
    momentum: float = _f(0.9, help="momentum (start value when momentum_schedule is not constant)", domain="[0,1)")
    momentum_end: float | None = _f(
        None, help="linear: momentum at the last iteration; cyclic: at the end of warm-up", domain="[0,1)"
    )
    momentum_schedule: Literal["constant", "linear", "cyclic"] = _f("constant", help="momentum shape")
    nesterov: bool = _f(True, help="Nesterov momentum")
    weight_decay: float = _f(1e-4, help="L2 weight decay", domain=">=0")
    no_bn_decay: bool = _f(True, help="no weight decay on BatchNorm parameters and biases")
    label_smoothing: float = _f(0.1, help="label smoothing of the cross-entropy loss", domain="[0,1)")
    eta: float = _f(
        1e-3, help="lars/hybrid: layer trust ratio = eta * norm(w) / (norm(g) + weight_decay * norm(w))", domain=">0"
    )
    trust_clip_min: float = _f(1e-5, help="hybrid: lower clip of the layer trust ratio", domain=">0")
    trust_clip_max: float = _f(1.0, help="hybrid: upper clip of the layer trust ratio", domain=">0")
    lars_momentum: Literal["torch", "tf"] = _f(
        "torch",
        help="lars/hybrid momentum: torch = trust ratio inside the buffer (timm, apex); tf = buffer of raw "
        "gradients, lr x trust ratio applied to the whole buffer (TensorFlow's LARSOptimizer, the record's)",
    )
    adapt_bn_bias: bool = _f(False, help="lars/hybrid/lamb: also adapt BN and bias parameters (else plain SGD)")


@dataclass
class CommConfig:
    backend: AllreduceName = _f("ddp", help="gradient allreduce backend (recipes/registry.py; see recipes/comm)")
    bucket_cap_mb: float = _f(25.0, help="ddp: bucket size in MB", domain=">0")
    static_graph: bool = _f(False, help="ddp: static_graph=True")
    bucket_mb: float = _f(
        8.0,
        help="multistream: target bucket size in MB (buckets are balanced around it); horovod: fusion threshold",
        domain=">0",
    )
    streams: int = _f(
        4, help="multistream: communicators K (process groups; NCCL streams / gloo TCP connections)", domain=">0"
    )
    slices: int = _f(
        2, help="multistream: slices S per bucket; slice j of bucket b goes to communicator (b*S+j) mod K", domain=">0"
    )
    compression: Literal["none", "fp16", "bf16"] = _f(
        "none", help="multistream/horovod: gradient wire format (averaged in fp32 before the cast)"
    )
    concurrency: Literal["overlap", "serialize"] = _f(
        "overlap",
        help="multistream: overlap = communicators run at once; serialize = one collective in flight "
        "(PyTorch's rule for several NCCL process groups)",
    )
    autotune: bool = _f(
        False, help="multistream: tune (bucket_mb, streams, slices) in the first steps; horovod: HOROVOD_AUTOTUNE"
    )
    tune_method: Literal["bayes", "grid"] = _f("bayes", help="autotune search: Gaussian-process EI or a grid")
    tune_bucket_mb: list[float] = _f(help="autotune: bucket sizes to search (MB)", factory=lambda: [2.0, 4.0, 8.0,
                                     16.0, 32.0], domain="nonempty >0")  # fmt: skip
    tune_streams: list[int] = _f(
        help="autotune: communicator counts to search", factory=lambda: [1, 2, 3, 4], domain="nonempty >0"
    )
    tune_slices: list[int] = _f(
        help="autotune: slice counts to search", factory=lambda: [1, 2, 4], domain="nonempty >0"
    )
    tune_start: Literal["config", "model"] = _f(
        "config",
        help="autotune: first candidate; config = bucket_mb/streams/slices; model = the step-time model's best for "
        "this cluster (hosts x GPUs from the launcher, link_gbit/flow_gbit/latency_us), then in predicted order",
    )
    link_gbit: float | None = _f(
        None, help="tune_start model: network link per host and direction (Gbit/s)", domain=">0"
    )
    flow_gbit: float | None = _f(
        None, help="tune_start model: one TCP flow's ceiling (Gbit/s); null = no per-flow cap", domain=">0"
    )
    latency_us: float = _f(
        50.0, help="tune_start model: per-message latency of one ring step (microseconds)", domain=">=0"
    )
    tune_max_candidates: int = _f(10, help="autotune: candidates measured before the best is kept", domain=">0")
    tune_warmup_steps: int = _f(3, help="autotune: steps discarded before the first measurement", domain=">=0")
    tune_steps_per_window: int = _f(2, help="autotune: steps averaged into one window", domain=">0")
    tune_windows: int = _f(3, help="autotune: windows per candidate; its score is their median", domain=">0")
    tune_cache: str | None = _f(
        "", help="autotune: JSON file of winners ('' = ~/.cache/dawnbench/allreduce_tuning.json, null = no cache)"
    )
    network: str = _f(
        "auto",
        help="autotune: network description in the cache key (auto: nodes, procs, socket interface)",
        domain="nonempty",
    )


@dataclass
class DistConfig:
    backend: Literal["auto", "gloo", "nccl"] = _f("auto", help="process group backend; auto: nccl on GPU")
    timeout_s: float = _f(300.0, help="collective timeout; a dead or hung peer fails within this time", domain=">0")


@dataclass
class LogConfig:
    every_steps: int = _f(10, help="console line every N steps (rank 0)", domain=">0")
    tensorboard: bool = _f(True, help="write TensorBoard scalars to <run_dir>/tb")


@dataclass
class CheckpointConfig:
    enabled: bool = _f(True, help="write a checkpoint at the end of every epoch (checkpoint.pt = the newest)")
    every_steps: int = _f(
        0, help="also every N optimizer steps, for mid-epoch recovery; 0 = epoch ends only", domain=">=0"
    )
    keep: int = _f(
        2, help="keep the newest K checkpoints (an older one is the fallback if the newest is damaged)", domain=">0"
    )
    resume: bool | Literal["force"] = _f(
        True,
        help="continue from the newest good checkpoint of this run in the run directory; false: start a new run "
        "(the old run's files move to <run_dir>/previous/); force: resume even if the recipe changed (recorded)",
    )


@dataclass
class DawnbenchConfig:
    author: str = _f("", help="DAWNBench entry (<run_dir>/dawnbench.json): author or team")
    author_email: str = _f("", help="DAWNBench entry: contact e-mail (authorEmail)")
    framework: str = _f("", help="DAWNBench entry: framework; empty: 'PyTorch <version>'")
    code_url: str = _f("", help="DAWNBench entry: URL of the code (codeURL)")
    model: str = _f("", help="DAWNBench entry: model; empty: model.name")
    hardware: str = _f("", help="DAWNBench entry: hardware; empty: detected (machines x processes x device)")
    cost_per_hour: float | None = _f(
        None, help="DAWNBench entry: USD per hour for all machines (costPerHour)", domain=">=0"
    )
    require: bool = _f(
        False, help="refuse to start without author and author_email (fields the entries repository requires)"
    )


@dataclass
class Config:
    run: RunConfig = _f(help="run identity and global switches", factory=RunConfig)
    data: DataConfig = _f(help="input pipeline", factory=DataConfig)
    model: ModelConfig = _f(help="network", factory=ModelConfig)
    optim: OptimConfig = _f(help="optimizer, loss and schedules", factory=OptimConfig)
    comm: CommConfig = _f(help="gradient allreduce", factory=CommConfig)
    dist: DistConfig = _f(help="torch.distributed", factory=DistConfig)
    log: LogConfig = _f(help="logging", factory=LogConfig)
    checkpoint: CheckpointConfig = _f(help="checkpoints and resume", factory=CheckpointConfig)
    dawnbench: DawnbenchConfig = _f(help="DAWNBench submission entry", factory=DawnbenchConfig)
    phases: list[Phase] = _f(
        help="progressive-resizing schedule: list of {epochs, image_size, batch_size, ...}",
        factory=lambda: [Phase(epochs=1, image_size=224, batch_size=256)],
        domain="nonempty",
    )

    @property
    def epochs(self) -> int:
        return sum(p.epochs for p in self.phases)


# ---------------------------------------------------------------------------------------------------------
# Conversion of plain YAML data into the typed schema.


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", bool: "true/false", str: "a string"}.get(tp, str(tp))


def _closest(full: str, valid: list[str]) -> str:
    """' (did you mean 'optim.lr'?)' for the valid key at the same level closest to the last part of `full`."""
    prefix, _, key = full.rpartition(".")
    match = difflib.get_close_matches(key, valid, n=1, cutoff=0.0)
    return f" (did you mean '{prefix + '.' if prefix else ''}{match[0]}'?)" if match else ""


def _convert(value: Any, tp: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    bad = ConfigError(f"{path}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            choices = [a for a in typing.get_args(tp) if isinstance(a, str)]
            match = difflib.get_close_matches(value, choices, n=1, cutoff=0.5) if isinstance(value, str) else []
            raise ConfigError(f"{bad}{f' (did you mean {match[0]!r}?)' if match else ''}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, path)
            except ConfigError:
                continue
        raise bad
    if origin is list:
        if not isinstance(value, list):
            raise bad
        (item_tp,) = typing.get_args(tp)
        return [_convert(v, item_tp, f"{path}.{i}") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise bad
        k_tp, v_tp = typing.get_args(tp)
        return {_convert(k, k_tp, path): _convert(v, v_tp, f"{path}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad
        return _build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e30 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                raise bad from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if tp is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # YAML reads a folder named 160 as a number
        if not isinstance(value, str):
            raise bad
        return value
    raise bad


def _check_domain(value: Any, tp: Any, domain: str, path: str) -> None:
    """Raise ConfigError when a converted value lies outside its key's domain (or is a NaN/infinite number)."""
    if value is None:
        return
    parts = domain.split()
    if isinstance(value, list) and typing.get_origin(_plain(tp)) is list:
        if "nonempty" in parts and not value:
            raise ConfigError(f"{path}: expected a non-empty list, got []")
        item_tp = typing.get_args(_plain(tp))[0]
        for i, v in enumerate(value):
            _check_domain(v, item_tp, " ".join(d for d in parts if d != "nonempty"), f"{path}.{i}")
        return
    if isinstance(value, float) and not math.isfinite(value):
        extra = f" {domain_text(domain)}" if domain else ""
        raise ConfigError(f"{path}: expected a finite number{extra}, got {value!r}")
    for d in parts:
        test, text = DOMAINS[d]
        if not test(value):
            what = _type_name(_plain(tp))
            raise ConfigError(f"{path}: expected {what} {text}, got {value!r}")


def _build(cls: type, data: dict, path: str) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        full = f"{path}.{key}" if path else str(key)
        if key not in fields:
            raise ConfigError(f"unknown key '{full}'{_closest(full, list(fields))}")
        kwargs[key] = _convert(value, hints[key], full)
        _check_domain(kwargs[key], hints[key], fields[key].metadata.get("domain", ""), full)
    for name, f in fields.items():
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            full = f"{path}.{name}" if path else name
            raise ConfigError(f"{full}: required key is missing ({f.metadata.get('help', '')})")
    return cls(**kwargs)


def _validate(cfg: Config) -> None:
    """Checks that involve several keys (one key's own range is its domain, checked in _build)."""
    if cfg.data.aug_splits == 1:
        raise ConfigError(f"data.aug_splits: expected 0 (off) or an integer >= 2, got {cfg.data.aug_splits}")
    if (cfg.data.aug_splits or cfg.data.auto_augment) and cfg.data.backend != "torch":
        raise ConfigError(
            f"data.auto_augment/aug_splits: timm's PIL augmentations run on data.backend=torch only, "
            f"got data.backend={cfg.data.backend!r}"
        )
    if cfg.optim.warmup_epochs > cfg.epochs:
        raise ConfigError(
            f"optim.warmup_epochs: {cfg.optim.warmup_epochs} is longer than the schedule ({cfg.epochs} epochs)"
        )
    if cfg.optim.trust_clip_min > cfg.optim.trust_clip_max:
        raise ConfigError(
            f"optim.trust_clip_min: {cfg.optim.trust_clip_min} is above optim.trust_clip_max "
            f"({cfg.optim.trust_clip_max})"
        )
    for name, root in cfg.data.roots.items():
        if not _is_name(name) or not root.strip():
            raise ConfigError(f"data.roots: expected names mapped to non-empty paths, got {name!r}: {root!r}")


# ---------------------------------------------------------------------------------------------------------
# Files, inheritance and overrides.


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error (not: the last one wins)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, typing.Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key '{key}' (first at line {seen[key].line + 1})", key_node.start_mark
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (not UTF-8)") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{path}:{where}: not valid YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_yaml_tree(path: str | Path, _seen: tuple = ()) -> dict:
    """Read a YAML config, resolving `extends:` (a path relative to the file, or a list of them)."""
    path = Path(path).resolve()
    if path in _seen:
        raise ConfigError(f"{path}: circular 'extends' chain: {' -> '.join(str(p) for p in _seen + (path,))}")
    data = _read_yaml(path)
    parents = data.pop("extends", None)
    if parents is None:
        return data
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) and p for p in parents):
        raise ConfigError(f"{path}: extends: expected a YAML file name or a list of them, got {parents!r}")
    merged: dict = {}
    for parent in parents:
        if Path(parent).suffix.lower() not in (".yaml", ".yml"):
            # Not read at all: an error about its content would print a line of an arbitrary file.
            raise ConfigError(f"{path}: extends: '{parent}' is not a .yaml/.yml file")
        merged = _merge(merged, load_yaml_tree(path.parent / parent, _seen + (path,)))
    return _merge(merged, data)


def _set_dotted(tree: dict, dotted: str, raw: str) -> None:
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    keys = dotted.split(".")
    node: Any = tree
    schema: Any = Config
    for i, key in enumerate(keys):
        here = ".".join(keys[: i + 1])
        last = i == len(keys) - 1
        if isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise ConfigError(f"{here}: expected a list index below {len(node)}")
            idx = int(key)
            schema = typing.get_args(schema)[0]
            if last:
                node[idx] = value
            else:
                node = node[idx]
            continue
        if dataclasses.is_dataclass(schema):
            names = [f.name for f in dataclasses.fields(schema)]
            if key not in names:
                raise ConfigError(f"unknown key '{here}'{_closest(here, names)}")
            schema = typing.get_type_hints(schema)[key]
            if _plain(schema) is str and last and not isinstance(value, str) and value is not None:
                value = raw  # data.root=123 means the folder "123"
        if last:
            node[key] = value
        else:
            if not isinstance(node.get(key), (dict, list)):
                node[key] = {} if dataclasses.is_dataclass(schema) or typing.get_origin(schema) is dict else []
            node = node[key]


def _plain(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def parse_override(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise ConfigError(f"override '{text}': expected key=value (for example optim.lr=0.4)")
    key, raw = text.split("=", 1)
    if not key:
        raise ConfigError(f"override '{text}': empty key")
    return key.strip(), raw


_KEY_START = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*=")


def split_overrides(text: str) -> list[str]:
    """`key=value` overrides from one string (make's OVERRIDES=): a new one starts at a word that begins with
    `key=` once the brackets and quotes of the previous one are closed, so values may hold spaces
    ('data.roots={160: /data/imagenet-160} phases.0.root=160' is two overrides)."""
    out: list[str] = []
    for word in text.split():
        prev = out[-1] if out else ""
        closed = all(prev.count(a) == prev.count(b) for a, b in ("{}", "[]", "()")) and prev.count("'") % 2 == 0
        closed = closed and prev.count('"') % 2 == 0
        if not out or (closed and _KEY_START.match(word)):
            out.append(word)
        else:
            out[-1] += " " + word
    return out


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Load a YAML config (with `extends:`), apply `key=value` overrides, validate, return a `Config`."""
    tree = load_yaml_tree(path) if path is not None else {}
    if "phases" not in tree and any(o.startswith("phases.") for o in overrides):
        tree["phases"] = [dataclasses.asdict(p) for p in Config().phases]
    for text in overrides:
        _set_dotted(tree, *parse_override(text))
    try:
        cfg = _build(Config, tree, "")
    except ConfigError as e:
        where = f"{path}: " if path is not None else ""
        raise ConfigError(f"{where}{e}") from None
    _validate(cfg)
    return cfg


def config_from_dict(data: dict, source: str = "") -> Config:
    """A validated `Config` from plain data (a checkpoint's `config`, a parsed YAML tree without `extends:`)."""
    try:
        cfg = _build(Config, data, "")
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}" if source else str(e)) from None
    _validate(cfg)
    return cfg


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False)


def reference_table() -> str:
    """Markdown table of every key, its type, default and meaning (docs/config.md)."""
    rows = ["| key | type | allowed | default | meaning |", "|---|---|---|---|---|"]

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        defaults = cls() if cls is not Phase else None
        for f in dataclasses.fields(cls):
            key = f"{prefix}{f.name}"
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp):
                walk(tp, key + ".")
                continue
            if typing.get_origin(tp) is list and dataclasses.is_dataclass(typing.get_args(tp)[0]):
                allowed = domain_text(f.metadata.get("domain", "")) or "any"
                rows.append(f"| `{key}` | list | {allowed} | see below | {f.metadata['help']} |")
                walk(typing.get_args(tp)[0], key + "[].")
                continue
            if defaults is not None:
                default = getattr(defaults, f.name)
            else:
                default = "required" if f.default is dataclasses.MISSING else f.default
            allowed = domain_text(f.metadata.get("domain", "")) or "any"
            if _plain(tp) is float or typing.get_origin(_plain(tp)) is list and typing.get_args(_plain(tp))[0] is float:
                allowed = "finite" + (f", {allowed}" if allowed != "any" else "")
            rows.append(f"| `{key}` | {_type_name(tp)} | {allowed} | `{default!r}` | {f.metadata['help']} |")

    walk(Config, "")
    return "\n".join(rows)
