"""Checks 1 and 2 of gpu_check.py, in its own process: training-step throughput (the trainer against a bare
loop on identical prebuilt device batches; ResNet-50 v1.5 against NVIDIA's figure; the time model's GPU profile)
and DALI's GPU decoding timed on a pipeline built before the clock starts."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import statistics
import sys
import time
from pathlib import Path

from scripts.gpu_check.gpu_check_env import REFERENCE_FRACTION, native_bf16, rn50_reference
from scripts.gpu_check.gpu_check_rows import guard, judged, row
from scripts.gpu_check.gpu_check_timing import seconds_per_call

SIZES = (96, 128, 224, 288)
# Per-GPU batch of each size: the 158 s record's global batch over its 128 GPUs (32768, and 16384 at 288 px).
BATCH = {96: 256, 128: 256, 224: 256, 288: 128}
OVERHEAD_MAX = 3.0  # % the trainer may lose against the bare loop
PROFILE_MODEL = "resnet50_tweaked"
DALI_WORKERS = 8  # DALI CPU threads per GPU in the record's config (configs/dawnbench_158s.yaml data.workers)


def step_config(model: str, optim: str, amp: str, *, size: int, batch: int, steps: int, rounds: int, out: Path):
    from recipes.config import load_config

    return load_config(
        None,
        [
            "data.backend=synthetic",
            f"data.synthetic_size={batch * steps}",
            "data.synthetic_classes=1000",
            f"model.name={model}",
            f"run.amp={amp}",
            "run.channels_last=true",
            f"optim.name={optim}",
            "log.tensorboard=false",
            "checkpoint.enabled=false",
            "checkpoint.resume=false",
            f"log.every_steps={steps}",
            f"run.out_dir={out}",
            f"phases=[{{epochs: {rounds + 1}, image_size: {size}, batch_size: {batch}}}]",
        ],
    )


def _synced(fn) -> float:
    """Seconds `fn()` took with the GPU: synchronize before and after, nowhere inside (an input pipeline's epoch:
    DALI works on streams of its own, which the step timer's events on the current stream would not see)."""
    import torch

    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def bare_loop(model, optimizer, criterion, x, y, *, steps: int, amp_dtype, scaler) -> float:
    """Images/s of a plain autocast forward/backward/step loop on one prebuilt device batch."""
    import torch

    def step():
        with torch.autocast("cuda", dtype=amp_dtype):
            loss = criterion(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()

    model.train()
    return x.shape[0] / seconds_per_call(step, steps, device=x.device)


ROUNDS = 5  # alternating (bare loop, trainer) rounds per size: at launch-bound sizes one round varies by several %


@dataclasses.dataclass
class StepTiming:
    """One size's measurement: images/s of each alternating round for the trainer and the bare loop, and the GPU's
    own kernel time per step (None where it was not measured)."""

    ours: list[float]
    bare: list[float]
    kernel_ms: float | None = None

    @property
    def rate(self) -> float:
        return statistics.median(self.ours)

    @property
    def bare_rate(self) -> float:
        return statistics.median(self.bare)

    @property
    def overhead_pct(self) -> float:
        """How much slower the trainer is than the bare loop, in %: the median over rounds of each round's pair
        (the two sides of a pair run back to back, so a drift in clocks or host load cancels)."""
        return 100.0 * (1.0 - statistics.median(o / b for o, b in zip(self.ours, self.bare, strict=True)))


def kernel_ms_per_step(run, steps: int = 3) -> float | None:
    """Milliseconds of CUDA kernel time per step of `run(steps)` (torch.profiler, CUDA activity only): the GPU's own
    share of a step; for the rest of the step's wall time the GPU waited for the host. None without CUDA or where the
    profiler saw no kernel."""
    import torch

    if not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(steps)
        torch.cuda.synchronize()
    us = sum(getattr(e, "self_device_time_total", 0.0) for e in prof.key_averages())
    return us / 1000.0 / steps if us > 0 else None


def measure_step(
    model: str, optim: str, amp: str, *, size: int, batch: int, steps: int, work: Path, rounds: int = ROUNDS
) -> StepTiming:
    """The trainer's and a bare loop's images/s in `rounds` alternating rounds on the same prebuilt device batch,
    and the bare loop's kernel time per step.

    The trainer's input is replaced by that batch, so neither side builds input inside its timed window."""
    import torch

    from models import create_model
    from recipes.optim import create_optimizer
    from recipes.steps import create_criterion
    from recipes.trainer import Trainer

    cfg = step_config(model, optim, amp, size=size, batch=batch, steps=steps, rounds=rounds, out=work)
    with contextlib.redirect_stdout(sys.stderr):
        trainer = Trainer(cfg)
    trainer.log.active = False
    dev = trainer.dist.device
    x, y = next(iter(trainer.data.train_batches(trainer.plan.epoch_info(0))))
    x = x.to(dev).contiguous(memory_format=torch.channels_last)
    y = y.to(dev)

    def prebuilt(info, start_step: int = 0):
        return [(x, y)] * (info.steps - start_step)

    trainer.data.train_batches = prebuilt
    assert trainer.plan.epoch_info(0).steps == steps
    torch.manual_seed(0)
    bare_model = create_model(cfg.model, 1000).to(dev).to(memory_format=torch.channels_last)
    bare_opt = create_optimizer(cfg.optim, bare_model)
    dtype = torch.float16 if amp == "fp16" else torch.bfloat16
    scaler = torch.amp.GradScaler("cuda") if amp == "fp16" else None
    criterion = create_criterion(cfg).to(dev)
    bare = functools.partial(bare_loop, bare_model, bare_opt, criterion, x, y, amp_dtype=dtype, scaler=scaler)
    bare(steps=3)  # warm-up: cuDNN's algorithm search
    trainer.train_one_epoch(0)
    timing = StepTiming([], [])
    for r in range(rounds):
        timing.bare.append(bare(steps=steps))
        epoch = functools.partial(trainer.train_one_epoch, r + 1)  # `steps` steps on the prebuilt batch
        timing.ours.append(steps * batch / seconds_per_call(epoch, device=dev))
    timing.kernel_ms = kernel_ms_per_step(lambda n: bare(steps=n))
    trainer.close()
    del trainer, bare_model, bare_opt
    torch.cuda.empty_cache()
    return timing


def step_row(name: str, t: StepTiming, batch: int) -> dict:
    """The trainer's overhead against the bare loop (paired rounds), failing above OVERHEAD_MAX %."""
    wall_ms = 1000.0 * batch / t.bare_rate
    gpu = "" if t.kernel_ms is None else f"; GPU kernels {t.kernel_ms:.1f} of {wall_ms:.1f} ms per step"
    return judged(
        name,
        t.overhead_pct,
        "% slower than bare loop",
        at_most=OVERHEAD_MAX,
        reference=f"trainer {t.rate:,.0f} img/s per GPU (rounds {min(t.ours):,.0f}-{max(t.ours):,.0f}), bare loop "
        f"{t.bare_rate:,.0f} ({min(t.bare):,.0f}-{max(t.bare):,.0f}), same model, optimizer and prebuilt batch, "
        f"{len(t.ours)} paired rounds" + gpu,
    )


def check_steps(rows: list[dict], steps: int, work: Path, profile: dict) -> None:
    """Train-step rows; fills `profile['rates']` (the time model's GPU profile) with the resnet50_tweaked rates."""
    import torch

    name = torch.cuda.get_device_name(0)
    cap = torch.cuda.get_device_capability(0)
    bf16 = native_bf16(cap)
    for size in SIZES:
        b = BATCH[size]
        label = f"train step {PROFILE_MODEL} {profile['dtype']} {size}px b{b} (channels_last, hybrid optimizer)"
        with guard(rows, label):
            t = measure_step(
                PROFILE_MODEL, "hybrid", profile["dtype"], size=size, batch=b, steps=steps, work=work / f"steps-{size}"
            )
            rows.append(step_row(label, t, b))
            rate = {"image_size": size, "batch_size": b, "images_per_s": round(t.rate, 1)}
            if t.kernel_ms is not None:  # the GPU's own time; the rest of a step the GPU waited for the host
                rate["kernel_ms_per_step"] = round(t.kernel_ms, 2)
            profile["rates"].append(rate)
    for size in (128, 224):
        label = f"train step {PROFILE_MODEL} bf16 {size}px b{BATCH[size]}"
        if not bf16:
            rows.append(row(label, f"skip: {name} (compute capability {cap[0]}.{cap[1]}) has no native bf16"))
            continue
        with guard(rows, label):
            t = measure_step(
                PROFILE_MODEL, "hybrid", "bf16", size=size, batch=BATCH[size], steps=steps, work=work / f"bf16-{size}"
            )
            rows.append(step_row(label, t, BATCH[size]))
    label = "train step resnet50 (v1.5) fp16 224px b256, SGD: NVIDIA's published model and setting"
    with guard(rows, label):
        t = measure_step("resnet50", "sgd", "fp16", size=224, batch=256, steps=steps, work=work / "rn50")
        ours = t.rate
        ref = rn50_reference(name)
        if ref.images_per_s is None:
            rows.append(
                row(label, f"n/a: {ref.text}", ours, "img/s per GPU", reference=f"bare loop {t.bare_rate:,.0f} img/s")
            )
        else:
            rows.append(
                judged(
                    label,
                    ours,
                    "img/s per GPU",
                    at_least=REFERENCE_FRACTION * ref.images_per_s,
                    reference=f"{ref.text}; threshold {REFERENCE_FRACTION:.0%} of it",
                )
            )


def _drain(batches, seen: list) -> None:
    """Iterate `batches`, keeping the image tensors (their shapes are checked after the clock stops)."""
    for x, _ in batches:
        seen.append(x)


def check_dali(rows: list[dict], sample: Path, rates: dict[int, float]) -> None:
    """DALI mixed (nvJPEG) decoding per size, timed over a second epoch of the same pipeline; it must feed at least
    the training step's rate at that size (`rates`, from check_steps) where one was measured."""
    import torch

    from recipes.schedule import EpochInfo
    from scripts.bench.bench_input import standalone_input

    dev = torch.device("cuda", 0)
    batch = 64
    for size in SIZES:
        label = f"DALI mixed decode + random-resized-crop {size}px (sample JPEGs)"
        with guard(rows, label):
            phase = f"{{epochs: 2, image_size: {size}, batch_size: {batch}}}"
            over = ["data.backend=dali", f"data.root={sample}", f"data.workers={DALI_WORKERS}", f"phases=[{phase}]"]
            cfg, pipe = standalone_input(over, dev)
            first = EpochInfo(0, 0, cfg.phases[0], 0, math.ceil(pipe.num_train / batch))
            for _ in pipe.train_batches(first):  # epoch 0: builds the pipeline and fills its queue
                pass
            built = pipe._train[1]
            seen: list = []
            second = dataclasses.replace(first, epoch=1, first_step=first.steps)
            dt = _synced(functools.partial(_drain, pipe.train_batches(second), seen))
            n = sum(x.shape[0] for x in seen)
            shape_ok = all(x.is_cuda and x.shape.count(size) >= 2 for x in seen)  # NCHW or NHWC, square crops
            same = pipe._train[1] is built
            pipe.close()
            need = rates.get(size)
            why = ""
            if not same:
                why = "the pipeline was rebuilt inside the timed epoch"
            elif not shape_ok or n == 0:
                why = f"{n} images, shape not {size}x{size} on cuda"
            rows.append(
                judged(
                    label,
                    n / dt,
                    "images/s",
                    at_least=need if need else 1.0,
                    reference=f"{n} images on cuda:0, epoch 2 of one prebuilt pipeline, {DALI_WORKERS} CPU threads; "
                    + (f"threshold: the training step's {need:,.0f} img/s" if need else "no step rate at this size"),
                    why=why,
                )
            )
    label = "DALI mixed rect validation (each image once)"
    with guard(rows, label):
        phase = "{epochs: 1, image_size: 128, batch_size: 64, rect_val: true}"
        cfg, pipe = standalone_input(
            ["data.backend=dali", f"data.root={sample}", "data.workers=4", f"phases=[{phase}]"], dev
        )
        n = sum(x.shape[0] for x, _ in pipe.val_batches(cfg.phases[0]))
        expected = pipe.num_val
        pipe.close()
        rows.append(judged(label, n, "images", at_least=expected, at_most=expected, reference=f"{expected} val images"))
