"""Will each phase fit the GPU? An estimate of a training step's per-GPU memory, checked before training starts.

Per phase, from the per-GPU micro-batch (recipes/schedule.py: the per-GPU batch over the accumulation), the image
size, the autocast dtype (`run.amp`) and the model:

    activations   the tensors autograd saves for backward. Measured, not guessed: one forward of the model on the
                  CPU at 64 px in float32 with `saved_tensors_hooks` counting every saved storage that is not a
                  parameter; the bytes grow with the pixels (timm resnet50, measured here: 1,818 B/px at 64 px
                  from one image, 1,716 B/px at 224 px from two: 86 MB per 224 px image). Under fp16/bf16
                  autocast they are 16-bit but for the BN and loss parts kept in float32: 0.55 of the float32
                  bytes (our assumption).
    model states  fp32 weights, gradients, momentum and the allreduce's gradient buckets: 16 bytes per parameter
    input         the whole per-GPU batch of images as the input pipeline hands it over (accumulation cuts it on
                  the GPU), 2 bytes per value under fp16/bf16, 4 otherwise
    overhead      CUDA context, cuDNN workspaces and allocator fragmentation: 1.5 GiB, and 10% of the GPU kept free
    graph pool    a phase whose step is captured (run.cuda_graph, recipes/steps.py graph_decision) keeps the step's
                  tensors in the graph's private pool for the whole phase, beside what eager work (evaluation, the
                  warm-up steps of the next size) takes from the ordinary cache: its activations once more (our
                  estimate; the capture probe measures the reserved memory after a capture)

A check against published runs: NVIDIA's examples train ResNet-50 with AMP at 256 images per V100 16 GB at 224 px
(estimate: 13.9 of 14.4 usable GiB: the largest that fits is 266), and the record ran 128 per V100 32 GB at 288 px
(estimate: 11.8 of 28.8 GiB).
`channels_last` changes the layout, not the bytes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from base.errors import ConfigError

GIB = 2**30
# GPU memory in GiB; the names are recipes/timemodel/'s GPU names where it has one.
GPU_MEMORY_GIB: dict[str, float] = {
    "v100": 16.0,
    "v100-32gb": 32.0,
    "a100-40gb": 40.0,
    "a100": 80.0,
    "h100": 80.0,
    "h200": 141.0,
}
HALF_SHARE = 0.55  # 16-bit autocast activations vs float32 (BN statistics, logits and loss stay float32)
STATE_BYTES_PER_PARAM = 16  # fp32 weight + gradient + momentum + allreduce bucket
OVERHEAD_BYTES = int(1.5 * GIB)
USABLE = 0.90  # of the GPU's memory: what the estimate may fill
PROBE_SIZE = 64


@functools.lru_cache(maxsize=8)
def activation_bytes_per_pixel(model_name: str) -> float:
    """float32 bytes autograd saves per image pixel for `model_name` (one forward of one image on the CPU)."""
    import torch

    from models import create_model
    from recipes.config import load_config

    cfg = load_config(None, [f"model.name={model_name}"])
    torch.manual_seed(0)
    model = create_model(cfg.model, 1000).train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            saved[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(torch.randn(1, 3, PROBE_SIZE, PROBE_SIZE))
    return sum(saved.values()) / PROBE_SIZE**2


@functools.lru_cache(maxsize=8)
def parameter_count(model_name: str) -> int:
    from models import create_model
    from recipes.config import load_config

    return sum(
        p.numel() for p in create_model(load_config(None, [f"model.name={model_name}"]).model, 1000).parameters()
    )


@dataclass(frozen=True)
class Need:
    """Estimated bytes of one GPU's training step."""

    activations: int
    states: int
    input: int
    overhead: int = OVERHEAD_BYTES
    graph_pool: int = 0  # a captured step's private pool (0: the phase runs eagerly)

    @property
    def total(self) -> int:
        return self.activations + self.states + self.input + self.overhead + self.graph_pool


def need(
    model_name: str, *, image_size: int, micro_batch: int, per_gpu_batch: int, amp: str, captured: bool = False
) -> Need:
    """The estimate for one phase (micro_batch: images per forward; per_gpu_batch: images per optimizer step;
    captured: the step is one CUDA graph, whose pool holds its activations)."""
    share = 1.0 if amp == "none" else HALF_SHARE
    act = activation_bytes_per_pixel(model_name) * image_size**2 * micro_batch * share
    value_bytes = 4 if amp == "none" else 2
    inp = per_gpu_batch * 3 * image_size**2 * value_bytes
    pool = int(act) if captured else 0
    return Need(int(act), parameter_count(model_name) * STATE_BYTES_PER_PARAM, int(inp), graph_pool=pool)


def usable_bytes(total_bytes: int) -> int:
    return int(total_bytes * USABLE)


def gpu_memory_bytes(name: str) -> int:
    """A GPU's memory from the table (ConfigError naming the choices if unknown)."""
    if name not in GPU_MEMORY_GIB:
        raise ConfigError(f"--gpu: expected one of {', '.join(GPU_MEMORY_GIB)}, got {name!r}")
    return int(GPU_MEMORY_GIB[name] * GIB)


def largest_micro_batch(
    model_name: str, *, image_size: int, per_gpu_batch: int, amp: str, gpu_bytes: int, captured: bool = False
) -> int:
    """The most images per forward that fit `gpu_bytes` at this phase (0 if not even one)."""
    one = need(model_name, image_size=image_size, micro_batch=1, per_gpu_batch=per_gpu_batch, amp=amp)
    room = usable_bytes(gpu_bytes) - (one.total - one.activations)
    per_image = one.activations * (2 if captured else 1)
    return max(0, int(room // max(per_image, 1)))


def captured_phases(cfg, plan) -> list[bool]:
    """Per phase, whether its step would be captured on a GPU (recipes/steps.py's decision for this config)."""
    from recipes.steps import phase_graph_decisions

    decisions = phase_graph_decisions(
        cfg.run,
        cfg.comm,
        optim=cfg.optim.name,
        micro_batches=plan.phase_micro_batches(),
        device_type="cuda",
        world_size=plan.world_size,
        dali=cfg.data.backend == "dali",
    )
    return [ok for ok, _ in decisions]


def check_fits(cfg, plan, gpu_bytes: int, gpu_label: str, captured: list[bool] | None = None) -> list[str]:
    """One line per phase that will not fit, naming the phase and the accumulation (run.max_gpu_batch) that fits.
    `captured`: per phase, whether its step is a CUDA graph (default: the config's decision on a GPU)."""
    from recipes.schedule import micro_batches

    captured = captured_phases(cfg, plan) if captured is None else captured
    problems, seen = [], set()
    for e in plan.epochs:
        if e.phase_index in seen:
            continue
        seen.add(e.phase_index)
        per_gpu, micro = e.phase.batch_size // plan.world_size, plan.micro_batch(e.epoch)
        size = e.phase.image_size
        graph = captured[e.phase_index]
        n = need(
            cfg.model.name, image_size=size, micro_batch=micro, per_gpu_batch=per_gpu, amp=cfg.run.amp, captured=graph
        )
        if n.total <= usable_bytes(gpu_bytes):
            continue
        fits = largest_micro_batch(
            cfg.model.name, image_size=size, per_gpu_batch=per_gpu, amp=cfg.run.amp, gpu_bytes=gpu_bytes, captured=graph
        )
        a = micro_batches(per_gpu, cfg.run.accumulate, fits) if fits else None
        fix = (
            f"set run.accumulate={a} (micro-batch {per_gpu // a}), run.max_gpu_batch_by_size={{{size}: {fits}}} "
            f"(this image size only) or run.max_gpu_batch={fits}"
            if a
            else "no micro-batch fits: use more GPUs or a GPU with more memory"
        )
        problems.append(
            f"phases.{e.phase_index} ({size} px, {per_gpu} images per GPU as {e.micro_batches} x {micro}) needs "
            f"~{n.total / GIB:.1f} GiB"
            + (f" (of which the CUDA graph's pool ~{n.graph_pool / GIB:.1f} GiB)" if n.graph_pool else "")
            + f", {gpu_label} has {gpu_bytes / GIB:.0f} GiB ({USABLE:.0%} usable): {fix}"
        )
    return problems


def refuse_if_too_big(cfg, plan, device) -> None:
    """On a CUDA device, before training: a ConfigError naming each phase that will not fit and the fix."""
    if device.type != "cuda":
        return  # host memory is not the limit this guards
    import torch

    props = torch.cuda.get_device_properties(device)
    problems = check_fits(cfg, plan, props.total_memory, props.name)
    if problems:
        raise ConfigError("; ".join(problems))


def accumulation(cfg) -> dict:
    """The config's accumulation settings as `Schedule`'s keyword arguments (run.accumulate, run.max_gpu_batch,
    run.max_gpu_batch_by_size, data.aug_splits)."""
    return {
        "accumulate": cfg.run.accumulate,
        "max_gpu_batch": cfg.run.max_gpu_batch,
        "max_gpu_batch_by_size": cfg.run.max_gpu_batch_by_size,
        "aug_splits": cfg.data.get("aug_splits", 0),  # a pipeline without timm's AugMix: no splits
    }
