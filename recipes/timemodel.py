"""How long a schedule takes on a cluster: a time model with every cost a term of its own, calibrated on published runs.

A phase of the schedule costs, per step (training clock):
    compute       the GPU's own arithmetic for a full training step at the phase's image size and batch, from a
                  rate table per GPU (published PyTorch figures, the H200 measured here, or a `make gpu-check`
                  profile): per resolution, not per pixel
    step floor    the part of the step the GPU waits for the host: a step costs max(arithmetic, floor), the floor
                  found in a rate table without a fit (split_floor: small images whose steps stop shrinking)
    intra-host    the same step inside a host of G GPUs: they share the host's CPUs, PCIe and NVLink (published
                  1-GPU vs 8-GPU throughput of the same code)
    exposed comm  the inter-host allreduce that backward does not hide (recipes/comm/stepmodel.py, per backend)
    sync          every step ends in a collective that waits for the slowest of N GPUs: a GPU's step-time jitter
                  sigma costs sigma x (sqrt(2 ln N) - sqrt(2 ln G)) more on H hosts than on one
    small coll.   latency-bound collectives besides the gradients' (none in this trainer; old published code)
and, per phase, the input pipeline's rebuild and the autotuning of new convolution shapes when the image size or
batch changes. The wall clock adds, per epoch, the BN-statistics allreduce and validation, and once the start-up.
DAWNBench's training clock (the TSV's hours) stops during validation and starts after start-up: in both Alibaba
entries the first epoch takes as long as the next, and the trainer here counts the same way (recipes/progress.py).

Each term carries a low-mid-high range; a prediction's range is the sum, and it names the term that contributes the
widest part. Numbers that come from a fit say so (`Calibration`): the V100 shape of rate against resolution
comes from Alibaba's 1 x 8 entry, sigma from the record's 16 x 8 entry.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from recipes.comm import stepmodel as sm
from recipes.comm.plan import Settings, TensorSpec, grad_specs
from recipes.errors import ConfigError
from recipes.schedule_report import IMAGENET_TRAIN_IMAGES

VAL_IMAGES = 50_000 - 1_762  # the validation set without the devkit's blacklist (usedBlacklist: true)
DTYPES = ("fp16", "bf16")


class ProfileError(ValueError):
    """A GPU profile file that cannot be used: the message is one line naming the file and the key."""


# ---------------------------------------------------------------------------------------------------------
# Compute: a rate table per GPU.


@dataclass(frozen=True)
class Rate:
    """One GPU alone, full training step (forward, backward, optimizer): images/s at an image size and batch."""

    image_size: int
    batch_size: int
    images_per_s: float
    uncertainty: float = 0.05  # +- fraction


@dataclass(frozen=True)
class GpuRates:
    """A GPU and software stack: its rate table, how it does inside a host of several GPUs, and its per-phase costs."""

    name: str
    dtypes: tuple[str, ...]
    rates: tuple[Rate, ...]
    source: str
    host_efficiency: float  # per-GPU rate in an 8-GPU host / rate alone
    host_source: str
    phase_change_s: tuple[float, float, float] = (0.3, 1.0, 3.0)  # input pipeline rebuild (low, mid, high)
    autotune_s: tuple[float, float, float] = (0.5, 1.0, 3.0)  # cudnn.benchmark: new shapes tried once each
    phase_change_source: str = "estimate (DALI pipeline rebuild and prefetch refill); not yet measured on a GPU"
    autotune_source: str = "estimate (cudnn.benchmark times each algorithm once per new conv shape); not yet measured"

    floor_source: str = ""  # where the step floor comes from (the rate table; see step_floor)
    floor_steps: tuple[float, ...] | None = None  # the floor measured elsewhere on the same host (None: the table's)
    # False: the table comes from another software stack (no floor in its steps), so its rates are the GPU's own and
    # the floor only bounds them from below
    floor_in_table: bool = True

    @functools.cached_property
    def _split(self) -> tuple[tuple[Rate, ...], tuple[float, ...]]:
        """(the GPU's own rates, the floor's steps): see split_floor."""
        if not self.floor_in_table:
            return tuple(sorted(self.rates, key=lambda r: r.image_size)), tuple(self.floor_steps or ())
        return split_floor(self.rates, self.floor_steps)

    @property
    def step_floor(self) -> tuple[float, float, float]:
        """(low, mid, high) seconds: a full step is never shorter, whatever the pixels (host-side dispatch of every
        layer's kernels and the optimizer's; see split_floor). (0, 0, 0) where no table point runs at a floor."""
        steps = self._split[1]
        if not steps:
            return 0.0, 0.0, 0.0
        mid = sum(steps) / len(steps)
        if len(steps) == 1:
            u = min(r.uncertainty for r in self.rates)
            return mid * (1 - u), mid, mid * (1 + u)
        return min(steps), mid, max(steps)

    def step_s(self, image_size: int, batch: int) -> float:
        """One GPU's full step: the GPU's arithmetic or the step floor, whichever is longer (the host runs ahead of
        the GPU: the trainer does not wait for a step's end before dispatching the next)."""
        return max(batch * self.per_image_s(image_size), self.step_floor[1])

    def per_image_s(self, image_size: int) -> float:
        """The GPU's own seconds per image at `image_size` (floor-bound table points replaced, see split_floor):
        linear in the pixel count between table points (a fixed part per image plus a part per pixel), the
        nearest segment's line outside them."""
        pts = sorted({r.image_size: 1.0 / r.images_per_s for r in self._split[0]}.items())
        if len(pts) == 1:
            return pts[0][1] * (image_size / pts[0][0]) ** 2
        p = image_size**2
        i = next((k for k in range(1, len(pts)) if p <= pts[k][0] ** 2), len(pts) - 1)
        (s0, t0), (s1, t1) = pts[i - 1], pts[i]
        t = t0 + (t1 - t0) * (p - s0**2) / (s1**2 - s0**2)
        return max(t, min(t0, t1) * 0.1)

    def uncertainty(self, image_size: int) -> float:
        """+- fraction of the rate at `image_size`: a table point's own, or the larger of the two around it."""
        by_size = {r.image_size: r.uncertainty for r in self.rates}
        if image_size in by_size:
            return by_size[image_size]
        below = [s for s in by_size if s < image_size]
        above = [s for s in by_size if s > image_size]
        near = [by_size[max(below)]] if below else []
        near += [by_size[min(above)]] if above else []
        return max(near) * (1.0 if below and above else 1.5)


def split_floor(
    rates: tuple[Rate, ...], floor_steps: tuple[float, ...] | None = None
) -> tuple[tuple[Rate, ...], tuple[float, ...]]:
    """Separate the step floor from the GPU's arithmetic in a rate table; no number is fitted.

    The evidence of a floor: at the same per-GPU batch, a smaller image's step is not shorter than a larger one's
    (the GPU's arithmetic shrinks with the pixels; this step did not). Those steps are the floor, unless
    `floor_steps` gives it (measured on the same host and trainer). A point whose step is within the floor's
    spread (and its own uncertainty) is floor-bound: its GPU time, hidden under the floor, becomes the per-pixel
    share of the next larger GPU-bound point (the most the GPU's arithmetic can shrink; a lower bound, as small
    images use the GPU less well). Returns (the GPU's rates, the floor's steps in seconds)."""
    pts = sorted(rates, key=lambda r: r.image_size)
    step = {r.image_size: r.batch_size / r.images_per_s for r in pts}
    if floor_steps is None:
        found: set[int] = set()
        for i, small in enumerate(pts):
            for large in pts[i + 1 :]:
                if small.batch_size == large.batch_size and step[small.image_size] >= step[large.image_size]:
                    found |= {small.image_size, large.image_size}
        floor_steps = tuple(step[s] for s in sorted(found))
    if not floor_steps:
        return tuple(pts), ()
    gpu = list(pts)
    ref = pts[-1]
    for i in range(len(pts) - 2, -1, -1):
        r = pts[i]
        if step[r.image_size] <= max(floor_steps) * (1 + r.uncertainty):  # at the floor, within the spreads
            per_pixel = (r.image_size / ref.image_size) ** 2 / ref.images_per_s  # seconds per image
            gpu[i] = Rate(r.image_size, r.batch_size, 1.0 / per_pixel, r.uncertainty)
        else:
            ref = r
    return tuple(gpu), tuple(floor_steps)


FLOOR_WHY = (
    "the shortest step in the table, where the GPU's per-pixel arithmetic would be shorter: a cost per step that "
    "does not shrink with the pixels"
)


# Alibaba's 1 x 8 V100 entry (ImageNet/train/alibabacloud_resnet50_gn6e_1_machine_tensorflow.tsv, TensorFlow 2.1 +
# XLA, AMP, 8 V100-32G in one host): steady per-epoch seconds per image size (the epoch after a phase's first;
# 288 px has one epoch), 1,281,167 images each. Per-GPU batch 256 (128 at 288 px).
ALIBABA_1X8_EPOCH_S = {96: 37.31, 128: 56.03, 224: 138.30, 288: 236.73}
ALIBABA_1X8_BATCH = {96: 256, 128: 256, 224: 256, 288: 128}
NVIDIA_TF_XLA_V100 = 1270.0  # DeepLearningExamples RN50 v1.5 TensorFlow, 1x V100 16 GB, AMP + XLA, batch 256


def _alibaba_host_rate(size: int) -> float:
    return IMAGENET_TRAIN_IMAGES / ALIBABA_1X8_EPOCH_S[size] / 8


def _alibaba_shape(level_224: float, unc_224: float, unc_other: float) -> tuple[Rate, ...]:
    """Rates at 96/128/224/288 px: `level_224` at 224 px, other sizes in the proportions of Alibaba's 1 x 8 entry."""
    ref = _alibaba_host_rate(224)
    return tuple(
        Rate(s, ALIBABA_1X8_BATCH[s], level_224 * _alibaba_host_rate(s) / ref, unc_224 if s == 224 else unc_other)
        for s in sorted(ALIBABA_1X8_EPOCH_S)
    )


# The step floor of this repository's trainer (PyTorch eager, resnet50_tweaked, hybrid optimizer) on a 16-core host:
# the floor-bound steps of two H200 machines of the same kind (96 and 128 px at 256 per GPU; tests check them against
# the files): the full check's profile, where those steps do not shrink with the pixels, and the rerun's, where the
# profiler saw the GPU's kernels run 12.5 of 25.9 ms and 19.8 of 41.6 ms. It is set on the host (Python dispatch and
# kernel launches of ~160 layers forward and backward, and the optimizer), so it holds for this trainer on any GPU
# whose arithmetic is shorter; it moved by 26-42 ms between the two hosts, and an older or busier host has a higher one.
HOST_FLOOR_STEPS = (256 / 6799.6, 256 / 7377.1, 256 / 9874.1, 256 / 6155.3)
_HOST_FLOOR = (
    "docs/data/gpu_profile-h200-2026-12-04.json and -rerun.json: this trainer's floor-bound steps (96 and 128 px, "
    "256 per GPU) on two 16-core H200 hosts (measured); set on the host, so the same on this GPU"
)
_SHAPE = "other sizes in the proportions of Alibaba's 1 x 8 V100 entry (TensorFlow + XLA: fitted, and PyTorch eager "
_SHAPE += "loses more at small images, hence +-15% there)"
_DLE = "NVIDIA DeepLearningExamples PyTorch RN50 v1.5 README, pytorch-21.03 container, AMP"
PUBLISHED: dict[str, GpuRates] = {
    "v100": GpuRates(
        "v100",
        ("fp16",),
        _alibaba_shape(1200.0, 0.05, 0.15),
        f"{_DLE}: 1x V100 16 GB 1,200 img/s at 224 px, batch 256; {_SHAPE}",
        8322 / (8 * 1200),
        f"{_DLE}: 8x V100 16 GB 8,322 img/s vs 1x 1,200",
        floor_source=_HOST_FLOOR,
        floor_steps=HOST_FLOOR_STEPS,
        floor_in_table=False,
    ),
    "v100-32gb": GpuRates(
        "v100-32gb",
        ("fp16",),
        _alibaba_shape(1156.0, 0.05, 0.15),
        f"{_DLE}: 1x V100 32 GB 1,156 img/s at 224 px, batch 256; {_SHAPE}",
        8056 / (8 * 1156),
        f"{_DLE}: 8x V100 32 GB 8,056 img/s vs 1x 1,156",
        floor_source=_HOST_FLOOR,
        floor_steps=HOST_FLOOR_STEPS,
        floor_in_table=False,
    ),
    "a100": GpuRates(
        "a100",
        ("fp16", "bf16"),
        _alibaba_shape(2470.0, 0.05, 0.25),
        f"{_DLE}: 1x A100 80 GB 2,470 img/s at 224 px, batch 256; {_SHAPE}; a faster GPU loses more to fixed "
        "per-step costs at small images: +-25%",
        16621 / (8 * 2470),
        f"{_DLE}: 8x A100 80 GB 16,621 img/s vs 1x 2,470",
        floor_source=_HOST_FLOOR,
        floor_steps=HOST_FLOOR_STEPS,
        floor_in_table=False,
    ),
    "v100-tf-xla": GpuRates(
        "v100-tf-xla",
        ("fp16",),
        _alibaba_shape(NVIDIA_TF_XLA_V100, 0.03, 0.03),
        "Alibaba 1 x 8 V100 entry per-epoch times (fitted: the table is that entry's rates / host efficiency); "
        "NVIDIA DeepLearningExamples TensorFlow RN50 v1.5 1x V100 AMP + XLA 1,270 img/s at 224 px",
        _alibaba_host_rate(224) / NVIDIA_TF_XLA_V100,
        "Alibaba 1 x 8 entry at 224 px vs NVIDIA's 1-GPU TensorFlow + XLA figure",
        phase_change_s=(0.0, 0.4, 0.8),
        autotune_s=(0.0, 0.0, 0.0),
        phase_change_source="Alibaba's entries: a phase's first epoch minus its second (+0.04 to +0.8 s; XLA "
        "compiles the new shapes there, so no separate autotune)",
        autotune_source="included in the phase change (XLA)",
    ),
}
# fast.ai's 1 x 8 V100 entry (ImageNet/train/fastai_pytorch.tsv: PyTorch 2018-04, NCCL 2.1, CPU JPEG decoding on a
# p3.16xlarge): median per-epoch seconds per image size. Used for its own era's multi-host entries (out of sample).
FASTAI_1X8_EPOCH_S = {128: 104.50, 224: 344.09, 288: 589.03}
PUBLISHED["v100-pytorch-2018"] = GpuRates(
    "v100-pytorch-2018",
    ("fp16",),
    tuple(
        Rate(sz, 128, IMAGENET_TRAIN_IMAGES / t / 8 / PUBLISHED["v100"].host_efficiency, 0.10)
        for sz, t in FASTAI_1X8_EPOCH_S.items()
    ),
    "fast.ai 1 x 8 V100 entry (fastai_pytorch.tsv) per-epoch medians / host efficiency (fitted on that entry; "
    "+-10%: the multi-host entries ran later code)",
    PUBLISHED["v100"].host_efficiency,
    PUBLISHED["v100"].host_source,
)
NO_PUBLISHED: dict[str, str] = {}

# Measured on this repository's trainer (`make gpu-check`, one NVIDIA H200, torch 2.11.0+cu130, 16-core host,
# 2026-12-04): the fp16 profile file, and the bf16 rows of the same check (docs/data/gpu_check-h200-2026-12-04.json,
# rows "train step resnet50_tweaked bf16 128px b256" and "... 224px b256").
DATA = Path(__file__).resolve().parent.parent / "docs" / "data"
H200_PROFILE = DATA / "gpu_profile-h200-2026-12-04.json"
H200_CHECK = DATA / "gpu_check-h200-2026-12-04.json"
H200_RERUN = DATA / "gpu_profile-h200-2026-12-04-rerun.json"  # another H200 host, with the kernel time per step
H200_BF16 = {128: (256, 6722.3), 224: (256, 3780.7)}  # image size: (batch, images/s)
# H100 SXM against H200: the same Hopper die (132 SMs, the same clocks), 3.35 against 4.8 TB/s of memory bandwidth.
# A step the GPU bounds runs between 3.35/4.8 = 0.70 (all of it memory-bound) and 1.0 (all of it compute-bound)
# of the H200's rate: the middle, 0.85, with +-22% of its time covering both ends. A floor-bound step is set on the
# host: unchanged.
H100_OF_H200 = (3.35 / 4.8 + 1.0) / 2
MEASURED = ("h200", "h100")


def _bf16_rates(fp16: GpuRates) -> tuple[Rate, ...]:
    """The check's bf16 rows, and 288 px from the fp16 profile at the bf16/fp16 ratio measured at 224 px (bf16
    ran 20% slower there: the ratio of the largest measured size, not extrapolated from the floor-bound 128 px)."""
    out = [Rate(sz, b, ips, 0.03) for sz, (b, ips) in sorted(H200_BF16.items())]
    f224 = next(r for r in fp16.rates if r.image_size == 224)
    ratio = H200_BF16[224][1] / f224.images_per_s
    out += [Rate(r.image_size, r.batch_size, r.images_per_s * ratio, 0.05) for r in fp16.rates if r.image_size > 224]
    return tuple(out)


@functools.lru_cache(maxsize=8)
def measured(gpu: str, dtype: str) -> GpuRates:
    """The H200's measured table (fp16: the profile file; bf16: the check's rows) or the H100's, derived from it."""
    fp16 = load_gpu_profile(H200_PROFILE)
    # the floor as both measured hosts ran it, not as the profile's own host did alone
    fp16 = dataclasses.replace(fp16, floor_steps=HOST_FLOOR_STEPS, floor_source=_HOST_FLOOR)
    h200 = fp16
    if dtype == "bf16":  # the floor is the host's: the fp16 profile's, measured on the same host and trainer
        h200 = dataclasses.replace(
            fp16,
            name="NVIDIA H200 bf16 (measured 2026-12-04, torch 2.11.0+cu130)",
            dtypes=("bf16",),
            rates=_bf16_rates(fp16),
            floor_steps=fp16._split[1],
            source=f"{_shown(H200_CHECK)} (bf16 rows at 128 and 224 px; 288 px: the fp16 profile's x the bf16/fp16 "
            "ratio measured at 224 px; resnet50_tweaked, channels_last)",
            floor_source=f"{fp16.floor_source}; the same host and trainer as the bf16 rows",
        )
    if gpu == "h200":
        return h200
    gpu_rates = h200._split[0]
    rates = tuple(
        r if g.images_per_s != r.images_per_s else Rate(r.image_size, r.batch_size, r.images_per_s * H100_OF_H200, 0.22)
        for r, g in zip(sorted(h200.rates, key=lambda r: r.image_size), gpu_rates, strict=True)
    )
    return dataclasses.replace(
        h200,
        floor_steps=h200._split[1],
        name=f"h100 ({dtype}, from the H200's measured rates)",
        rates=rates,
        source=f"{h200.source}; H100 SXM = H200 x {H100_OF_H200:.2f} (time +-22%) where the GPU bounds the step "
        "(the same SMs and clocks, 3.35 against 4.8 TB/s: between 0.70 and 1.0 of the H200's rate), unchanged at "
        "the floor",
    )


def gpu_names() -> list[str]:
    return sorted([*PUBLISHED, *MEASURED, *NO_PUBLISHED])


def published(gpu: str, dtype: str = "fp16") -> GpuRates:
    """The rate table of `gpu`: published, or measured here (H200; H100 from it). ValueError with a one-line
    message if there is none or the dtype does not run."""
    if gpu in NO_PUBLISHED:
        raise ValueError(f"--gpu {gpu}: {NO_PUBLISHED[gpu]}; measure it (make gpu-check) and pass --gpu-profile FILE")
    if gpu in MEASURED:
        if dtype not in DTYPES:
            raise ValueError(f"--dtype: {gpu} trains in {', '.join(DTYPES)}, got {dtype!r}")
        try:
            return measured(gpu, dtype)
        except ProfileError as e:
            raise ValueError(f"--gpu {gpu}: {e}") from None
    if gpu not in PUBLISHED:
        raise ValueError(f"--gpu: expected one of {', '.join(gpu_names())}, got {gpu!r}")
    g = PUBLISHED[gpu]
    if dtype not in g.dtypes:
        raise ValueError(f"--dtype: {gpu} trains in {', '.join(g.dtypes)}, got {dtype!r}")
    return g


def gpu_for_device(device_name: str) -> str | None:
    """The rate table of a CUDA device (torch.cuda.get_device_name), or None when there is none."""
    n = device_name.lower().replace(" ", "").replace("-", "")
    if "v100" in n:
        return "v100-32gb" if "32gb" in n else "v100"
    return next((g for g in ("a100", "h200", "h100") if g in n), None)


def _shown(path: Path) -> str:
    """`path` relative to the repository when inside it (the same text on every machine)."""
    try:
        return str(path.resolve().relative_to(DATA.parent.parent))
    except ValueError:
        return str(path)


def load_gpu_profile(path: str | Path, host_efficiency: float | None = None) -> GpuRates:
    """A profile written from `make gpu-check` (per-GPU images/s of a full step per image size and batch)."""
    path = Path(path)

    def bad(key: str, expected: str, got) -> ProfileError:
        return ProfileError(f"{path}: {key}: expected {expected}, got {got!r}")

    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise ProfileError(f"{path}: cannot read: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}: not JSON: {e.msg} at line {e.lineno}") from None
    if not isinstance(doc, dict):
        raise bad("(top level)", "an object", type(doc).__name__)
    for key in ("gpu", "torch", "date", "commit", "model"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise bad(key, "a non-empty string", doc.get(key))
    if doc.get("dtype") not in DTYPES:
        raise bad("dtype", " or ".join(repr(d) for d in DTYPES), doc.get("dtype"))
    if not isinstance(doc.get("channels_last"), bool):
        raise bad("channels_last", "true or false", doc.get("channels_last"))
    rates = doc.get("rates")
    if not isinstance(rates, list) or not rates:
        raise bad("rates", "a non-empty list of {image_size, batch_size, images_per_s}", rates)
    out = []
    for i, r in enumerate(rates):
        if not isinstance(r, dict):
            raise bad(f"rates[{i}]", "an object", r)
        for key, kind in (("image_size", int), ("batch_size", int), ("images_per_s", (int, float))):
            v = r.get(key)
            if isinstance(v, bool) or not isinstance(v, kind) or v <= 0:
                raise bad(f"rates[{i}].{key}", "a positive number", v)
        out.append(Rate(r["image_size"], r["batch_size"], float(r["images_per_s"]), 0.03))
    sizes = [r.image_size for r in out]
    if len(set(sizes)) != len(sizes):  # the table is one rate per size: the largest batch measured
        best: dict[int, Rate] = {}
        for r in out:
            if r.image_size not in best or r.batch_size > best[r.image_size].batch_size:
                best[r.image_size] = r
        out = list(best.values())
    name = f"{doc['gpu']} (measured {doc['date']}, torch {doc['torch']}, commit {doc['commit'][:12]})"
    # an NVSwitch host (A100, H100, H200) shares like the A100's; older ones like the V100's
    base = PUBLISHED["v100" if "v100" in doc["gpu"].lower() else "a100"]
    eff = host_efficiency if host_efficiency is not None else base.host_efficiency
    return GpuRates(
        name,
        (doc["dtype"],),
        tuple(sorted(out, key=lambda r: r.image_size)),
        f"{_shown(path)} ({doc['model']}, {doc['dtype']}, channels_last {doc['channels_last']})",
        eff,
        f"one GPU measured; the 8-GPU host's share borrowed from {base.name}: {base.host_source}",
        floor_source=f"{_shown(path)}: {FLOOR_WHY} (measured)",
    )


# ---------------------------------------------------------------------------------------------------------
# The other terms: each a dataclass with its value, range and source.


@dataclass(frozen=True)
class Sync:
    """Per-step multi-host cost that is not bandwidth: the step's collective waits for the slowest GPU."""

    sigma_s: float = 4.5e-3  # one GPU's step-time jitter (standard deviation), fitted on the record
    low_high: tuple[float, float] = (0.5, 1.5)  # x sigma
    source: str = (
        "sigma fitted on the record (16 x 8 entry minus 1 x 8 entry minus modelled exposed comm, per step); "
        "expected max of N normal draws: sqrt(2 ln N) sigma"
    )

    def seconds(self, hosts: int, gpus_per_host: int) -> float:
        if hosts <= 1:
            return 0.0
        n, g = hosts * gpus_per_host, max(gpus_per_host, 1)
        return self.sigma_s * (math.sqrt(2 * math.log(n)) - (math.sqrt(2 * math.log(g)) if g > 1 else 0.0))


@dataclass(frozen=True)
class Validation:
    """Validation after each epoch (wall clock only): forward passes, about a third of a training step per image."""

    forward_share: float = 1 / 3  # backward costs about twice the forward (two matmuls per forward matmul)
    low_high: tuple[float, float] = (0.7, 2.0)  # the input pipeline of 48k JPEGs can dominate a short forward
    source: str = "forward = 1/3 of a training step (backward ~ 2x forward FLOPs), validation set without blacklist"


@dataclass(frozen=True)
class BnAllreduce:
    """The BN running statistics averaged over all ranks before validation (wall clock only), once per epoch."""

    source: str = "one allreduce of every BN layer's running mean and variance (fp32): latency-bound"


@dataclass(frozen=True)
class StartUp:
    """Process launch, imports, NCCL communicators, model build, first pipeline fill (wall clock only, once)."""

    seconds: tuple[float, float, float] = (15.0, 30.0, 90.0)
    source: str = "estimate (torchrun + imports ~5 s, NCCL init over H hosts, DALI build, first batches)"


@dataclass(frozen=True)
class CommUncertainty:
    low_high: tuple[float, float] = (0.7, 1.3)
    source: str = "recipes/comm/stepmodel.py; lab validation within +-10% for ddp/multistream, outliers to -31%"


# ---------------------------------------------------------------------------------------------------------
# The model's gradient profile (for the comm model): when each gradient is ready during backward.


@dataclass(frozen=True)
class GradProfile:
    specs: tuple[TensorSpec, ...]
    ready: tuple[float, ...]  # gradient-ready fractions of backward
    forward_share: float  # forward / (forward + backward), by FLOPs
    image_size: int
    bn_bytes: int  # BN running mean + variance, fp32


def _matmul_flops(m, out) -> int:
    """Forward FLOPs of a convolution or linear layer (multiply-adds x 2); 0 for the others (BN, activations)."""
    import torch

    if isinstance(m, torch.nn.Conv2d):
        return 2 * out.numel() * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]
    if isinstance(m, torch.nn.Linear):
        return 2 * out.numel() * m.in_features
    return 0


def profile_model(model_name: str, image_size: int = 224) -> GradProfile:
    """When each gradient of `model_name` is ready during backward (remembered per model and size)."""
    return _profile_model(model_name, image_size)


@functools.lru_cache(maxsize=8)
def _profile_model(model_name: str, image_size: int) -> GradProfile:
    """When each gradient of `model_name` is ready during backward, from its layers' FLOPs (one forward on the meta
    device: nothing is computed, and every machine gets the same numbers).

    At a GPU's batch sizes a convolution's time follows its FLOPs; backward runs the layers in reverse, each costing
    twice its forward (the input's gradient and the weight's), the first layer once (no input gradient), and a
    layer's gradients are ready when its backward is done."""
    import torch

    from models.factory import create_model
    from recipes.config import load_config

    cfg = load_config(None, [f"model.name={model_name}"])
    model = create_model(cfg.model, 1000)
    specs, params = grad_specs(model)
    bn = sum(
        m.running_mean.numel() * 2 * 4
        for m in model.modules()
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None
    )
    owner = {id(p): m for m in model.modules() for p in m.parameters(recurse=False)}
    order: dict = {}  # module -> position in forward
    flops: dict = {}

    def hook(m, _inp, out):
        order.setdefault(m, len(order))
        flops[m] = flops.get(m, 0) + _matmul_flops(m, out)

    handles = [m.register_forward_hook(hook) for m in set(owner.values())]
    with torch.no_grad():
        model.to("meta")(torch.empty(1, 3, image_size, image_size, device="meta"))
    for h in handles:
        h.remove()
    first = min(order, key=order.get)
    back = {m: f * (1 if m is first else 2) for m, f in flops.items()}
    total = sum(back.values())

    def ready(p) -> float:  # backward has done every layer from the last one down to p's
        m = owner[id(p)]
        return 1.0 if m not in order else sum(b for k, b in back.items() if order[k] >= order[m]) / total

    fwd = sum(flops.values())
    return GradProfile(tuple(specs), tuple(ready(p) for p in params), fwd / (fwd + total), image_size, bn)


# ---------------------------------------------------------------------------------------------------------
# The cluster and the schedule.


@dataclass(frozen=True)
class Cluster:
    hosts: int
    gpus_per_host: int
    link_gbit: float = 32.0
    flow_gbit: float | None = 10.0
    flows_per_comm: int = 1  # TCP flows one communicator opens (NCCL sockets); see network()
    latency_s: float = 50e-6
    intra_gbyte: float = 150.0
    efficiency: float = 0.93

    @property
    def world(self) -> int:
        return self.hosts * self.gpus_per_host

    def network(self, hosts: int | None = None) -> sm.Network:
        """The stepmodel network of this cluster (or of `hosts` of its hosts).

        The one place where flows per communicator reach the comm model: a per-backend value (ddp with N flows)
        is wired here when stepmodel takes one."""
        return sm.Network(
            self.hosts if hosts is None else hosts,
            self.gpus_per_host,
            self.link_gbit,
            self.flow_gbit,
            self.latency_s,
            self.intra_gbyte,
            self.efficiency,
            flows_per_comm=self.flows_per_comm,
        )


@dataclass(frozen=True)
class Phase:
    """Part of a schedule with one image size and one per-GPU batch."""

    epochs: int
    steps: int  # optimizer steps over those epochs
    batch: int  # per GPU
    image_size: int
    val_size: int = 0  # 0: the image size


@dataclass(frozen=True)
class Backend:
    label: str
    name: str  # stepmodel backend
    kwargs: dict = field(default_factory=dict, hash=False, compare=False)
    overlap: bool = True  # False: every gradient ready at backward's end (XLA compiles backward as one cluster)
    # Latency-bound collectives every step besides the gradients', in passes around a flat ring of all N ranks
    # (a broadcast 1, an allreduce 2; NCCL before 2.4 had rings only): 0 for this trainer (DDP with
    # broadcast_buffers=False, no per-step metric allreduce; the finite check is deferred).
    small_ring_passes: int = 0
    small_source: str = "none: this trainer runs no per-step collective besides the gradients'"

    def small_collectives_s(self, cluster: Cluster) -> float:
        """Per step, over the same on one host (the single-host rates include it): (N - 1) ring steps of the
        per-message latency per pass."""
        one = (cluster.gpus_per_host - 1) * cluster.latency_s
        return self.small_ring_passes * ((cluster.world - 1) * cluster.latency_s - one)


def schedule_phases(cfg, world: int) -> list[Phase]:
    """The config's schedule on ImageNet-1k, one Phase per (image size, per-GPU batch)."""
    from recipes.schedule import Schedule

    plan = Schedule(cfg.phases, cfg.optim, num_images=IMAGENET_TRAIN_IMAGES, world_size=world)
    out: dict[int, list] = {}
    for e in plan.epochs:
        row = out.setdefault(e.phase_index, [0, 0, e.phase.batch_size // world, e.phase.image_size])
        row[0] += 1
        row[1] += e.steps
    return [Phase(*row) for row in out.values()]


def entry_phases(rows: list[tuple[int, int, int]], hosts: int, gpus_per_host: int) -> list[Phase]:
    """Phases of a published entry: (image size, global batch, epochs) rows; steps = ceil(images / batch)."""
    world = hosts * gpus_per_host
    return [Phase(ep, ep * math.ceil(IMAGENET_TRAIN_IMAGES / b), b // world, s) for s, b, ep in rows]


def backends(cfg=None) -> list[Backend]:
    """ddp, horovod and multistream as scripts/predict.py compares them (the config's comm settings if given)."""
    c = cfg.comm if cfg is not None else None
    ms = Settings(float(c.bucket_mb), c.streams, c.slices) if c is not None else Settings(8.0, 4, 2)
    comp = c.compression if c is not None else "none"
    return [
        Backend("ddp", "ddp", {"bucket_cap_mb": c.bucket_cap_mb if c is not None else 25.0, "compression": "none"}),
        # The strongest plain DDP: NCCL told to open several sockets per connection (comm.nccl_preset: flows-4).
        Backend(
            "ddp (4 flows)",
            "ddp",
            {"bucket_cap_mb": c.bucket_cap_mb if c is not None else 25.0, "compression": "none", "flows": 4},
        ),
        Backend("horovod", "horovod", {"horovod": sm.Horovod(fusion_mb=128.0), "compression": "none"}),
        Backend("multistream", "multistream", {"settings": ms, "compression": comp}),
    ]


# ---------------------------------------------------------------------------------------------------------
# The terms of a phase.


@dataclass(frozen=True)
class Term:
    name: str
    clock: str  # "train": in DAWNBench's training clock (and the wall clock); "wall": the wall clock only
    low: float
    mid: float
    high: float
    source: str


@dataclass
class PhaseEstimate:
    phase: Phase
    terms: list[Term]
    step_ms: dict[str, float]  # per-step parts, for the table

    def total(self, clock: str = "train", which: str = "mid") -> float:
        return sum(getattr(t, which) for t in self.terms if clock == "wall" or t.clock == "train")


@dataclass
class Estimate:
    backend: str
    gpu: str
    cluster: Cluster
    phases: list[PhaseEstimate]

    def total(self, clock: str = "train", which: str = "mid") -> float:
        return sum(p.total(clock, which) for p in self.phases)

    def range(self, clock: str = "train") -> tuple[float, float, float]:
        return self.total(clock, "low"), self.total(clock, "mid"), self.total(clock, "high")

    def widest(self, clock: str = "train") -> tuple[str, float]:
        """The term whose range contributes most to the total's range, and that width in seconds."""
        width: dict[str, float] = {}
        for p in self.phases:
            for t in p.terms:
                if clock == "wall" or t.clock == "train":
                    width[t.name] = width.get(t.name, 0.0) + (t.high - t.low)
        name = max(width, key=width.get)
        return name, width[name]

    def term_totals(self, clock: str = "wall") -> dict[str, tuple[float, float, float]]:
        out: dict[str, list[float]] = {}
        for p in self.phases:
            for t in p.terms:
                if clock == "wall" or t.clock == "train":
                    row = out.setdefault(t.name, [0.0, 0.0, 0.0])
                    row[0] += t.low
                    row[1] += t.mid
                    row[2] += t.high
        return {k: tuple(v) for k, v in out.items()}

    def to_json(self) -> dict:
        return {
            "backend": self.backend,
            "gpu": self.gpu,
            "cluster": self.cluster.__dict__,
            "train_s": dict(zip(("low", "mid", "high"), self.range("train"), strict=True)),
            "wall_s": dict(zip(("low", "mid", "high"), self.range("wall"), strict=True)),
            "widest_term": self.widest("wall")[0],
            "phases": [
                {
                    **p.phase.__dict__,
                    "step_ms": p.step_ms,
                    "train_s": p.total("train"),
                    "wall_s": p.total("wall"),
                    "terms": [t.__dict__ for t in p.terms],
                }
                for p in self.phases
            ],
        }


def step_compute(rates: GpuRates, image_size: int, batch: int, gpus_per_host: int, prof: GradProfile) -> sm.Compute:
    """One GPU's calibrated training step at `image_size` and per-GPU `batch` inside a host of `gpus_per_host` GPUs
    (compute plus the intra-host share), split into forward and backward with the profile's gradient-ready times."""
    step = rates.step_s(image_size, batch)
    if gpus_per_host > 1:
        step /= rates.host_efficiency  # compute + intra-host, as estimate() counts them
    return sm.Compute(step * prof.forward_share, step * (1 - prof.forward_share), prof.ready, 0.0)


def exposed_comm_s(backend: Backend, prof: GradProfile, step_s: float, cluster: Cluster, hosts: int) -> float:
    """Communication after backward's end on `hosts` hosts (stepmodel's fluid simulation)."""
    ready = prof.ready if backend.overlap else tuple(1.0 for _ in prof.ready)
    comp = sm.Compute(step_s * prof.forward_share, step_s * (1 - prof.forward_share), ready, 0.0)
    return sm.predict_step(backend.name, list(prof.specs), comp, cluster.network(hosts), **backend.kwargs).exposed_s


def _bn_allreduce_s(prof: GradProfile, cluster: Cluster) -> float:
    h, g = cluster.hosts, cluster.gpus_per_host
    if h * g == 1:
        return 0.0
    lat = 2 * (h - 1 + (g - 1)) * cluster.latency_s
    link = cluster.link_gbit * 1e9 / 8 * cluster.efficiency
    return lat + (2 * (h - 1) / h * prof.bn_bytes / link if h > 1 else 0.0)


def estimate(
    phases: list[Phase],
    cluster: Cluster,
    gpu: GpuRates,
    *,
    backend: Backend,
    prof: GradProfile,
    sync: Sync = Sync(),
    startup: StartUp = StartUp(),
    startup_in_clock: bool = False,
) -> Estimate:
    """Every term of every phase, on the training and wall clocks (`startup_in_clock`: the run's clock starts
    before its set-up, as some published entries' code does)."""
    h, g, n = cluster.hosts, cluster.gpus_per_host, cluster.world
    cu, val = CommUncertainty(), Validation()
    out = []
    prev_shape = None
    for i, ph in enumerate(phases):
        per_img = gpu.per_image_s(ph.image_size)
        u = gpu.uncertainty(ph.image_size)
        compute = ph.batch * per_img
        flo = gpu.step_floor
        floor = [max(0.0, f - compute) for f in flo]  # the part of the step the GPU waits for the host
        intra = (compute + floor[1]) * (1 / gpu.host_efficiency - 1) if g > 1 else 0.0
        step = compute + floor[1] + intra
        exposed = 0.0
        if h > 1:
            exposed = max(
                0.0,
                exposed_comm_s(backend, prof, step, cluster, h) - exposed_comm_s(backend, prof, step, cluster, 1),
            )
        sy = sync.seconds(h, g)
        small = backend.small_collectives_s(cluster)
        st = ph.steps
        terms = [
            Term("compute", "train", st * compute * (1 - u), st * compute, st * compute * (1 + u), gpu.source),
            Term("step floor", "train", *(st * f for f in floor), gpu.floor_source or FLOOR_WHY),
            Term(
                "intra-host",
                "train",
                st * intra * 0.5,
                st * intra,
                st * intra * 1.5,
                f"host efficiency {gpu.host_efficiency:.3f}: {gpu.host_source}",
            ),
            Term(
                "exposed comm",
                "train",
                st * exposed * cu.low_high[0],
                st * exposed,
                st * exposed * cu.low_high[1],
                f"{backend.label}: {cu.source}",
            ),
            Term("sync", "train", st * sy * sync.low_high[0], st * sy, st * sy * sync.low_high[1], sync.source),
            Term("small collectives", "train", st * small * 0.5, st * small, st * small * 2.0, backend.small_source),
        ]
        shape = (ph.image_size, ph.batch)
        changed = i > 0 and shape != prev_shape
        prev_shape = shape
        pc = gpu.phase_change_s if changed else (0.0, 0.0, 0.0)
        at = gpu.autotune_s if changed else (0.0, 0.0, 0.0)
        terms += [
            Term("pipeline rebuild", "train", *pc, gpu.phase_change_source),
            Term("autotune", "train", *at, gpu.autotune_source),
        ]
        vsize = ph.val_size or ph.image_size
        val_s = ph.epochs * VAL_IMAGES / n * gpu.per_image_s(vsize) * val.forward_share
        bn = ph.epochs * _bn_allreduce_s(prof, cluster)
        terms += [
            Term("validation", "wall", val_s * val.low_high[0], val_s, val_s * val.low_high[1], val.source),
            Term("BN allreduce", "wall", bn * 0.5, bn, bn * 3.0, BnAllreduce().source),
        ]
        if i == 0:
            clock = "train" if startup_in_clock else "wall"
            terms.append(Term("start-up", clock, *startup.seconds, startup.source))
        step_ms = {
            "compute": compute * 1e3,
            "step floor": floor[1] * 1e3,
            "intra-host": intra * 1e3,
            "exposed comm": exposed * 1e3,
            "sync": sy * 1e3,
            "small collectives": small * 1e3,
        }
        out.append(PhaseEstimate(ph, terms, step_ms))
    return Estimate(backend.label, gpu.name, cluster, out)


# ---------------------------------------------------------------------------------------------------------
# Calibration: the published runs in the repository (Alibaba 1 x 8 and 16 x 8), per phase, training clock.


@dataclass(frozen=True)
class PublishedRun:
    name: str
    source: str
    hosts: int
    gpus_per_host: int
    rows: tuple[tuple[int, int, int], ...]  # (image size, global batch, epochs)
    phase_s: tuple[float, ...]  # training clock (the TSV's hours) per phase, seconds
    link_gbit: float = 32.0
    flow_gbit: float | None = 10.0


# The TSV hours at each phase's last epoch, differenced (ImageNet/train/alibabacloud_resnet50_gn6e_{1,16}_machine_*)
ALIBABA_1X8 = PublishedRun(
    "Alibaba 1 x 8 V100 (AIACC-Training, TF 2.1 + XLA)",
    "alibabacloud_resnet50_gn6e_1_machine_tensorflow.tsv",
    1,
    8,
    ((96, 2048, 12), (128, 2048, 6), (224, 2048, 2), (288, 1024, 1)),
    (447.62, 335.97, 277.34, 236.73),
)
ALIBABA_16X8 = PublishedRun(
    "Alibaba 16 x 8 V100, 32 Gbit/s (the record)",
    "alibabacloud_resnet50_gn6e_16_machine_tensorflow.tsv",
    16,
    8,
    ((96, 32768, 13), (128, 32768, 11), (224, 32768, 3), (288, 16384, 1)),
    (51.05, 57.36, 31.11, 18.03),
)
CALIBRATION_RUNS = (ALIBABA_1X8, ALIBABA_16X8)
# AIACC-Training on TensorFlow + XLA: fp16 gradients (~50 MB a step) on several streams, after backward (XLA
# compiles backward as one cluster: no gradient is ready before its end, so nothing is hidden).
CALIBRATION_BACKEND = Backend(
    "AIACC (multistream, fp16, after backward)",
    "multistream",
    {"settings": Settings(8.0, 4, 2), "compression": "fp16"},
    overlap=False,
)


def run_estimate(
    run: PublishedRun, prof: GradProfile, gpu: GpuRates | None = None, backend: Backend | None = None
) -> Estimate:
    cluster = Cluster(run.hosts, run.gpus_per_host, run.link_gbit, run.flow_gbit)
    return estimate(
        entry_phases(list(run.rows), run.hosts, run.gpus_per_host),
        cluster,
        gpu or PUBLISHED["v100-tf-xla"],
        backend=backend or CALIBRATION_BACKEND,
        prof=prof,
    )


def calibration(prof: GradProfile) -> list[tuple[PublishedRun, Estimate]]:
    return [(run, run_estimate(run, prof)) for run in CALIBRATION_RUNS]


def calibration_lines(prof: GradProfile) -> list[str]:
    """The fit's residuals per phase (training clock), as a Markdown table."""
    lines = [
        "| published run (fitted, training clock) | phase | px | published s | model s | residual |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for run, est in calibration(prof):
        for i, (p, pub) in enumerate(zip(est.phases, run.phase_s, strict=True)):
            m = p.total("train")
            lines.append(
                f"| {run.name if i == 0 else ''} | {i + 1} | {p.phase.image_size} | {pub:.1f} | {m:.1f} | "
                f"{m / pub - 1:+.1%} |"
            )
        tot, m = sum(run.phase_s), est.total("train")
        lines.append(f"| | total | | {tot:.1f} | {m:.1f} | {m / tot - 1:+.1%} |")
    return lines


# ---------------------------------------------------------------------------------------------------------
# The entry point for other tools (hardware presets).


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

    root = Path(__file__).resolve().parent.parent
    cfg = load_config(config or str(root / "configs" / "dawnbench_158s.yaml"), [])
    rates = load_gpu_profile(gpu_profile) if gpu_profile else published(gpu, dtype)
    cluster = Cluster(hosts, gpus_per_host, link_gbit, flow_gbit or None, flows_per_comm)
    be = {b.label: b for b in backends(cfg)}  # by label: two rows run the stepmodel's "ddp" (1 and 4 flows)
    if backend not in be:
        raise ValueError(f"backend: expected one of {', '.join(repr(k) for k in be)}, got {backend!r}")
    prof = profile_model(cfg.model.name)
    est = estimate(schedule_phases(cfg, cluster.world), cluster, rates, backend=be[backend], prof=prof)
    return est.range(clock)


# ---------------------------------------------------------------------------------------------------------
# Out of sample: published multi-host V100 entries the model was not fitted on.


@dataclass(frozen=True)
class EntrySoftware:
    """What an out-of-sample entry ran, from its JSON and its code: the rate table, the allreduce, the per-flow cap."""

    gpu: str
    backend: Backend
    flow_gbit: float | None
    source: str
    startup_in_clock: bool = False
    startup_source: str = "the clock starts after set-up"


ENTRY_SOFTWARE = {
    # fast.ai's imagenet18 (training/train_imagenet_nv.py, diux-dev/imagenet18) on PyTorch 0.4/0.5 and NCCL 2.2:
    # torch.nn.parallel.DistributedDataParallel with the NCCL backend reduces all gradients in one step after
    # backward (_register_nccl_grad_hook: 256 MB buckets, nothing overlapped), broadcasts the BN buffers from rank 0
    # in every forward (_sync_params, one ring pass) and the loop all-reduces its metrics every step and copies
    # them to the host (dist_utils.sum_tensor(metrics).cpu(), two passes). NCCL 2.2 had rings only (trees: 2.4).
    "pytorch-0.4-ddp": EntrySoftware(
        "v100-pytorch-2018",
        Backend(
            "PyTorch 0.4 DDP, NCCL (one allreduce after backward)",
            "ddp",
            {"bucket_cap_mb": 256.0, "compression": "fp16"},
            overlap=False,
            small_ring_passes=3,
            small_source="imagenet18's loop: BN buffers broadcast in DDP's forward (1 pass) and a metrics "
            "all_reduce + .cpu() every step (2 passes), each (N - 1) ring steps over all N ranks (NCCL 2.2: rings)",
        ),
        10.0,
        "AWS: 10 Gbit/s per flow in a cluster placement group, 25 Gbit/s per p3.16xlarge",
        True,
        "imagenet18 takes start_time before its first collective (NCCL set-up) and before the loaders' workers "
        "start: the first epoch carries the start-up (its TSVs: +15 to +47 s over the second)",
    ),
    # Huawei's ModelArts entry (TensorFlow 1.13 + XLA, AMP, Horovod 0.15.2 with fp16 compression, NCCL 2.4.2, GPUDirect
    # RDMA over InfiniBand): the record's kind of software, so the Alibaba 1 x 8 rates; Horovod's fusion buffer
    # 64 MB (its default then); XLA's backward as one cluster, so nothing is ready before its end (as for AIACC).
    "tf-xla-horovod-ib": EntrySoftware(
        "v100-tf-xla",
        Backend(
            "Horovod 0.15 (fp16, after backward: XLA)",
            "horovod",
            {"horovod": sm.Horovod(fusion_mb=64.0), "compression": "fp16"},
            overlap=False,
        ),
        None,
        "InfiniBand: no per-flow cap (RDMA); the link rate is not published: 100 Gbit/s (EDR) assumed",
    ),
}


def out_of_sample(path: str | Path, prof: GradProfile) -> list[dict]:
    """Each entry of `path` (tests/data/dawnbench_entries/out_of_sample.json) against the model, per image size,
    with the software its JSON and code name (ENTRY_SOFTWARE): nothing is fitted on these entries."""
    doc = json.loads(Path(path).read_text())
    out = []
    for e in doc["entries"]:
        sw = ENTRY_SOFTWARE[e["software"]]
        cluster = Cluster(e["hosts"], e["gpus_per_host"], e["link_gbit"], sw.flow_gbit)
        est = estimate(
            entry_phases([tuple(r) for r in e["rows"]], e["hosts"], e["gpus_per_host"]),
            cluster,
            PUBLISHED[sw.gpu],
            backend=sw.backend,
            prof=prof,
            startup_in_clock=sw.startup_in_clock,
        )
        by_size: dict[int, list[float]] = {}
        for p in est.phases:
            row = by_size.setdefault(p.phase.image_size, [0.0, 0.0, 0.0])
            for k, w in enumerate(("low", "mid", "high")):
                row[k] += p.total("train", w)
        sizes = [
            {
                "image_size": int(sz),
                "published_s": pub,
                "low": by_size[int(sz)][0],
                "mid": by_size[int(sz)][1],
                "high": by_size[int(sz)][2],
            }
            for sz, pub in e["size_s"].items()
        ]
        pub_total = sum(x["published_s"] for x in sizes)
        out.append(
            {
                "name": e["name"],
                "source": e["source"],
                "software": e["software"],
                "step_ms": [(p.phase.image_size, p.phase.batch, p.step_ms) for p in est.phases],
                "sizes": sizes,
                "published_s": pub_total,
                "low": est.total("train", "low"),
                "mid": est.total("train"),
                "high": est.total("train", "high"),
            }
        )
    return out


def out_of_sample_lines(path: str | Path, prof: GradProfile) -> list[str]:
    lines = [
        "| published entry (not fitted, training clock) | px | published s | model s (low-high) | error |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in out_of_sample(path, prof):
        for i, x in enumerate(r["sizes"]):
            lines.append(
                f"| {r['name'] if i == 0 else ''} | {x['image_size']} | {x['published_s']:.0f} | {x['mid']:.0f} "
                f"({x['low']:.0f}-{x['high']:.0f}) | {x['mid'] / x['published_s'] - 1:+.0%} |"
            )
        lines.append(
            f"| | total | {r['published_s']:.0f} | {r['mid']:.0f} ({r['low']:.0f}-{r['high']:.0f}) | "
            f"{r['mid'] / r['published_s'] - 1:+.0%} |"
        )
    return lines


def out_of_sample_step_lines(path: str | Path, prof: GradProfile) -> list[str]:
    """The model's per-step terms (ms) of every out-of-sample segment, with the software each entry ran."""
    keys = ("compute", "step floor", "intra-host", "exposed comm", "sync", "small collectives")
    lines = [
        "| entry | software (allreduce) | px | batch/GPU | " + " | ".join(f"{k} ms" for k in keys) + " | step ms |",
        "|---|---|---:|---:|" + "---:|" * (len(keys) + 1),
    ]
    for r in out_of_sample(path, prof):
        sw = ENTRY_SOFTWARE[r["software"]]
        for i, (size, batch, ms) in enumerate(r["step_ms"]):
            head = f"{r['source'].split('.json')[0]} | {sw.backend.label}" if i == 0 else " | "
            cells = " | ".join(f"{ms[k]:.1f}" for k in keys)
            lines.append(f"| {head} | {size} | {batch} | {cells} | {sum(ms[k] for k in keys):.0f} |")
    return lines


def calibrated_compute(cfg, specs, world: int, gpus_per_host: int, device_name: str | None) -> tuple:
    """(stepmodel.Compute or None, what it is): one GPU's step at the run's first image size and per-GPU batch, from
    recipes/timemodel.py's calibrated rates of the run's GPU (comm.gpu_profile: measured ones), with the gradient-
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
