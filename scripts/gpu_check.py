#!/usr/bin/env python
"""One prepared check of every GPU path (docs/gpu.md): DALI nvJPEG input, AMP training steps, the trainer end to end
over NCCL (ddp, multistream + autotune, horovod), evaluate.py and the batch-1 inference modes.

    python scripts/gpu_check.py [--out gpu_check.json] [--steps 20]      (make gpu-check)

Prints one Markdown table (check, result, number, unit, reference) and writes the same rows as JSON to --out; exits 1
if any check fails. Without CUDA it prints one line saying so and exits 0, having run nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from gpu_check_rows import failed, guard, markdown_table, row  # noqa: E402
from gpu_check_runs import check_e2e, check_eval  # noqa: E402

NO_GPU = "gpu-check: no CUDA GPU present: nothing GPU-only ran"
# NVIDIA DeepLearningExamples, PyTorch ResNet-50 v1.5, training performance, DGX A100 (8x A100 80GB), AMP, batch 256.
NVIDIA_RN50_AMP_8XA100 = 16621.0
NVIDIA_RN50_AMP_PER_GPU = NVIDIA_RN50_AMP_8XA100 / 8
NVIDIA_REF = f"NVIDIA DLE RN50 AMP 8xA100: {NVIDIA_RN50_AMP_8XA100:,.0f} img/s = {NVIDIA_RN50_AMP_PER_GPU:,.0f}/GPU"
SIZES = (96, 128, 224, 288)


# --- 1. DALI mixed decoding ---------------------------------------------------------------------------------------
def check_dali(rows: list[dict], sample: Path) -> None:
    import torch

    from data import create_input
    from recipes.config import load_config
    from recipes.distributed import DistInfo
    from recipes.schedule import EpochInfo

    dev = torch.device("cuda", 0)
    batch = 64
    for size in SIZES:
        with guard(rows, f"DALI mixed decode + random-resized-crop {size}px"):
            phase = f"{{epochs: 1, image_size: {size}, batch_size: {batch}}}"
            cfg = load_config(
                ROOT / "configs" / "base.yaml",
                ["data.backend=dali", f"data.root={sample}", "data.workers=4", f"phases=[{phase}]"],
            )
            pipe = create_input(cfg, DistInfo(0, 1, 0, 1, dev))
            info = EpochInfo(0, 0, cfg.phases[0], 0, math.ceil(pipe.num_train / batch))
            n, shape_ok = 0, True
            for i, _batch in enumerate(pipe.train_batches(info)):  # warm-up: the pipeline built, its queue full
                if i == 2:
                    break
            torch.cuda.synchronize()
            t = time.perf_counter()
            for x, _ in pipe.train_batches(info):
                n += x.shape[0]
                shape_ok &= x.is_cuda and x.shape.count(size) >= 2  # NCHW or NHWC, square crops
            torch.cuda.synchronize()
            dt = time.perf_counter() - t
            pipe.close()
            ok = shape_ok and n > 0
            rows.append(
                row(
                    f"DALI mixed decode + random-resized-crop {size}px",
                    "pass" if ok else "fail: shape",
                    n / dt,
                    "images/s",
                    f"{n} images on cuda:0",
                )
            )
    with guard(rows, "DALI mixed rect validation (each image once)"):
        phase = "{epochs: 1, image_size: 128, batch_size: 64, rect_val: true}"
        cfg = load_config(
            ROOT / "configs" / "base.yaml",
            ["data.backend=dali", f"data.root={sample}", "data.workers=4", f"phases=[{phase}]"],
        )
        pipe = create_input(cfg, DistInfo(0, 1, 0, 1, dev))
        t = time.perf_counter()
        n = sum(x.shape[0] for x, _ in pipe.val_batches(cfg.phases[0]))
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        expected = pipe.num_val
        pipe.close()
        rows.append(
            row(
                "DALI mixed rect validation (each image once)",
                "pass" if n == expected else f"fail: counted {n}, expected {expected}",
                n / dt,
                "images/s",
                f"{n} of {expected} val images",
            )
        )


# --- 2. AMP training steps ---------------------------------------------------------------------------------------
def _step_config(amp: str, size: int, batch: int, steps: int, rounds: int, out: Path):
    from recipes.config import load_config

    return load_config(
        None,
        [
            "data.backend=synthetic",
            f"data.synthetic_size={batch * steps}",
            "data.synthetic_classes=1000",
            "model.name=resnet50_tweaked",
            f"run.amp={amp}",
            "run.channels_last=true",
            "optim.name=hybrid",
            "log.tensorboard=false",
            "checkpoint.enabled=false",
            "checkpoint.resume=false",
            f"log.every_steps={steps}",
            f"run.out_dir={out}",
            f"phases=[{{epochs: {rounds + 1}, image_size: {size}, batch_size: {batch}}}]",
        ],
    )


def bare_loop(model, optimizer, criterion, x, y, steps: int, amp_dtype, scaler) -> float:
    """Images/s of a plain autocast forward/backward/step loop; synchronize only around the timed window."""
    import torch

    model.train()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
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
    torch.cuda.synchronize()
    return steps * x.shape[0] / (time.perf_counter() - t)


def check_steps(rows: list[dict], steps: int, work: Path) -> None:
    import statistics

    import torch

    from models import create_model
    from recipes.optim import create_optimizer
    from recipes.steps import create_criterion
    from recipes.trainer import Trainer

    batch, rounds = 256, 3
    for amp in ("fp16", "bf16"):
        for size in (128, 224):
            name = f"train step resnet50_tweaked {amp} {size}px b{batch}"
            with guard(rows, name):
                cfg = _step_config(amp, size, batch, steps, rounds, work / "steps")
                with contextlib.redirect_stdout(sys.stderr):
                    trainer = Trainer(cfg)
                trainer.log.active = False
                dev = trainer.dist.device
                bare_model = create_model(cfg.model, 1000).to(dev).to(memory_format=torch.channels_last)
                bare_opt = create_optimizer(cfg.optim, bare_model)
                x, y = next(iter(trainer.data.train_batches(trainer.plan.epoch_info(0))))
                x = x.to(dev).contiguous(memory_format=torch.channels_last)
                y = y.to(dev)
                dtype = torch.float16 if amp == "fp16" else torch.bfloat16
                scaler = torch.amp.GradScaler("cuda") if amp == "fp16" else None
                criterion = create_criterion(cfg).to(dev)
                bare_loop(bare_model, bare_opt, criterion, x, y, 3, dtype, scaler)
                trainer.train_one_epoch(0)
                bare, ours = [], []
                for r in range(rounds):
                    bare.append(bare_loop(bare_model, bare_opt, criterion, x, y, steps, dtype, scaler))
                    res = trainer.train_one_epoch(r + 1)
                    ours.append(res["images"] / res["seconds"])
                trainer.close()
                b, o = statistics.median(bare), statistics.median(ours)
                rows.append(row(name, "pass", o, "img/s per GPU", NVIDIA_REF if size == 224 else ""))
                rows.append(
                    row(
                        f"trainer overhead vs bare loop ({amp} {size}px)",
                        "pass",
                        100 * (1 - o / b),
                        "%",
                        f"bare loop {b:,.0f} img/s; target <= 3%",
                    )
                )
                del trainer, bare_model, bare_opt
                torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_check.json", help="write the rows as JSON here")
    ap.add_argument("--steps", type=int, default=20, help="timed training steps per round (check 2)")
    ap.add_argument("--work", help="keep the sample data and runs in this folder (default: a temporary one)")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(NO_GPU)
        return 0
    gpus = torch.cuda.device_count()
    tmp = None if args.work else tempfile.TemporaryDirectory(prefix="gpu_check-")
    work = Path(args.work or tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    t0 = time.perf_counter()
    try:
        from data.make_sample import main as make_sample

        sample = work / "sample"
        with contextlib.redirect_stdout(sys.stderr):
            make_sample(["--out", str(sample)])
        with contextlib.redirect_stdout(sys.stderr):
            check_dali(rows, sample)
            check_steps(rows, args.steps, work)
        ckpt = check_e2e(rows, sample, work, gpus)
        with contextlib.redirect_stdout(sys.stderr):
            check_eval(rows, ckpt, sample, work)
    finally:
        report = {
            "gpu": torch.cuda.get_device_name(0),
            "gpus": gpus,
            "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"),
            "seconds": time.perf_counter() - t0,
            "rows": rows,
        }
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(
            f"### GPU check: {report['gpu']} x{gpus}, torch {torch.__version__}, {report['date']}, "
            f"{report['seconds']:.0f} s\n"
        )
        print(markdown_table(rows))
        if tmp is not None:
            tmp.cleanup()
    bad = failed(rows)
    if bad:
        print(f"\n{len(bad)} check(s) failed: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
