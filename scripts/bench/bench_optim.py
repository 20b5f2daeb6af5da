#!/usr/bin/env python
"""Optimizer step time on ResNet-50's parameters with random gradients, against torch.optim.SGD(foreach=True).

    python -m scripts.bench.bench_optim            # 20 timed steps per optimizer
    python -m scripts.bench.bench_optim --quick    # 5 timed steps per optimizer
    python -m scripts.bench.bench_optim --json docs/data/bench_optim-DATE.json   # and every step's time

Every optimizer steps the same parameters (the record's resnet50_tweaked, with its two parameter groups) with
fixed random gradients; steps are interleaved round-robin so that a slow moment of the machine hits all of them
alike. Prints a Markdown table; the baseline is measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Started as a file, Python puts only scripts/bench/ on the path: the repository goes first, so the imports
# below (the repository's packages) resolve as they do under `python -m`.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from base import registry
from recipes.config import load_config
from scripts.bench.record import add_json_arg, check_json, write_json

ROOT = Path(__file__).resolve().parents[2]
# The record's optimizer settings (configs/dawnbench_158s.yaml); a small LR keeps repeated steps finite.
RECORD = [
    "optim.lr=1.0e-3",
    "optim.momentum=0.9",
    "optim.weight_decay=1.0e-4",
    "optim.eta=8.0e-4",
    "optim.trust_clip_min=1.0e-5",
    "optim.trust_clip_max=1.0",
    "optim.nesterov=true",
]


def build(device: torch.device, model_name: str):
    import torch
    from timm.optim import Lars

    from models import create_model
    from recipes.optim import create_optimizer, param_groups

    torch.manual_seed(0)
    cfg = load_config(ROOT / "configs" / "base.yaml", [f"model.name={model_name}", *RECORD])
    model = create_model(cfg.model, 1000).to(device)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-2
    optimizers = {
        "torch.optim.SGD(foreach=True) (baseline)": torch.optim.SGD(
            model.parameters(), lr=1e-3, momentum=0.9, nesterov=True, weight_decay=1e-4, foreach=True
        ),
        "torch.optim.SGD(foreach=False)": torch.optim.SGD(
            model.parameters(), lr=1e-3, momentum=0.9, nesterov=True, weight_decay=1e-4, foreach=False
        ),
    }
    for name in registry.OPTIMIZERS:
        optimizers[f"optim.name={name}"] = create_optimizer(
            load_config(None, [f"optim.name={name}", *RECORD]).optim, model
        )
    # What a per-tensor Python loop costs: timm's LARS in its single-tensor mode, same groups as ours.
    groups = param_groups(model, 1e-4, no_bn_decay=True)
    optimizers["timm Lars(foreach=False): per-tensor loop"] = Lars(
        [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in groups],
        lr=1e-3,
        momentum=0.9,
        nesterov=True,
        trust_coeff=8e-4,
        foreach=False,
    )
    return model, optimizers


def measure(optimizers: dict, device: torch.device, warmup: int, steps: int) -> dict[str, list[float]]:
    import torch

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for opt in optimizers.values():
        for _ in range(warmup):
            opt.step()
    times: dict[str, list[float]] = {k: [] for k in optimizers}
    names = list(optimizers)
    for r in range(steps):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate: no optimizer always goes first
            opt = optimizers[name]
            sync()
            t0 = time.perf_counter()
            opt.step()
            sync()
            times[name].append(time.perf_counter() - t0)
    return times


def verdict(ratio: float) -> str:
    """The hybrid step's target: at most 1.5x torch's SGD(foreach=True) step, medians measured in the same run."""
    return f"target <= 1.5x: {'met' if ratio <= 1.5 else 'NOT met'}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="5 timed steps per optimizer instead of 20")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per optimizer")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--model", default="resnet50_tweaked", help="whose parameters to step (models/factory.py)")
    add_json_arg(ap)
    args = ap.parse_args(argv)
    check_json(args.json)
    steps = args.steps or (5 if args.quick else 20)
    import torch  # here, after the arguments: `--help` starts in a fraction of a second

    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    model, optimizers = build(device, args.model)
    warmup = 1 if args.quick else 2
    times = measure(optimizers, device, warmup=warmup, steps=steps)
    params = list(model.parameters())
    where = torch.cuda.get_device_name(device) if use_cuda else f"CPU, {torch.get_num_threads()} threads"
    print(
        f"### Optimizer step time: {args.model} parameters ({len(params)} tensors, "
        f"{sum(p.numel() for p in params) / 1e6:.1f} M values), {where}, torch {torch.__version__}\n"
    )
    print(
        f"{steps} steps each, interleaved in rotating order, after {warmup} warm-up step(s); random gradients; "
        "`python -m scripts.bench.bench_optim" + (" --quick`" if args.quick else "`") + ".\n"
    )
    base_ts = times["torch.optim.SGD(foreach=True) (baseline)"]
    base, base_min = statistics.median(base_ts), min(base_ts)
    print("| optimizer | median ms/step | vs baseline | min ms/step | vs baseline (min) |")
    print("|---|---:|---:|---:|---:|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med * 1e3:.2f} | {med / base:.2f}x | {min(ts) * 1e3:.2f} | {min(ts) / base_min:.2f}x |")
    ratio = statistics.median(times["optim.name=hybrid"]) / base
    print(f"\nhybrid / SGD(foreach=True), medians: {ratio:.2f}x ({verdict(ratio)})")
    results = {
        "model": args.model,
        "tensors": len(params),
        "values": sum(p.numel() for p in params),
        "device": where,
        "warmup": warmup,
        "steps": steps,
        "step_s": times,  # every timed step's seconds per optimizer, in the order they ran
    }
    write_json(args.json, "scripts.bench.bench_optim", argv, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
