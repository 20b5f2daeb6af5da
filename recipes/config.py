"""Typed configuration: one schema, YAML files with `extends:` inheritance, dotted `key=value` overrides.

Every hyperparameter is declared exactly once below, with its default and its meaning (the `help` metadata).
`load_config(path, overrides)` returns a validated `Config`; any problem raises `ConfigError` with the file,
key, expected type and value named.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A configuration problem a user can fix; the message names the key and what was expected."""


def _f(default: Any = dataclasses.MISSING, help: str = "", factory: Any = None) -> Any:
    meta = {"help": help}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class Phase:
    """One block of epochs of the progressive-resizing schedule."""

    epochs: int = _f(help="number of epochs in this phase")
    image_size: int = _f(help="training crop size in pixels (square)")
    batch_size: int = _f(help="GLOBAL batch size (summed over all ranks)")
    min_scale: float = _f(0.35, help="smallest area fraction of RandomResizedCrop")
    val_image_size: int | None = _f(None, help="validation crop size; default: image_size")
    rect_val: bool = _f(False, help="rectangular validation (aspect-ratio batches, no crop)")
    root: str = _f("full", help="which entry of data.roots this phase reads (pre-resized copies)")


@dataclass
class RunConfig:
    name: str = _f("run", help="run name; the run directory is <out_dir>/<name>")
    out_dir: str = _f("runs", help="parent directory of run directories")
    seed: int = _f(0, help="global seed; rank r uses seed + r for its own randomness")
    deterministic: bool = _f(False, help="use deterministic algorithms (slower; for exact resume tests)")
    device: Literal["auto", "cpu", "cuda"] = _f("auto", help="auto = cuda if available else cpu")
    threads: int = _f(0, help="torch intra-op threads per process; 0 = cores / local processes")
    target_top1: float | None = _f(None, help="top-1 accuracy (%) whose first crossing is reported")
    target_top5: float | None = _f(None, help="top-5 accuracy (%) whose first crossing is reported")
    stop_at_target: bool = _f(False, help="stop training once every given target is reached")
    nodes: int = _f(1, help="machines the config is written for (launcher and --plan)")
    procs_per_node: int = _f(1, help="processes (GPUs) per machine the config is written for")
    amp: Literal["none", "bf16", "fp16"] = _f("none", help="mixed precision dtype")
    channels_last: bool = _f(False, help="NHWC memory format for model and inputs")
    on_nonfinite: Literal["halt", "skip"] = _f("halt", help="non-finite loss/gradients: stop, or skip the step")


@dataclass
class DataConfig:
    backend: Literal["torch", "dali", "synthetic"] = _f("torch", help="input pipeline")
    root: str = _f("data/sample", help="dataset root with train/ and val/ in ImageNet folder layout")
    roots: dict[str, str] = _f(
        help="named dataset copies (e.g. pre-resized '160'); 'full' defaults to data.root", factory=dict
    )
    workers: int = _f(1, help="decoding workers (threads for DALI, processes for torch) per rank")
    val_crop_ratio: float = _f(0.875, help="validation: resize shorter side to size/ratio, center crop")
    val_batch_size: int = _f(64, help="per-rank validation batch size")
    skip_corrupt: bool = _f(False, help="skip undecodable files (and report them) instead of failing")
    synthetic_size: int = _f(1281167, help="synthetic backend: training images per epoch")
    synthetic_classes: int = _f(1000, help="synthetic backend: number of classes")
    dali_dtype: Literal["auto", "float32", "float16"] = _f(
        "auto", help="dali: output dtype; auto = float16 on CUDA with run.amp=fp16, else float32"
    )
    dali_prefetch: int = _f(2, help="dali: batches prepared ahead of the training loop (prefetch_queue_depth)")


@dataclass
class ModelConfig:
    name: str = _f("resnet18", help="model name (see models/factory.py)")
    bn_momentum: float = _f(0.1, help="BatchNorm momentum (PyTorch convention)")
    bn_eps: float = _f(1e-5, help="BatchNorm epsilon")
    zero_init_last_bn: bool = _f(True, help="zero gamma of the last BN in each residual block")
    drop_rate: float = _f(0.0, help="dropout before the classifier")


@dataclass
class OptimConfig:
    name: str = _f("sgd", help="optimizer: sgd, lars, hybrid (LARS with clipped trust ratio), lamb (recipes/optim.py)")
    lr: float = _f(0.1, help="peak learning rate (after warm-up)")
    lr_scaling: Literal["none", "linear"] = _f(
        "none", help="linear: the LR values are per 256 images, times global_batch / 256 of the current phase"
    )
    warmup_epochs: float = _f(0.0, help="epochs of linear warm-up from warmup_start_lr to lr")
    warmup_start_lr: float = _f(0.0, help="learning rate at step 0")
    final_lr: float = _f(0.0, help="learning rate at the last iteration (linear decay)")
    momentum: float = _f(0.9, help="momentum (start value when momentum_schedule is not constant)")
    momentum_end: float | None = _f(None, help="linear: momentum at the last iteration; cyclic: at the end of warm-up")
    momentum_schedule: Literal["constant", "linear", "cyclic"] = _f("constant", help="momentum shape")
    nesterov: bool = _f(True, help="Nesterov momentum")
    weight_decay: float = _f(1e-4, help="L2 weight decay")
    no_bn_decay: bool = _f(True, help="no weight decay on BatchNorm parameters and biases")
    label_smoothing: float = _f(0.1, help="label smoothing of the cross-entropy loss")
    eta: float = _f(1e-3, help="lars/hybrid: layer trust ratio = eta * norm(w) / (norm(g) + weight_decay * norm(w))")
    trust_clip_min: float = _f(1e-5, help="hybrid: lower clip of the layer trust ratio")
    trust_clip_max: float = _f(1.0, help="hybrid: upper clip of the layer trust ratio")
    adapt_bn_bias: bool = _f(False, help="lars/hybrid/lamb: also adapt BN and bias parameters (else plain SGD)")


@dataclass
class CommConfig:
    backend: str = _f("ddp", help="gradient allreduce backend (see recipes/comm)")
    bucket_cap_mb: float = _f(25.0, help="ddp: bucket size in MB")
    static_graph: bool = _f(False, help="ddp: static_graph=True")
    bucket_mb: float = _f(
        8.0, help="multistream: target bucket size in MB (buckets are balanced around it); horovod: fusion threshold"
    )
    streams: int = _f(4, help="multistream: communicators K (process groups; NCCL streams / gloo TCP connections)")
    slices: int = _f(2, help="multistream: slices S per bucket; slice j of bucket b goes to communicator (b*S+j) mod K")
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
                                     16.0, 32.0])  # fmt: skip
    tune_streams: list[int] = _f(help="autotune: communicator counts to search", factory=lambda: [1, 2, 3, 4])
    tune_slices: list[int] = _f(help="autotune: slice counts to search", factory=lambda: [1, 2, 4])
    tune_max_candidates: int = _f(10, help="autotune: candidates measured before the best is kept")
    tune_warmup_steps: int = _f(3, help="autotune: steps discarded before the first measurement")
    tune_steps_per_window: int = _f(2, help="autotune: steps averaged into one window")
    tune_windows: int = _f(3, help="autotune: windows per candidate; its score is their median")
    tune_cache: str | None = _f(
        "", help="autotune: JSON file of winners ('' = ~/.cache/dawnbench/allreduce_tuning.json, null = no cache)"
    )
    network: str = _f(
        "auto", help="autotune: network description in the cache key (auto: nodes, procs, socket interface)"
    )


@dataclass
class DistConfig:
    backend: Literal["auto", "gloo", "nccl"] = _f("auto", help="process group backend; auto: nccl on GPU")
    timeout_s: float = _f(300.0, help="collective timeout; a dead or hung peer fails within this time")


@dataclass
class LogConfig:
    every_steps: int = _f(10, help="console line every N steps (rank 0)")
    tensorboard: bool = _f(True, help="write TensorBoard scalars to <run_dir>/tb")


@dataclass
class CheckpointConfig:
    enabled: bool = _f(True, help="write a checkpoint at the end of every epoch (checkpoint.pt = the newest)")
    every_steps: int = _f(0, help="also every N optimizer steps, for mid-epoch recovery; 0 = epoch ends only")
    keep: int = _f(2, help="keep the newest K checkpoints (an older one is the fallback if the newest is damaged)")
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
    cost_per_hour: float | None = _f(None, help="DAWNBench entry: USD per hour for all machines (costPerHour)")


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
            raise bad
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


def _build(cls: type, data: dict, path: str) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        full = f"{path}.{key}" if path else str(key)
        if key not in fields:
            raise ConfigError(f"unknown key '{full}'{_closest(full, list(fields))}")
        kwargs[key] = _convert(value, hints[key], full)
    for name, f in fields.items():
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            full = f"{path}.{name}" if path else name
            raise ConfigError(f"{full}: required key is missing ({f.metadata.get('help', '')})")
    return cls(**kwargs)


def _validate(cfg: Config) -> None:
    if not cfg.phases:
        raise ConfigError("phases: expected at least one phase")
    for i, p in enumerate(cfg.phases):
        for key in ("epochs", "image_size", "batch_size"):
            if getattr(p, key) <= 0:
                raise ConfigError(f"phases.{i}.{key}: expected a positive integer, got {getattr(p, key)}")
        if not 0.0 < p.min_scale <= 1.0:
            raise ConfigError(f"phases.{i}.min_scale: expected a number in (0, 1], got {p.min_scale}")
    if cfg.data.dali_prefetch < 1:
        raise ConfigError(f"data.dali_prefetch: expected a positive integer, got {cfg.data.dali_prefetch}")
    if not 0.0 < cfg.data.val_crop_ratio <= 1.0:
        raise ConfigError(f"data.val_crop_ratio: expected a number in (0, 1], got {cfg.data.val_crop_ratio}")
    if cfg.optim.warmup_epochs > cfg.epochs:
        raise ConfigError(
            f"optim.warmup_epochs: {cfg.optim.warmup_epochs} is longer than the schedule ({cfg.epochs} epochs)"
        )
    if cfg.dawnbench.cost_per_hour is not None and cfg.dawnbench.cost_per_hour < 0:
        raise ConfigError(f"dawnbench.cost_per_hour: expected a number >= 0, got {cfg.dawnbench.cost_per_hour}")
    if cfg.log.every_steps <= 0:
        raise ConfigError(f"log.every_steps: expected a positive integer, got {cfg.log.every_steps}")


# ---------------------------------------------------------------------------------------------------------
# Files, inheritance and overrides.


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text())
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
    merged: dict = {}
    for parent in parents:
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


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False)


def reference_table() -> str:
    """Markdown table of every key, its type, default and meaning (docs/config.md)."""
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]

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
                rows.append(f"| `{key}` | list | see below | {f.metadata['help']} |")
                walk(typing.get_args(tp)[0], key + "[].")
                continue
            if defaults is not None:
                default = getattr(defaults, f.name)
            else:
                default = "required" if f.default is dataclasses.MISSING else f.default
            rows.append(f"| `{key}` | {_type_name(tp)} | `{default!r}` | {f.metadata['help']} |")

    walk(Config, "")
    return "\n".join(rows)
