"""Each plug-in's own knobs: one small typed config per plug-in (optimizer, allreduce backend, input pipeline,
model), which its record in base/registry.py points at (`config`). The keys every plug-in of a seam reads stay in the
seam's section (recipes/config/schema.py); a plug-in's own keys are written flat in that section (`optim.eta`,
`comm.streams`) and land in the chosen plug-in's config (`cfg.optim.own`), so another plug-in's keys are not in it.

Keys that several plug-ins read are declared once, in a small base class they share (SGD's momentum, the folders of
the input pipelines that read data.root). A field is declared as in the schema (`_f`: default, help, domain).
Torch-free: the loader and the torch-free tools import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from base import registry
from recipes.config.fields import _FACTOR, _f
from recipes.config.rules import HOP_ON_HOST, TRUST_CLIP

NcclPreset = Literal[tuple(registry.NCCL_PRESETS)]


@dataclass
class Momentum:
    """SGD's heavy ball, which LARS and the hybrid optimizer keep (Lamb and AdamW have Adam's betas)."""

    momentum: float = _f(0.9, help="momentum (start value when momentum_schedule is not constant)", domain="[0,1)")
    momentum_end: float | None = _f(
        None, help="linear: momentum at the last iteration; cyclic: at the end of warm-up", domain="[0,1)"
    )
    momentum_schedule: Literal["constant", "linear", "cyclic"] = _f("constant", help="momentum shape")
    nesterov: bool = _f(True, help="Nesterov momentum")


@dataclass
class AdaptBnBias:
    """Whether a layer-adaptive optimizer also adapts BN and bias parameters."""

    adapt_bn_bias: bool = _f(False, help="lars/hybrid/lamb: also adapt BN and bias parameters (else plain SGD)")


@dataclass
class SGDConfig(Momentum):
    """optim.name=sgd: torch's fused SGD."""


@dataclass
class LarsConfig(AdaptBnBias, Momentum):
    """optim.name=lars: SGD with the layer trust ratio (recipes/lars.py)."""

    eta: float = _f(
        1e-3,
        help="lars/hybrid: layer trust ratio = eta * norm(w) / (norm(g) + weight_decay * norm(w))",
        domain=">0",
        unbounded=_FACTOR,
    )
    lars_momentum: Literal["torch", "tf"] = _f(
        "torch",
        help="lars/hybrid momentum: torch = trust ratio inside the buffer (timm, apex); tf = buffer of raw "
        "gradients, lr x trust ratio applied to the whole buffer (TensorFlow's LARSOptimizer, the record's)",
    )


@dataclass
class HybridConfig(LarsConfig):
    """optim.name=hybrid: LARS with the trust ratio clipped (the record's optimizer)."""

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


@dataclass
class LambConfig(AdaptBnBias):
    """optim.name=lamb: timm's Lamb (its betas are timm's defaults)."""


@dataclass
class AdamWConfig:
    """optim.name=adamw: torch's AdamW (decoupled weight decay), fused or not."""

    betas: list[float] = _f(
        help="adamw: (beta1, beta2), the decay rates of the gradient's running mean and of its square",
        factory=lambda: [0.9, 0.999],
        domain="nonempty [0,1)",
    )
    eps: float = _f(1e-8, help="adamw: added to the root of the second moment", domain=">0", unbounded=_FACTOR)
    fused: bool | Literal["auto"] = _f(
        "auto",
        help="adamw: torch's fused kernel (CUDA only) or the per-parameter loop; auto = fused on CUDA. Either skips "
        "a non-finite step on the device",
    )


@dataclass
class NcclFlows:
    """NCCL's multi-flow settings, set in each rank's environment by the backends that run on NCCL themselves."""

    nccl_preset: NcclPreset = _f(
        "nccl-default",
        help="NCCL multi-flow preset (base/registry.py: socket threads x sockets per thread, min channels); set "
        "on every rank before the process group (ddp, multistream); an explicit environment variable wins",
    )
    nccl_socket_nthreads: int | None = _f(None, help="NCCL_SOCKET_NTHREADS (overrides the preset)", domain=">0 <=16")
    nccl_nsocks_perthread: int | None = _f(None, help="NCCL_NSOCKS_PERTHREAD (overrides the preset)", domain=">0 <=16")
    nccl_min_nchannels: int | None = _f(None, help="NCCL_MIN_NCHANNELS (overrides the preset)", domain=">0 <=64")


@dataclass
class DDPConfig(NcclFlows):
    """comm.backend=ddp (and its variants): torch's DistributedDataParallel."""

    bucket_cap_mb: float = _f(25.0, help="ddp: bucket size in MB", domain=">0 <=65536")
    static_graph: bool = _f(False, help="ddp: static_graph=True")
    gloo_devices: int = _f(
        1,
        help="ddp on gloo: TCP devices of DDP's process group (its collectives are spread over them: N flows)",
        domain=">0 <=64",
    )


@dataclass
class Fusion:
    """The fusion buffer, wire format and tuning of the backends that fuse gradients themselves."""

    bucket_mb: float = _f(
        8.0,
        help="multistream: target bucket size in MB (buckets are balanced around it); horovod: fusion threshold",
        domain=">0 <=65536",
    )
    compression: Literal["none", "fp16", "bf16"] = _f(
        "none", help="multistream/horovod: gradient wire format (averaged in fp32 before the cast)"
    )
    autotune: bool = _f(
        False, help="multistream: tune (bucket_mb, streams, slices) in the first steps; horovod: HOROVOD_AUTOTUNE"
    )


@dataclass
class HorovodConfig(Fusion):
    """comm.backend=horovod: horovod.torch's DistributedOptimizer."""


@dataclass
class MultistreamConfig(Fusion, NcclFlows):
    """comm.backend=multistream: K communicators, S slices per bucket, its tuner and balancer."""

    streams: int = _f(
        4, help="multistream: communicators K (process groups; NCCL streams / gloo TCP connections)", domain=">0 <=64"
    )
    slices: int = _f(
        2,
        help="multistream: slices S per bucket; slice j of bucket b goes to communicator (b*S+j) mod K",
        domain=">0 <=64",
    )
    concurrency: Literal["auto", "overlap", "serialize"] = _f(
        "auto",
        help="multistream: overlap = communicators run at once (refused where unsafe, recipes/comm/concurrency.py); "
        "serialize = one collective in flight; auto = overlap where its rule holds, else serialize, saying why",
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
        "(recipes/comm/hopring.py; gloo, or between hosts under hierarchy=host), which pays at any number of "
        "hosts; at 2 ranks in a ring it opens 2K communicators, K for each direction",
        cross=HOP_ON_HOST,
    )
    hierarchy: Literal["none", "host"] = _f(
        "none",
        help="balance_level hop: none = one ring over every rank; host = a reduce-scatter among each host's ranks "
        "(the default backend: NCCL on GPUs), the hop ring on each shard between hosts (one ring per local rank, "
        "gloo, pinned host copies on GPUs), an all-gather inside the host (recipes/comm/hierarchy.py); the only way "
        "hop level runs on NCCL",
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


@dataclass
class Folders:
    """An input pipeline over data.root's ImageNet folders: where the images are, how many decode at once, how
    validation crops, and which files it refuses or leaves out."""

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
    skip_corrupt: bool = _f(False, help="skip undecodable files (and report them) instead of failing")
    max_image_pixels: int = _f(
        89_478_485,
        help="refuse an image with more pixels (a decompression bomb) in every input pipeline; default: PIL's limit",
        domain=">0 <=2147483647",
    )
    val_blacklist: str = _f(
        "",
        help="devkit's ILSVRC2012_validation_blacklist.txt (1-based indices into the sorted val file names), "
        "relative to data.root unless absolute: those images are not counted; '' = count every image",
    )


@dataclass
class TorchInputConfig(Folders):
    """data.backend=torch: torchvision + PIL, with timm's PIL augmentations (in this pipeline only)."""

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
class DaliConfig(Folders):
    """data.backend=dali: NVIDIA DALI."""

    dali_dtype: Literal["auto", "float32", "float16"] = _f(
        "auto", help="dali: output dtype; auto = float16 on CUDA with run.amp=fp16, else float32"
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


@dataclass
class SyntheticConfig:
    """data.backend=synthetic: random batches on the device."""

    synthetic_size: int = _f(
        1281167, help="synthetic input pipeline: training images per epoch", domain=">0 <=1000000000"
    )
    synthetic_classes: int = _f(1000, help="synthetic input pipeline: number of classes", domain=">0 <=100000")


@dataclass
class BatchNormConfig:
    """A network with BatchNorm residual blocks: its BN settings (momentum, eps, zero-init of each residual branch's
    last gamma: timm's `zero_init_last`)."""

    bn_momentum: float = _f(0.1, help="BatchNorm momentum (PyTorch convention)", domain="[0,1]")
    bn_eps: float = _f(1e-5, help="BatchNorm epsilon", domain=">0", unbounded=_FACTOR)
    zero_init_last_bn: bool = _f(True, help="zero gamma of the last BN in each residual block")
