"""Compute: a rate table per GPU (published figures, the H200 measured here, or a `make gpu-check` profile), the
step floor found in it (split_floor), and the sources of every number."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

from base import reader
from recipes.timemodel.imagenet import IMAGENET_TRAIN_IMAGES

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
DATA = Path(__file__).resolve().parents[2] / "docs" / "data"
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

    # a regular file, strict JSON (NaN, Infinity and 1e999 rates are refused), an object
    doc = reader.read_json_object(path, what="GPU profile", error=ProfileError, max_bytes=1 << 20)
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
        # a plausible floor too: a rate of 1e-300 images/s is no measurement, and gives 300-digit results
        for key, kind, low, top in (
            ("image_size", int, 1, 4096),
            ("batch_size", int, 1, 1 << 20),
            ("images_per_s", float, 0.01, 1e9),
        ):
            v = r.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, kind)) or not low <= v <= top:
                raise bad(f"rates[{i}].{key}", f"a number in [{low:g}, {top:,g}]", v)
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
