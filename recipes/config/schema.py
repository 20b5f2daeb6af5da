"""The configuration schema: every hyperparameter declared exactly once, with its default, its meaning (the
`help` metadata) and its domain (the values allowed besides the type).

How a field is declared (`_f`: its domain, and `unbounded` / `cross`, which the tests read) is recipes/config/fields.py;
loading YAML into it is recipes/config/load.py; the reference table of docs/config.md is recipes/config/reference.py.

A plug-in seam's section (optim, comm, data, model: base/registry.py `SEAMS`) declares here only the keys every part of
the seam reads; each part's own keys are its config class (recipes/config/plugins.py, named by its record), written
flat in the section and held in `own` (`PluginSection`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from base import registry
from recipes.config.fields import (  # noqa: F401 (load.py and reference.py take these from the schema)
    _COUNT,
    _FACTOR,
    _FIGURE,
    DOMAINS,
    _f,
    _is_name,
    _plain,
    _type_name,
    domain_rule,
    domain_text,
)
from recipes.config.rules import BY_SIZE, WARMUP

# The names each plug-in seam accepts, from its registry: a wrong name fails when the config loads.
AllreduceName = Literal[tuple(registry.ALLREDUCE_BACKENDS)]
InputName = Literal[tuple(registry.INPUT_PIPELINES)]
ModelName = Literal[tuple(registry.MODELS)]
OptimizerName = Literal[tuple(registry.OPTIMIZERS)]


@dataclass
class NoKnobs:
    """The config of a part with no keys of its own (a record whose `config` is "")."""


def own_class(record) -> type:
    """The config class of a plug-in's record (its `config`)."""
    return registry.resolve(record.config) if record.config else NoKnobs


@functools.cache
def knob_fields(seam: str) -> dict[str, tuple[dataclasses.Field, Any]]:
    """Every part's own key of a seam ("optim"): name -> (its field, its type), in the records' order. A key two parts
    read is one declaration, in a class both inherit (recipes/config/plugins.py): a second declaration of a name (in
    another class, or in the section itself) is a TypeError naming both, so no part is validated against another's
    domain or default."""
    shared = set(registry.SEAMS[seam].shared)
    out: dict[str, tuple[dataclasses.Field, Any]] = {}
    where: dict[str, type] = {}
    for record in registry.SEAMS[seam].records.values():
        cls = own_class(record)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            home = _declaring_class(cls, f.name)
            if f.name in shared:
                raise TypeError(f"{seam}.{f.name}: declared by the section and again by {home.__qualname__}")
            if f.name in where and where[f.name] is not home:
                first = where[f.name]
                raise TypeError(
                    f"{seam}.{f.name}: declared by {first.__qualname__} ({_declaration(out[f.name])}) and again by "
                    f"{home.__qualname__} ({_declaration((f, hints[f.name]))}): declare it once, in a class both "
                    "inherit"
                )
            where[f.name] = home
            out.setdefault(f.name, (f, hints[f.name]))
    return out


def _declaring_class(cls: type, name: str) -> type:
    """The class of `cls`'s bases (itself included) whose body declares field `name`."""
    return next(c for c in cls.__mro__ if name in vars(c).get("__annotations__", {}))


def _declaration(field_type: tuple[dataclasses.Field, Any]) -> str:
    f, tp = field_type
    domain = f.metadata.get("domain", "")
    return f"{_type_name(tp)}, default {default_of(f)!r}" + (f", domain {domain!r}" if domain else "")


def default_of(f: dataclasses.Field) -> Any:
    """A field's default value (a fresh one from its factory)."""
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def section_fields(cls: type) -> dict[str, tuple[dataclasses.Field, Any]]:
    """The keys a YAML mapping of schema class `cls` may hold: name -> (field, type). A seam's section: its own
    fields, then every part's own keys (`knob_fields`)."""
    hints = typing.get_type_hints(cls)
    out = {f.name: (f, hints[f.name]) for f in dataclasses.fields(cls) if f.name != "own"}
    if issubclass(cls, PluginSection):
        out.update(knob_fields(cls.SEAM))
    return out


class PluginSection:
    """A seam's section: its fields are the keys every part of the seam reads; `own` is the chosen part's config (an
    instance of its record's `config` class), written and read flat: `CommConfig(backend="multistream", streams=8)`
    holds `own=MultistreamConfig(streams=8, ...)`, and `.streams` reads it. Another part's keys given to it are kept in
    `unread` (inert: said, and marked by --print-config, recipes/config/inert.py). Reading another part's key is an
    AttributeError naming the key, the chosen part and the parts that read it: code that may run under any part asks
    `get(key, absent)`, and code that describes another part (the time model's rows) asks `as_part(name)`."""

    SEAM: ClassVar[str] = ""  # its name in base/registry.py SEAMS
    own: Any
    unread: dict[str, Any]

    def _choose(self, knobs: dict[str, Any]) -> None:
        """Build `own` for the part the choosing key names: the keys it shares with the current `own` (or given to it
        before, in `unread`), then `knobs`. The old part's keys the new one does not read, when not at their default,
        stay in `unread`, so choosing the old part again restores them."""
        seam = registry.SEAMS[self.SEAM]
        key = seam.key
        record = seam.records.get(getattr(self, key))  # an unknown name (built in code): its factory says so
        cls = own_class(record) if record is not None else NoKnobs
        mine = {f.name for f in dataclasses.fields(cls)}
        wrong = [k for k in knobs if k not in knob_fields(self.SEAM)]
        if wrong:
            raise TypeError(f"{type(self).__name__}: unexpected keys {', '.join(wrong)}")
        old, before = self.__dict__.get("own"), dict(self.__dict__.get("unread", {}))
        if old is not None:
            for k, v in vars(old).items():
                if k in mine or v != default_of(knob_fields(self.SEAM)[k][0]):
                    before[k] = v
        given = {**before, **knobs}
        object.__setattr__(self, "own", cls(**{k: v for k, v in given.items() if k in mine}))
        object.__setattr__(self, "unread", {k: v for k, v in given.items() if k not in mine})

    def _not_read(self, name: str) -> AttributeError:
        readers = [r.name for r in registry.SEAMS[self.SEAM].records.values() if name in r.reads]
        return AttributeError(
            f"{self.SEAM}.{name}: not a key of {self.choice} (read by {', '.join(readers) or 'none'}); "
            f"ask {self.SEAM}.get({name!r}, <value where not read>) or {self.SEAM}.as_part(<name>)"
        )

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        if name.startswith("__") or "own" not in d:
            raise AttributeError(name)
        if name in {f.name for f in dataclasses.fields(d["own"])}:
            return getattr(d["own"], name)
        if name in knob_fields(self.SEAM):
            raise self._not_read(name)
        raise AttributeError(f"'{type(self).__name__}' has no key {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        d = self.__dict__
        if name in self.__dataclass_fields__ or "own" not in d:
            object.__setattr__(self, name, value)
            if name == registry.SEAMS[self.SEAM].key and "own" in d:
                self._choose({})  # another part: its config, keeping the keys the two share
        elif name in {f.name for f in dataclasses.fields(d["own"])}:
            setattr(d["own"], name, value)
        else:
            raise AttributeError(f"{self.SEAM}.{name}: not a key of the chosen part ({self.choice})")

    def get(self, name: str, absent: Any = None) -> Any:
        """The chosen part's value of `name`, or `absent` where it does not read that key (another part's key); a name
        no part declares is an AttributeError."""
        if name in {f.name for f in dataclasses.fields(self)} or name in vars(self.own):
            return getattr(self, name)
        if name in knob_fields(self.SEAM):
            return absent
        raise AttributeError(f"'{type(self).__name__}' has no key {name!r}")

    def as_part(self, name: str) -> PluginSection:
        """A copy of this section with `name` chosen: the keys the two parts share, and the values given for the other
        part's keys (`unread`), carried over (the time model's row of a backend that is not the chosen one)."""
        other = copy.deepcopy(self)
        setattr(other, registry.SEAMS[self.SEAM].key, name)
        return other

    @property
    def choice(self) -> str:
        """The choosing key and its value ("optim.name=sgd")."""
        key = registry.SEAMS[self.SEAM].key
        return f"{self.SEAM}.{key}={getattr(self, key)}"

    def flat(self) -> dict[str, Any]:
        """Every key of the section as the YAML writes it: the shared keys, the chosen part's, then those of another
        part given to it."""
        shared = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "own"}
        return copy.deepcopy({**shared, **dataclasses.asdict(self.own), **self.unread})


def _section(seam: str):
    """@dataclass for a seam's section (`PluginSection`), whose constructor also takes the parts' own keys, flat."""

    def wrap(cls: type) -> type:
        cls = dataclass(cls)
        cls.SEAM = seam
        init, names = cls.__init__, {f.name for f in dataclasses.fields(cls)}

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            knobs = {k: kwargs.pop(k) for k in list(kwargs) if k not in names}
            init(self, *args, **kwargs)
            self._choose(knobs)

        cls.__init__ = __init__
        return cls

    return wrap


_OWN = _f(None, help="the chosen part's own keys (recipes/config/plugins.py), written flat in the section")


@dataclass
class Phase:
    """One block of epochs of the progressive-resizing schedule."""

    epochs: int = _f(help="number of epochs in this phase", domain=">0 <=10000")
    image_size: int = _f(help="training crop size in pixels (square)", domain=">0 <=4096")
    batch_size: int = _f(help="GLOBAL batch size (summed over all ranks)", domain=">0 <=1048576")
    min_scale: float = _f(0.35, help="smallest area fraction of RandomResizedCrop", domain="(0,1]")
    min_object_area: float = _f(
        0.0,
        help="TF's min_object_covered with the whole image as the box: the crop covers at least this fraction "
        "of the image, so the crop area's lower bound is max(min_scale, min_object_area) (docs/input.md)",
        domain="[0,1]",
    )
    val_image_size: int | None = _f(None, help="validation crop size; default: image_size", domain=">0 <=4096")
    rect_val: bool = _f(False, help="rectangular validation (aspect-ratio batches, no crop)")
    root: str = _f("full", help="which entry of data.roots this phase reads (pre-resized copies)", domain="nonempty")


@dataclass
class RunConfig:
    name: str = _f("run", help="run name; the run directory is <out_dir>/<name>", domain="name", trains=False)
    out_dir: str = _f("runs", help="parent directory of run directories", domain="nonempty", trains=False)
    seed: int = _f(0, help="global seed; rank r uses seed + r for its own randomness", domain=">=0 <=2147483647")
    deterministic: bool = _f(False, help="use deterministic algorithms (slower; for exact resume tests)")
    device: Literal["auto", "cpu", "cuda"] = _f("auto", help="auto = cuda if available else cpu")
    threads: int = _f(
        0, help="torch intra-op threads per process; 0 = cores / local processes", domain=">=0 <=1024", trains=False
    )
    target_top1: float | None = _f(
        None, help="top-1 accuracy (%) whose first crossing is reported", domain="[0,100]", trains=False
    )
    target_top5: float | None = _f(
        None, help="top-5 accuracy (%) whose first crossing is reported", domain="[0,100]", trains=False
    )
    stop_at_target: bool = _f(False, help="stop training once every given target is reached", trains=False)
    nodes: int = _f(
        1, help="machines the config is written for (launcher and --plan)", domain=">0 <=65536", trains=False
    )
    procs_per_node: int = _f(
        1, help="processes (GPUs) per machine the config is written for", domain=">0 <=1024", trains=False
    )
    # The GPU the config is written for: predict.py and `train.py --plan` read it (their --gpu
    # overrides it); the names of recipes/memory.py's table (tests/unit/test_predict_gpu.py keeps them equal).
    gpu: Literal["", "v100", "v100-32gb", "a100-40gb", "a100", "h100", "h200"] = _f(
        "",
        help="GPU the config is written for (predict.py and --plan use it and run.amp as the dtype); '' = not named",
        trains=False,
    )
    amp: Literal["none", "bf16", "fp16"] = _f("none", help="mixed precision dtype")
    channels_last: bool = _f(False, help="NHWC memory format for model and inputs")
    on_nonfinite: Literal["halt", "skip"] = _f("halt", help="non-finite loss/gradients: stop, or skip the step")
    accumulate: int = _f(
        1,
        help="gradient accumulation: each optimizer step runs its per-GPU batch as this many micro-batches "
        "(same global batch and schedule; BN statistics per micro-batch; docs/recipe.md)",
        domain=">0 <=4096",
    )
    max_gpu_batch: int | None = _f(
        None,
        help="largest per-GPU micro-batch: each phase accumulates over as many micro-batches as it needs "
        "(at least run.accumulate); null = no limit",
        domain=">0 <=1048576",
    )
    max_gpu_batch_by_size: dict[int, int] = _f(
        help="largest per-GPU micro-batch of the phases at these image sizes ({224: 1024}: px -> images), in "
        "place of run.max_gpu_batch there: only the phases that do not fit accumulate (the presets' choice)",
        factory=dict,
        cross=BY_SIZE,
    )
    compile: Literal["none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = _f(
        "none",
        help="torch.compile the training forward/backward in this mode (inductor; one compile per phase's "
        "image and batch size); none = eager. Validation and checkpoints use the eager module",
        trains=False,
    )
    cuda_graph: bool | Literal["auto"] = _f(
        "auto",
        help="on a CUDA device, the whole training step (forward, backward, allreduce, unscale, optimizer) as one "
        "CUDA graph per phase shape, captured after 3 warm-up steps. auto = only where a GPU run has proven the "
        "optimizer and the engaged backend (base/registry.py); true = wherever each part can be captured; it "
        "runs eager, with one log line per phase saying why, under accumulation, run.compile, DDP or Horovod wrapping "
        "the model, an optimizer that reads lr/momentum or decides on the host (sgd, lamb), or while the multistream "
        "tuner measures (docs/recipe.md; train.py --plan shows the decision per phase)",
        trains=False,
    )
    compile_cache: str = _f(
        "auto",
        help="run.compile's persistent cache folder (inductor's FX-graph and AOTAutograd caches, Triton kernels): a "
        "second run on the same machine loads the compiled step instead of compiling it inside the clock; "
        "auto = ~/.cache/dawnbench/compile (under $XDG_CACHE_HOME if set), off = no graph cache (every compile "
        "cold). The summary's `compile` entry has each input shape's compile seconds and cold/warm",
        domain="nonempty",
        trains=False,
    )
    ema: bool = _f(
        False,
        help="keep an exponential moving average of the weights and BN statistics (timm's ModelEmaV3), "
        "validated alongside the model and saved in the checkpoint",
        trains=False,
    )
    ema_decay: float = _f(0.9998, help="EMA decay per optimizer step (run.ema)", domain="[0,1)", trains=False)
    ema_warmup: bool = _f(
        False,
        help="EMA decay warm-up (timm): 1 - (1 + step)^(-2/3), capped at run.ema_decay, so early weights fade fast",
        trains=False,
    )


@_section("data")
class DataConfig(PluginSection):
    backend: InputName = _f("torch", help="input pipeline (base/registry.py: the data.* keys each reads)")
    val_batch_size: int = _f(64, help="per-rank validation batch size", domain=">0 <=4096", trains=False)
    own: Any = _OWN


@_section("model")
class ModelConfig(PluginSection):
    name: ModelName = _f("resnet18", help="model name (base/registry.py; built by models/factory.py)")
    drop_rate: float = _f(0.0, help="dropout before the classifier", domain="[0,1)")
    own: Any = _OWN


@_section("optim")
class OptimConfig(PluginSection):
    name: OptimizerName = _f("sgd", help="optimizer (base/registry.py; built by recipes/optim.py)")
    lr: float = _f(0.1, help="peak learning rate (after warm-up)", domain=">=0", unbounded=_FACTOR)
    lr_scaling: Literal["none", "linear"] = _f(
        "none", help="linear: the LR values are per 256 images, times global_batch / 256 of the current phase"
    )
    warmup_epochs: float = _f(
        0.0,
        help="epochs of linear warm-up from warmup_start_lr to lr",
        domain=">=0",
        unbounded=_COUNT,
        cross=WARMUP,
    )
    warmup_start_lr: float = _f(0.0, help="learning rate at step 0", domain=">=0", unbounded=_FACTOR)
    final_lr: float = _f(
        0.0, help="learning rate at the last iteration (linear decay)", domain=">=0", unbounded=_FACTOR
    )
    weight_decay: float = _f(1e-4, help="L2 weight decay", domain=">=0", unbounded=_FACTOR)
    no_bn_decay: bool = _f(True, help="no weight decay on BatchNorm parameters and biases")
    label_smoothing: float = _f(0.1, help="label smoothing of the cross-entropy loss", domain="[0,1)")
    clip_grad_norm: float = _f(
        0.0,
        help="clip the gradients' total L2 norm (after the allreduce and fp16 unscaling, before the optimizer step) "
        "to this value, on the device; 0 = off. Every optimizer",
        domain=">=0",
        unbounded=_FACTOR,
    )
    own: Any = _OWN


@_section("comm")
class CommConfig(PluginSection):
    backend: AllreduceName = _f("ddp", help="gradient allreduce backend (base/registry.py; see recipes/comm)")
    gpu_profile: str = _f(
        "",
        help="tune_start model: the GPU's measured rates (make gpu-check) for the step's compute; '' = the published "
        "rates of the run's GPU (recipes/timemodel/)",
        trains=False,
    )
    engage_single_rank: bool = _f(
        False,
        help="with one process, still make a process group and run the backend's hooks and collectives (a one-rank "
        "NCCL communicator launches the same kernels, streams and events; scripts/gpu_check/ on one GPU)",
    )
    own: Any = _OWN


@dataclass
class DistConfig:
    backend: Literal["auto", "gloo", "nccl"] = _f(
        "auto",
        help="torch.distributed process-group backend (not comm.backend, the allreduce backend that runs over it); "
        "auto: nccl on GPU",
    )
    timeout_s: float = _f(
        300.0, help="collective timeout; a dead or hung peer fails within this time", domain=">0 <=604800"
    )


@dataclass
class LogConfig:
    every_steps: int = _f(10, help="console line every N steps (rank 0)", domain=">0", unbounded=_COUNT)
    tensorboard: bool = _f(True, help="write TensorBoard scalars to <run_dir>/tb")


@dataclass
class CheckpointConfig:
    enabled: bool = _f(True, help="write a checkpoint at the end of every epoch (checkpoint.pt = the newest)")
    every_steps: int = _f(
        0,
        help="also every N optimizer steps, for mid-epoch recovery; 0 = epoch ends only",
        domain=">=0",
        unbounded=_COUNT,
    )
    keep: int = _f(
        2,
        help="keep the newest K checkpoints (an older one is the fallback if the newest is damaged)",
        domain=">0",
        unbounded=_COUNT,
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
        None, help="DAWNBench entry: USD per hour for all machines (costPerHour)", domain=">=0", unbounded=_FIGURE
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
    dist: DistConfig = _f(help="torch.distributed", factory=DistConfig, trains=False)
    log: LogConfig = _f(help="logging", factory=LogConfig, trains=False)
    checkpoint: CheckpointConfig = _f(help="checkpoints and resume", factory=CheckpointConfig, trains=False)
    dawnbench: DawnbenchConfig = _f(help="DAWNBench submission entry", factory=DawnbenchConfig, trains=False)
    phases: list[Phase] = _f(
        help="progressive-resizing schedule: list of {epochs, image_size, batch_size, ...}",
        factory=lambda: [Phase(epochs=1, image_size=224, batch_size=256)],
        domain="nonempty",
    )

    @property
    def epochs(self) -> int:
        return sum(p.epochs for p in self.phases)


# ---------------------------------------------------------------------------------------------------------
# Describing a schema type (the loader's errors and the reference table).


def not_training_keys(cls: type = Config, prefix: str = "") -> tuple[str, ...]:
    """Dotted keys (a section as `name.`) whose value does not change what is trained: `_f(trains=False)`."""
    out: list[str] = []
    for name, (f, tp) in section_fields(cls).items():
        key = prefix + name
        if not f.metadata.get("trains", True):
            out.append(key + "." if dataclasses.is_dataclass(tp) else key)
        elif dataclasses.is_dataclass(tp):
            out += not_training_keys(tp, key + ".")
    return tuple(out)


def field_of(key: str) -> dataclasses.Field:
    """The schema field of a dotted key ("optim.eta"; "phases.0.min_scale" or "phases.min_scale": a phase's)."""
    cls = Config
    *path, name = key.split(".")
    for part in path:
        if part.isdigit():
            continue
        tp = typing.get_type_hints(cls)[part]
        cls = typing.get_args(tp)[0] if typing.get_origin(tp) is list else tp
    return section_fields(cls)[name][0]
