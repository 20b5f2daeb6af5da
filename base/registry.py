"""The plug-ins a config may choose at each seam, each described by one record: its name, where its implementation
lives, and what the rest of the tree shows or checks of it.

    Allreduce   comm.backend (the allreduce backend): the class, its label in tables, its rows in the time model,
                whether the step can be captured in a CUDA graph while it wraps the model (and where a GPU proved
                it), its tolerance against DDP, its wire dtype, what starts its ranks, its bucket key
    Input       data.backend (the input pipeline): the class, whether it reads data.root's folders
    Model       model.name: the timm architecture, whether the time model's rates were measured on it
    Optimizer   optim.name: the builder, how its step skips a non-finite step (the skip flag's shape) and whether
                a CUDA graph can capture it

Every record points at its own typed config (`config`, recipes/config/plugins.py): the keys of its seam's section
(`SEAMS`) that it alone, or with some others, reads. What it reads (`reads`) is that class's fields; the section keeps
the keys every part of the seam reads, so another part's keys are not in the chosen part's config (set, they are
inert: said, and marked by --print-config; recipes/config/inert.py). The config schema takes its `Literal` types
from these tables, so a wrong name is a `ConfigError` (with "did you mean") when the config loads; the factories
(`recipes.comm.create_allreduce`, `data.create_input`, `recipes.optim.create_optimizer`, `models.create_model`) take
the implementation from here when it is asked for; the time model, `train.py --plan --gpu`, scripts/predict.py and
compare_runs list the backends from `ALLREDUCE_BACKENDS` (the network lab measures those of them its own
`lab/lab_methods.py` lists), the GPU check its equality and end-to-end runs from the backends' launchers.
A new backend, input pipeline, model or optimizer is one record here plus its module, its config class if it has
knobs of its own, and tests (a backend: a step-time model in recipes/comm/stepmodel.py, unless it issues another
backend's messages). The records are plain data, and nothing of this repository is imported at import time: the
schema and the torch-free tools read them.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from dataclasses import dataclass
from typing import Any

from base.errors import ConfigError


@functools.cache
def _fields(pointer: str) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(resolve(pointer))) if pointer else ()


class _Plugin:
    """A record with its own config: `config` is "module:Class" of its knobs' dataclass ("" = none)."""

    config: str

    @property
    def reads(self) -> tuple[str, ...]:
        """The keys of its section it reads besides those every part of the seam reads: its config's fields."""
        return _fields(self.config)


@dataclass(frozen=True)
class Allreduce(_Plugin):
    """A gradient allreduce backend (comm.backend)."""

    name: str
    impl: str  # "module:Class" implementing recipes.comm.base.AllreduceBackend
    label: str  # in tables: predict.py, train.py --plan --gpu, compare_runs
    config: str  # "module:Class" of its comm.* keys (recipes/config/plugins.py)
    # The time model's rows (recipes/timemodel/estimate.py::backends): TCP flows per communicator of each, modelled
    # by recipes/comm/stepmodel.py under `name`. ddp has two: NCCL's one flow, and 4 (comm.nccl_preset flows-4),
    # the strongest plain-DDP baseline.
    time_flows: tuple[int, ...] = (1,)
    # Why the training step cannot be captured in one CUDA graph while it wraps the model (run.cuda_graph;
    # recipes/steps.py graph_decision): it engages across ranks, or on one rank with comm.engage_single_rank. "" = it
    # can. A backend that does not engage (one rank) adds nothing to the step.
    graph_refusal: str = ""
    # The largest |weight| difference from the reference backend (REFERENCE_BACKEND) the GPU check accepts after
    # its fp32 equality steps: summation order only for an exact mean; a lossy wire format needs its own.
    reference_atol: float = 1e-4
    # What its comm_seconds (recipes/comm/stats.py CommStats) times, per step: backends time different windows
    # (docs/allreduce.md, "What each backend measures"), so compare_runs names it beside every comm column.
    comm_window: str = "the backend's own (docs/allreduce.md)"
    # What starts its ranks: torchrun, or horovodrun (Horovod's own rendezvous; scripts/launch.py --engine horovod).
    launcher: str = "torchrun"
    bucket_key: str = "bucket_mb"  # the comm.* key of its bucket (fusion) size in MB
    # "module:attribute" of the recipes.comm.stepmodel.StepPattern its steps are modelled by (the messages it issues,
    # its settings, their label): a variant that issues another backend's messages (DDP with another comm hook)
    # points at that backend's, so registering it is this record and its module.
    step_model: str = ""
    # The dtype its messages carry on the wire, which the time model's bytes read: None = the gradients' own (fp32
    # here), or comm.compression's when it reads that key (`compression`); "fp16"/"bf16" = always that (a backend
    # whose hook always sends bf16 is predicted at 2 bytes per element whatever comm.compression says).
    wire_dtype: str | None = None
    # What it is, in one line, and what its CommStats' wait_seconds and bytes count: docs/allreduce.md's tables are
    # written from these (scripts/gen_config_reference.py).
    about: str = ""
    comm_wait: str = "not measured (null)"
    comm_bytes: str = "bucket buffers, in the wire dtype"

    @property
    def compression(self) -> bool:
        """It reads comm.compression (the gradients' wire format)."""
        return "compression" in self.reads

    @property
    def autotune(self) -> bool:
        """comm.autotune tunes its settings in the first steps."""
        return "autotune" in self.reads

    def wire(self, compression: str = "none") -> str:
        """The wire format of its messages under comm.compression=`compression` ("none": the gradients' dtype)."""
        return self.wire_dtype or (compression if self.compression else "none")

    def row_label(self, flows: int = 1) -> str:
        """The label of its time-model row or run with `flows` TCP flows per peer ("ddp (4 flows)")."""
        return self.label if flows <= 1 else f"{self.label} ({flows} flows)"


# comm.backend -> its record
ALLREDUCE_BACKENDS = {
    r.name: r
    for r in (
        Allreduce(
            "ddp",
            "recipes.comm.ddp:DDPBackend",
            "ddp",
            "recipes.config.plugins:DDPConfig",
            time_flows=(1, 4),
            graph_refusal="DDP's reducer runs host logic per step",
            comm_window="first bucket -> last bucket reduced",
            bucket_key="bucket_cap_mb",
            step_model="recipes.comm.stepmodel:DDP",
            about="PyTorch DistributedDataParallel (`comm.bucket_cap_mb`, `comm.static_graph`): the reference",
        ),
        # DDP with torch's bf16 compression hook: DDP's buckets at 2 bytes per element. Each average is rounded to bf16
        # (2^-8 relative) before the sum, so its weights after the GPU check's 10 SGD steps (lr 0.05, momentum 0.9,
        # weights ~1) differ from DDP's by more than summation order: 1.4e-4 on 2 CPU ranks (gpu_check_worker cpu 10,
        # 2026-12-05). 2e-3 leaves room for 8 ranks' sums in bf16 and is far below a wrong mean's ~1e-1.
        Allreduce(
            "ddp_bf16",
            "recipes.comm.ddp:DDPBf16Backend",
            "ddp bf16",
            "recipes.config.plugins:DDPConfig",
            graph_refusal="DDP's reducer runs host logic per step",
            reference_atol=2e-3,
            comm_window="first bucket -> last bucket reduced",
            bucket_key="bucket_cap_mb",
            step_model="recipes.comm.stepmodel:DDP",
            wire_dtype="bf16",
            about="DDP with torch's bf16 compression hook: DDP's buckets at 2 bytes per element, each average rounded "
            "to bf16",
        ),
        Allreduce(
            "multistream",
            "recipes.comm.multistream:MultiStreamBackend",
            "multistream",
            "recipes.config.plugins:MultistreamConfig",
            comm_window="backward + sync",
            step_model="recipes.comm.stepmodel:MULTISTREAM",
            about="ours (the record's technique): balanced fused buckets, each sliced over K communicators, no "
            "per-step negotiation, optional auto-tuning",
            comm_wait="the engine's wait for its slices after backward",
            comm_bytes="wire buffers",
        ),
        Allreduce(
            "horovod",
            "recipes.comm.horovod_backend:HorovodBackend",
            "horovod",
            "recipes.config.plugins:HorovodConfig",
            graph_refusal="Horovod's allreduce runs on its own thread",
            comm_window="first gradient -> synchronize()",
            launcher="horovodrun",
            step_model="recipes.comm.stepmodel:HOROVOD",
            about="the baseline: real `horovod.torch` (DistributedOptimizer + parameter broadcast) under `horovodrun`",
            comm_wait="time inside `synchronize()`",
            comm_bytes="gradients in the wire dtype",
        ),
    )
}

# PyTorch's own DDP: the reference every other backend's weights must equal (the GPU check's equality runs) and the
# speed columns of the network lab are relative to.
REFERENCE_BACKEND = "ddp"


def compared_with_reference() -> list[str]:
    """The backends whose weights the GPU check holds equal to the reference's: every other one torchrun starts
    (Horovod runs under horovodrun, in its own check)."""
    return [n for n, r in ALLREDUCE_BACKENDS.items() if r.launcher == "torchrun" and n != REFERENCE_BACKEND]


# comm.nccl_preset -> (NCCL_SOCKET_NTHREADS, NCCL_NSOCKS_PERTHREAD, NCCL_MIN_NCHANNELS); None leaves NCCL's
# default. Threads x sockets = TCP flows per channel connection (recipes/comm/ncclenv.py).
NCCL_PRESETS: dict[str, tuple[int | None, int | None, int | None]] = {
    "nccl-default": (None, None, None),  # whatever NCCL picks for the NIC (1 x 1 on a generic NIC)
    "single-flow": (1, 1, None),  # one connection per channel: the one-flow baseline
    "flows-4": (2, 2, None),
    "flows-8": (2, 4, None),
    "aws-ena": (2, 8, None),  # NCCL's own choice on AWS ENA NICs
    "gcp-gvnic": (4, 1, None),  # NCCL's own choice on GCP gVNIC
    "flows-16-ch4": (4, 4, 4),
}


@dataclass(frozen=True)
class Input(_Plugin):
    """An input pipeline (data.backend): its class and its config."""

    name: str
    impl: str  # "module:Class" implementing data.pipeline.InputPipeline
    label: str  # in tables (docs/config.md)
    config: str  # "module:Class" of its data.* keys (recipes/config/plugins.py)
    # Reads data.root's ImageNet folders: built from the scanned splits (data.create_input), its folders are what
    # the launcher checks on every host and evaluate.py --backend may choose it. False: it makes its own batches.
    reads_folders: bool = True
    requires: str = ""  # the package it imports beyond requirements.txt's core (tests skip it where missing)
    # What the tools ask of a pipeline, never its name:
    # the recipes.environment.Environment field that holds the version of `requires` (None where it is not
    # installed): the launcher's preflight refuses a GPU host that lacks it
    env_version: str = ""
    streams_epochs: bool = False  # built once per phase, then streams epoch after epoch (not restarted per epoch)
    gpu_decode: bool = False  # decodes JPEGs on the GPU (nvJPEG): the time model's input term has its measured rate


# data.backend -> its record
INPUT_PIPELINES = {
    r.name: r
    for r in (
        # timm's PIL augmentations (auto_augment, AugMix's splits) exist in this pipeline only.
        Input(
            "torch", "data.torch_loader:TorchPipeline", "torchvision + PIL", "recipes.config.plugins:TorchInputConfig"
        ),
        Input(
            "dali",
            "data.dali_loader:DaliPipeline",
            "NVIDIA DALI",
            "recipes.config.plugins:DaliConfig",
            requires="nvidia.dali",
            env_version="dali",
            streams_epochs=True,
            gpu_decode=True,
        ),
        Input(
            "synthetic",
            "data.synthetic:SyntheticPipeline",
            "random batches on the device",
            "recipes.config.plugins:SyntheticConfig",
            reads_folders=False,
        ),
    )
}


@dataclass(frozen=True)
class Optimizer(_Plugin):
    """An optimizer (optim.name): its builder, its config, and the contract its step keeps with the training step
    (recipes/steps.py): how a step with non-finite gradients is skipped, and whether it can be captured in a CUDA
    graph."""

    name: str
    impl: str  # "module:function" (optim_cfg, param_groups) -> torch.optim.Optimizer
    config: str  # "module:Class" of its optim.* keys (recipes/config/plugins.py)
    # Its step() honours a `found_inf` tensor attribute (GradScaler's protocol): 1.0 skips the step on the device,
    # with no host read. False: the training step decides on the host whether to call step().
    skips_on_device: bool = True
    # The shape `found_inf` must have: () is GradScaler's own (torch's fused Adam/AdamW accept nothing else).
    skip_flag_shape: tuple[int, ...] = ()
    # Its step reads `lr` and `momentum` given as 0-dim device tensors with no host read, so a CUDA graph can
    # capture it and each replay reads the schedule's values of that step. torch's SGD reads momentum on the host.
    tensor_hparams: bool = False
    # Its update of a tensor w with gradient g, in one line: docs/recipe.md's table is written from it.
    about: str = ""

    @property
    def capturable(self) -> bool:
        """Its step can be part of a captured CUDA graph (device-side skip, tensor hyperparameters)."""
        return self.skips_on_device and self.tensor_hparams


_OPTIM = "recipes.config.plugins:"

# optim.name -> its record
OPTIMIZERS = {
    r.name: r
    for r in (
        Optimizer(
            "sgd",
            "recipes.optim:build_sgd",
            _OPTIM + "SGDConfig",
            about="`torch.optim.SGD(fused=True)`: d = g + wd w; buf = m buf + d; w -= lr (d + m buf) (Nesterov)",
        ),  # torch's fused SGD: momentum read on the host
        Optimizer(
            "lars",
            "recipes.optim:build_lars",
            _OPTIM + "LarsConfig",
            tensor_hparams=True,
            about="the same with d = r (g + wd w), r = eta norm(w) / (norm(g) + wd norm(w)) per tensor (1 if a norm "
            "is 0); `optim.lars_momentum` below",
        ),
        Optimizer(
            "hybrid",
            "recipes.optim:build_hybrid",
            _OPTIM + "HybridConfig",
            tensor_hparams=True,
            about='the record\'s "LARS with rectified adaptive LR": `lars` with r clipped to [`optim.trust_clip_min`, '
            "`optim.trust_clip_max`]",
        ),
        # timm's Lamb has no found_inf: the step decides on the host
        Optimizer(
            "lamb",
            "recipes.optim:build_lamb",
            _OPTIM + "LambConfig",
            skips_on_device=False,
            about="timm's `Lamb` (betas 0.9/0.999, eps 1e-6, its own global gradient clipping off: "
            "`optim.clip_grad_norm` clips for every optimizer, "
            "[metrics.md](metrics.md#gradient-clipping-optimclip_grad_norm)); refuses decay without adaptation",
        ),
        # torch's AdamW reads lr on the host (a float); its fused step takes a 0-dim found_inf only, and the unfused one
        # is given the same skip (recipes/optim.py)
        Optimizer(
            "adamw",
            "recipes.optim:build_adamw",
            _OPTIM + "AdamWConfig",
            skip_flag_shape=(),
            about="`torch.optim.AdamW` (`optim.betas`, `optim.eps`; decoupled decay): fused on CUDA (`optim.fused: "
            "auto`), the per-parameter loop elsewhere, which skips a non-finite step on the device as the fused kernel "
            "does",
        ),
    )
}


@dataclass(frozen=True)
class Model(_Plugin):
    """A network (model.name): its timm architecture and its config."""

    name: str
    arch: str  # timm.create_model's name (models/factory.py)
    label: str  # in tables (docs/config.md)
    # Its model.* keys: the BN settings apply to a network with BatchNorm residual blocks only.
    config: str = "recipes.config.plugins:BatchNormConfig"
    # The time model's per-image rates (recipes/timemodel/rates.py) were measured on this network: ResNet-50 (the
    # published TensorFlow runs) and ResNet-50-D (this trainer's GPU profiles). Another network's prediction
    # (`train.py --plan --gpu`) still uses them, and says so.
    time_rates: bool = False


# model.name -> its record. `resnet50_tweaked` is ResNet-D (deep stem, average-pool downsampling in the shortcut) =
# timm's resnet50d; the BN tweaks (zero-init last gamma, BN momentum/eps, no BN decay) are applied from the config on
# top (models/factory.py).
MODELS = {
    r.name: r
    for r in (
        Model("resnet50_tweaked", "resnet50d", "ResNet-50-D, the record's network", time_rates=True),
        Model("resnet50d", "resnet50d", "ResNet-50-D", time_rates=True),
        Model("resnet50", "resnet50", "ResNet-50", time_rates=True),
        Model("resnet26d", "resnet26d", "ResNet-26-D"),
        Model("resnet18", "resnet18", "ResNet-18"),
        Model("resnet10t", "resnet10t", "ResNet-10-T"),
    )
}


@dataclass(frozen=True)
class Seam:
    """A config section whose keys belong to the part one of its keys chooses: the section's own fields are read by
    every part (`shared`, the choosing key among them), the rest by the parts whose config declares them."""

    key: str  # the choosing key in the section ("name" of optim.name)
    records: dict[str, Any]  # name -> record with `config`
    section: str  # "module:Class" of the section (recipes/config/schema.py)

    @property
    def shared(self) -> tuple[str, ...]:
        """The keys every part of the seam reads: the section's fields."""
        return tuple(k for k in _fields(self.section) if k != "own")


# section -> its seam
SEAMS = {
    "data": Seam("backend", INPUT_PIPELINES, "recipes.config.schema:DataConfig"),
    "model": Seam("name", MODELS, "recipes.config.schema:ModelConfig"),
    "optim": Seam("name", OPTIMIZERS, "recipes.config.schema:OptimConfig"),
    "comm": Seam("backend", ALLREDUCE_BACKENDS, "recipes.config.schema:CommConfig"),
}


def check_name(table: dict[str, Any], name: str, key: str, what: str) -> None:
    """ConfigError naming `key` and the choices when `name` is not in `table` (configs built without the loader)."""
    if name not in table:
        raise ConfigError(f"{key}: unknown {what} '{name}' (expected one of {', '.join(table)})")


def resolve(pointer: str) -> Any:
    """The attribute a record's "module:attribute" field points at, imported now."""
    module, _, attr = pointer.partition(":")
    return getattr(importlib.import_module(module), attr)


def load(table: dict[str, Any], name: str, key: str, what: str) -> Any:
    """The implementation of the record registered under `name` (its `impl`, 'module:attribute'), imported now."""
    check_name(table, name, key, what)
    module, _, attr = table[name].impl.partition(":")
    return getattr(importlib.import_module(module), attr)
