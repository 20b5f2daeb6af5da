"""The configuration schema: every hyperparameter declared exactly once, with its default, its meaning (the
`help` metadata) and its domain (the values allowed besides the type).

How a field is declared (`_f`: its domain, and `unbounded` / `cross`, which the tests read) is recipes/config/fields.py;
loading YAML into it is recipes/config/load.py; the reference table of docs/config.md is recipes/config/reference.py.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Literal

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
from recipes.config.rules import BY_SIZE, TRUST_CLIP, WARMUP

# The names each plug-in seam accepts, from its registry: a wrong name fails when the config loads.
AllreduceName = Literal[tuple(registry.ALLREDUCE_BACKENDS)]
InputName = Literal[tuple(registry.INPUT_PIPELINES)]
ModelName = Literal[tuple(registry.MODELS)]
OptimizerName = Literal[tuple(registry.OPTIMIZERS)]
NcclPreset = Literal[tuple(registry.NCCL_PRESETS)]


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


@dataclass
class DataConfig:
    backend: InputName = _f("torch", help="input pipeline (base/registry.py: the data.* keys each reads)")
    root: str = _f(
        "data/sample",
        help="dataset root with train/ and val/ in ImageNet folder layout",
        domain="nonempty",
        trains=False,
    )
    roots: dict[str, str] = _f(
        help="named dataset copies (e.g. pre-resized '160'); 'full' defaults to data.root", factory=dict, trains=False
    )
    workers: int = _f(
        1, help="decoding workers (threads for DALI, processes for torch) per rank", domain=">=0 <=256", trains=False
    )
    val_crop_ratio: float = _f(
        0.875, help="validation: resize shorter side to size/ratio, center crop", domain="(0,1] >=0.05"
    )
    val_batch_size: int = _f(64, help="per-rank validation batch size", domain=">0 <=4096", trains=False)
    skip_corrupt: bool = _f(False, help="skip undecodable files (and report them) instead of failing")
    synthetic_size: int = _f(
        1281167, help="synthetic input pipeline: training images per epoch", domain=">0 <=1000000000"
    )
    synthetic_classes: int = _f(1000, help="synthetic input pipeline: number of classes", domain=">0 <=100000")
    dali_dtype: Literal["auto", "float32", "float16"] = _f(
        "auto", help="dali: output dtype; auto = float16 on CUDA with run.amp=fp16, else float32"
    )
    max_image_pixels: int = _f(
        89_478_485,
        help="refuse an image with more pixels (a decompression bomb) in every input pipeline; default: PIL's limit",
        domain=">0 <=2147483647",
    )
    # DALI's GPU settings as NVIDIA's MLPerf Training ResNet-50 on DGX H100 sets them (DALI_PREFETCH_QUEUE=5,
    # DALI_HW_DECODER_LOAD=0.99 in mlcommons/training_results_v3.1, NVIDIA/benchmarks/resnet/implementations/mxnet/
    # config_DGXH100.sh); DALI's own defaults are 2 and 0.65.
    dali_prefetch: int = _f(
        5,
        help="dali: batches prepared ahead of the training loop on DALI's own threads (prefetch_queue_depth); 5 as "
        "NVIDIA's MLPerf ResNet-50 config for DGX H100",
        domain=">0 <=64",
        trains=False,
    )
    dali_hw_decoder_load: float = _f(
        0.99,
        help="dali on a GPU: share of the JPEG data given to the GPU's hardware JPEG decoder (A100, H100, H200), the "
        "rest to nvJPEG's CUDA decoder; 0.99 as NVIDIA's MLPerf ResNet-50 config for DGX H100 (DALI's default: "
        "0.65). Ignored, with a note, when DALI decodes on the CPU",
        domain="[0,1]",
        trains=False,
    )
    val_blacklist: str = _f(
        "",
        help="devkit's ILSVRC2012_validation_blacklist.txt (1-based indices into the sorted val file names), "
        "relative to data.root unless absolute: those images are not counted; '' = count every image",
    )
    auto_augment: str = _f(
        "",
        help="torch input pipeline: timm augmentation after the crop, e.g. 'rand-m9-mstd0.5-inc1' (RandAugment) or "
        "'augmix-m3-w1'; '' = none",
    )
    aug_splits: int = _f(
        0,
        help="torch input pipeline: AugMix splits (timm AugMixDataset: one clean view + aug_splits-1 augmented views) "
        "trained with timm's JsdCrossEntropy; 0 = off, else >= 2",
        domain=">=0 <=16",
    )


@dataclass
class ModelConfig:
    name: ModelName = _f("resnet18", help="model name (base/registry.py; built by models/factory.py)")
    bn_momentum: float = _f(0.1, help="BatchNorm momentum (PyTorch convention)", domain="[0,1]")
    bn_eps: float = _f(1e-5, help="BatchNorm epsilon", domain=">0", unbounded=_FACTOR)
    zero_init_last_bn: bool = _f(True, help="zero gamma of the last BN in each residual block")
    drop_rate: float = _f(0.0, help="dropout before the classifier", domain="[0,1)")


@dataclass
class OptimConfig:
    name: OptimizerName = _f("sgd", help="optimizer: sgd, lars, hybrid (LARS with clipped trust ratio), lamb")
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
    momentum: float = _f(0.9, help="momentum (start value when momentum_schedule is not constant)", domain="[0,1)")
    momentum_end: float | None = _f(
        None, help="linear: momentum at the last iteration; cyclic: at the end of warm-up", domain="[0,1)"
    )
    momentum_schedule: Literal["constant", "linear", "cyclic"] = _f("constant", help="momentum shape")
    nesterov: bool = _f(True, help="Nesterov momentum")
    weight_decay: float = _f(1e-4, help="L2 weight decay", domain=">=0", unbounded=_FACTOR)
    no_bn_decay: bool = _f(True, help="no weight decay on BatchNorm parameters and biases")
    label_smoothing: float = _f(0.1, help="label smoothing of the cross-entropy loss", domain="[0,1)")
    eta: float = _f(
        1e-3,
        help="lars/hybrid: layer trust ratio = eta * norm(w) / (norm(g) + weight_decay * norm(w))",
        domain=">0",
        unbounded=_FACTOR,
    )
    trust_clip_min: float = _f(
        1e-5,
        help="hybrid: lower clip of the layer trust ratio",
        domain=">0",
        unbounded=_FACTOR,
        cross=TRUST_CLIP,
    )
    trust_clip_max: float = _f(
        1.0,
        help="hybrid: upper clip of the layer trust ratio",
        domain=">0",
        unbounded=_FACTOR,
        cross=TRUST_CLIP,
    )
    lars_momentum: Literal["torch", "tf"] = _f(
        "torch",
        help="lars/hybrid momentum: torch = trust ratio inside the buffer (timm, apex); tf = buffer of raw "
        "gradients, lr x trust ratio applied to the whole buffer (TensorFlow's LARSOptimizer, the record's)",
    )
    adapt_bn_bias: bool = _f(False, help="lars/hybrid/lamb: also adapt BN and bias parameters (else plain SGD)")
    clip_grad_norm: float = _f(
        0.0,
        help="clip the gradients' total L2 norm (after the allreduce and fp16 unscaling, before the optimizer step) "
        "to this value, on the device; 0 = off. Every optimizer",
        domain=">=0",
        unbounded=_FACTOR,
    )


@dataclass
class CommConfig:
    backend: AllreduceName = _f("ddp", help="gradient allreduce backend (base/registry.py; see recipes/comm)")
    bucket_cap_mb: float = _f(25.0, help="ddp: bucket size in MB", domain=">0 <=65536")
    static_graph: bool = _f(False, help="ddp: static_graph=True")
    nccl_preset: NcclPreset = _f(
        "nccl-default",
        help="NCCL multi-flow preset (base/registry.py: socket threads x sockets per thread, min channels); set "
        "on every rank before the process group (ddp, multistream); an explicit environment variable wins",
    )
    nccl_socket_nthreads: int | None = _f(None, help="NCCL_SOCKET_NTHREADS (overrides the preset)", domain=">0 <=16")
    nccl_nsocks_perthread: int | None = _f(None, help="NCCL_NSOCKS_PERTHREAD (overrides the preset)", domain=">0 <=16")
    nccl_min_nchannels: int | None = _f(None, help="NCCL_MIN_NCHANNELS (overrides the preset)", domain=">0 <=64")
    gloo_devices: int = _f(
        1,
        help="ddp on gloo: TCP devices of DDP's process group (its collectives are spread over them: N flows)",
        domain=">0 <=64",
    )
    bucket_mb: float = _f(
        8.0,
        help="multistream: target bucket size in MB (buckets are balanced around it); horovod: fusion threshold",
        domain=">0 <=65536",
    )
    streams: int = _f(
        4, help="multistream: communicators K (process groups; NCCL streams / gloo TCP connections)", domain=">0 <=64"
    )
    slices: int = _f(
        2,
        help="multistream: slices S per bucket; slice j of bucket b goes to communicator (b*S+j) mod K",
        domain=">0 <=64",
    )
    compression: Literal["none", "fp16", "bf16"] = _f(
        "none", help="multistream/horovod: gradient wire format (averaged in fp32 before the cast)"
    )
    concurrency: Literal["auto", "overlap", "serialize"] = _f(
        "auto",
        help="multistream: overlap = communicators run at once (refused where unsafe, recipes/comm/concurrency.py); "
        "serialize = one collective in flight; auto = overlap where its rule holds, else serialize, saying why",
    )
    autotune: bool = _f(
        False, help="multistream: tune (bucket_mb, streams, slices) in the first steps; horovod: HOROVOD_AUTOTUNE"
    )
    tune_method: Literal["bayes", "grid"] = _f("bayes", help="autotune search: Gaussian-process EI or a grid")
    tune_bucket_mb: list[float] = _f(
        help="autotune: bucket sizes to search (MB)",
        factory=lambda: [2.0, 4.0, 8.0, 16.0, 32.0],
        domain="nonempty >0 <=65536",
    )
    tune_streams: list[int] = _f(
        help="autotune: communicator counts to search", factory=lambda: [1, 2, 3, 4], domain="nonempty >0 <=64"
    )
    tune_slices: list[int] = _f(
        help="autotune: slice counts to search", factory=lambda: [1, 2, 4], domain="nonempty >0 <=64"
    )
    tune_start: Literal["config", "model"] = _f(
        "config",
        help="autotune: first candidate; config = bucket_mb/streams/slices; model = the step-time model's best for "
        "this cluster (hosts x GPUs from the launcher, link_gbit/flow_gbit/latency_us), then in predicted order",
    )
    link_gbit: float | None = _f(
        None, help="tune_start model: network link per host and direction (Gbit/s)", domain=">=0.001 <=100000"
    )
    flow_gbit: float | None = _f(
        None,
        help="tune_start model: one TCP flow's ceiling (Gbit/s); null = no per-flow cap",
        domain=">=0.001 <=100000",
    )
    latency_us: float = _f(
        50.0, help="tune_start model: per-message latency of one ring step (microseconds)", domain=">=0 <=1000000"
    )
    network_file: str = _f(
        "",
        help="tune_start model: the link probe's figures (<run dir>/network.json of scripts/launch.py "
        "--probe-network) instead of link_gbit/flow_gbit/latency_us; '' = those keys",
        trains=False,
    )
    gpu_profile: str = _f(
        "",
        help="tune_start model: the GPU's measured rates (make gpu-check) for the step's compute; '' = the published "
        "rates of the run's GPU (recipes/timemodel/)",
        trains=False,
    )
    tune_max_candidates: int = _f(10, help="autotune: candidates measured before the best is kept", domain=">0 <=1000")
    tune_warmup_steps: int = _f(3, help="autotune: steps discarded before the first measurement", domain=">=0 <=10000")
    tune_steps_per_window: int = _f(2, help="autotune: steps averaged into one window", domain=">0 <=1000")
    tune_windows: int = _f(3, help="autotune: windows per candidate; its score is their median", domain=">0 <=1000")
    balance: bool = _f(
        False,
        help="multistream: re-plan each communicator's share of every bucket in proportion to what it delivered "
        "(recipes/comm/balance.py), for networks whose TCP connections run at unequal rates",
    )
    balance_level: Literal["communicator", "hop"] = _f(
        "communicator",
        help="balance: communicator = each communicator's share of every bucket (its collectives go at its slowest "
        "hop); hop = a ring of point-to-point sends whose every hop cuts its chunk over its own K connections "
        "(recipes/comm/hopring.py; gloo only), which pays at any number of hosts",
    )
    balance_window: int = _f(4, help="balance: steps measured before each re-plan decision", domain=">0 <=10000")
    balance_min_gain: float = _f(
        0.05,
        help="balance: re-plan only when the slowest communicator's time is predicted to fall by more than this "
        "fraction (hysteresis)",
        domain=">=0 <=1",
    )
    tune_cache: str | None = _f(
        "",
        help="autotune: JSON file of winners ('' = ~/.cache/dawnbench/allreduce_tuning.json, null = no cache)",
        trains=False,
    )
    network: str = _f(
        "auto",
        help="autotune: network description in the cache key (auto: nodes, procs, socket interface)",
        domain="nonempty",
    )
    engage_single_rank: bool = _f(
        False,
        help="with one process, still make a process group and run the backend's hooks and collectives (a one-rank "
        "NCCL communicator launches the same kernels, streams and events; scripts/gpu_check/ on one GPU)",
    )


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
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        if not f.metadata.get("trains", True):
            out.append(key + "." if dataclasses.is_dataclass(hints[f.name]) else key)
        elif dataclasses.is_dataclass(hints[f.name]):
            out += not_training_keys(hints[f.name], key + ".")
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
    return {f.name: f for f in dataclasses.fields(cls)}[name]
