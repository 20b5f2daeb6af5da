#!/usr/bin/env python
"""Write configs/presets/: the record's recipe for each GPU family and cluster shape, labelled with its predicted time.

    python scripts/gen_presets.py            # (re)write the presets
    python scripts/gen_presets.py --check    # exit 1 if a preset differs from what this script writes

A preset `extends:` a record config (1 GPU and 1 x 8: configs/dawnbench_8gpu.yaml, the 8-GPU entry's schedule; 2, 4
and 16 x 8: configs/dawnbench_158s.yaml, the record's) and sets only the cluster shape, the autocast dtype (fp16 on
V100, which has no bf16, and on A100 and H100, where bf16's BatchNorm runs outside cuDNN and was measured slower) and,
where a phase would not fit the GPU's memory (recipes/memory.py), `run.max_gpu_batch_by_size`: for that phase's image
size only, the largest power-of-two micro-batch that fits, so that phase accumulates gradients and keeps the recipe's
global batch while the phases that fit run whole. Its header gives the time model's predicted training clock
(recipes/timemodel/, calibrated on the published Alibaba runs; accumulated micro-batches counted against the step
floor) and a cost per run: predicted wall-clock hours x GPUs x PRICE_PER_GPU_HOUR. Generated, so the labels never
drift from the model.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from recipes import memory  # noqa: E402
from recipes.config import load_config  # noqa: E402
from recipes.schedule import Schedule  # noqa: E402
from recipes.timemodel import IMAGENET_TRAIN_IMAGES, predicted_seconds  # noqa: E402

OUT = ROOT / "configs" / "presets"
# family -> (GPU name in recipes/memory.py and recipes/timemodel/, run.amp, what the reader is told)
FAMILIES = {
    "v100": ("v100-32gb", "fp16", "V100 32 GB (the record's GPU), fp16: V100 tensor cores have no bf16"),
    "a100": (
        "a100",
        "fp16",
        "A100 80 GB, fp16: PyTorch runs bf16 BatchNorm in its native kernels, fp16 in cuDNN's, which made fp16 1.24x "
        "bf16's rate at 224 px on an H200 (docs/gpu.md); not measured on an A100",
    ),
    "h100": (
        "h100",
        "fp16",
        "H100 80 GB, fp16: 1.24x bf16's rate at 224 px and 1.10x at 128 px for this trainer on an H200, the same "
        "Hopper die (docs/gpu.md)",
    ),
}
# name -> (nodes, GPUs per node, the record config it extends)
SHAPES = {
    "1gpu": (1, 1, "dawnbench_8gpu.yaml"),
    "1x8": (1, 8, "dawnbench_8gpu.yaml"),
    "2x8": (2, 8, "dawnbench_158s.yaml"),
    "4x8": (4, 8, "dawnbench_158s.yaml"),
    "16x8": (16, 8, "dawnbench_158s.yaml"),
}
# family -> (instance, USD per instance-hour, its GPUs): AWS on-demand list prices in us-east-1, copied with their
# source in tests/data/published/aws_ec2_on_demand_gpu_prices.json (the P4 and P5 prices since AWS's June 2025
# reduction). An assumption: edit for your provider.
INSTANCE_PRICES = {
    "v100": ("p3dn.24xlarge", 31.212, 8),
    "a100": ("p4de.24xlarge", 27.44705, 8),
    "h100": ("p5.48xlarge", 55.04, 8),
}
PRICE_PER_GPU_HOUR = {family: usd / gpus for family, (_, usd, gpus) in INSTANCE_PRICES.items()}


def preset_name(family: str, shape: str) -> str:
    return f"{family}_{shape}"


def overrides(family: str, shape: str, caps: dict[int, int] | None = None) -> list[str]:
    nodes, gpus, _ = SHAPES[shape]
    # run.name: each preset trains into its own runs/<preset>, never into the record's directory (which it would
    # resume); run.gpu and run.amp: predict.py and --plan predict for the GPU and dtype the preset is written for.
    out = [f"run.name={preset_name(family, shape)}", f"run.nodes={nodes}", f"run.procs_per_node={gpus}"]
    out += [f"run.gpu={FAMILIES[family][0]}", f"run.amp={FAMILIES[family][1]}"]
    if caps:
        out.append(f"run.max_gpu_batch_by_size={{{', '.join(f'{s}: {c}' for s, c in sorted(caps.items()))}}}")
    return out


def load(family: str, shape: str, caps: dict[int, int] | None = None):
    return load_config(str(ROOT / "configs" / SHAPES[shape][2]), overrides(family, shape, caps))


def _plan(cfg, world: int) -> Schedule:
    return Schedule(
        cfg.phases, cfg.optim, num_images=IMAGENET_TRAIN_IMAGES, world_size=world, **memory.accumulation(cfg)
    )


def fitting_caps(family: str, shape: str) -> dict[int, int]:
    """Per image size whose phase would not fit the GPU as it is: the largest power-of-two micro-batch that fits
    (run.max_gpu_batch_by_size). Only those phases accumulate; every other keeps its whole per-GPU batch."""
    gpu = FAMILIES[family][0]
    nodes, gpus, _ = SHAPES[shape]
    world, gpu_bytes = nodes * gpus, memory.gpu_memory_bytes(gpu)
    cfg = load(family, shape)
    caps: dict[int, int] = {}
    for phase in cfg.phases:
        per_gpu, size = phase.batch_size // world, phase.image_size
        fits = memory.largest_micro_batch(
            cfg.model.name, image_size=size, per_gpu_batch=per_gpu, amp=cfg.run.amp, gpu_bytes=gpu_bytes
        )
        if fits >= per_gpu:
            continue
        if fits < 1:
            raise SystemExit(
                f"{preset_name(family, shape)}: not even one image per micro-batch fits {gpu} at {size} px"
            )
        cap = 1 << (fits.bit_length() - 1)
        caps[size] = min(caps.get(size, cap), cap)
    cfg = load(family, shape, caps)
    problems = memory.check_fits(cfg, _plan(cfg, world), gpu_bytes, gpu)
    if problems:  # the caps are the memory model's own answer: a disagreement is a bug here
        raise SystemExit(f"{preset_name(family, shape)}: {problems[0]}")
    return caps


def prediction(family: str, shape: str, caps: dict[int, int]) -> dict:
    """The time model's training clock and wall clock (low, mid, high seconds), or why there is none."""
    nodes, gpus, _ = SHAPES[shape]
    cfg = load(family, shape, caps)
    train, what = predicted_seconds(cfg, nodes * gpus, FAMILIES[family][0])
    if train is None:
        return {"why": what}
    wall, _ = predicted_seconds(cfg, nodes * gpus, FAMILIES[family][0], clock="wall")
    cost = wall[1] / 3600 * nodes * gpus * PRICE_PER_GPU_HOUR[family]
    return {"train": train, "wall": wall, "what": what, "cost": cost}


def _min(seconds: float) -> str:
    """Minutes, coarse enough that the time model's CPU-measured gradient timings do not change the label."""
    m = seconds / 60
    return f"{m:.1f}" if m < 10 else f"{m:.0f}"


def command(family: str, shape: str, data: str = "/data/imagenet") -> str:
    """How to train the preset (the README's table uses the same)."""
    nodes, gpus, _ = SHAPES[shape]
    cfg = f"configs/presets/{preset_name(family, shape)}.yaml"
    if nodes * gpus == 1:
        return f"python train.py -c {cfg} data.root={data}"
    if nodes == 1:
        return f"torchrun --nproc-per-node {gpus} train.py -c {cfg} data.root={data}"
    return f"python scripts/launch.py --hostfile hosts.txt -c {cfg} data.root={data}"


def text(family: str, shape: str, caps: dict[int, int], p: dict) -> str:
    """The preset file: header (what, how to run, the prediction) and the keys it sets."""
    nodes, gpus, base = SHAPES[shape]
    lines = [
        f"# {FAMILIES[family][2]}; {nodes} x {gpus} GPU{'s' if nodes * gpus > 1 else ''}.",
        "# Generated by scripts/gen_presets.py (do not edit; rerun it). Run: " + command(family, shape),
    ]
    if nodes > 1:  # before the hosts are asked for: what would run on each, and every check that would stop it
        lines.append(f"# Plan first (runs nothing): {command(family, shape)} --plan")
    if "why" in p:
        lines.append(f"# predicted: none ({p['why']})")
    else:
        low, mid, high = p["train"]
        price = PRICE_PER_GPU_HOUR[family]
        lines += [
            f"# predicted training clock {_min(mid)} min ({_min(low)}-{_min(high)}), wall clock {_min(p['wall'][1])} "
            f"min, cost ${p['cost']:.0f} per run at ${price:.2f} per GPU-hour",
            f"# (recipes/timemodel/: {p['what']}; predicted, not measured)",
        ]
    if caps:
        lines.append(
            "# run.max_gpu_batch_by_size: the phases at these sizes do not fit whole and accumulate gradients "
            "(recipes/memory.py; docs/recipe.md)"
        )
    lines.append(f"extends: ../{base}")
    lines.append("run:")
    for o in overrides(family, shape, caps):
        key, value = o.split("=", 1)
        lines.append(f"  {key.removeprefix('run.')}: {value}")
    # The Run line above starts as written: a preset is the record's recipe on other hardware, a first run rather
    # than a submission, so it does not refuse to start without the entry's author (the record configs and their
    # make targets do). Its entry is written all the same; dawnbench.author=... fills it.
    lines += ["dawnbench:", "  require: false  # ours: a preset's run is not a submission (set dawnbench.author=...)"]
    return "\n".join(lines) + "\n"


NUMBER = re.compile(r"\d+(?:\.\d+)?")
TOLERANCE = 0.10  # of a predicted number: the time model's gradient-ready timings are measured on this CPU


def same(old: str, new: str) -> bool:
    """Equal, but for the predicted numbers, which may differ by TOLERANCE (a stale model or config differs more)."""
    a, b = old.splitlines(), new.splitlines()
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if not x.startswith(("# predicted training clock", "| ")):
            if x != y:
                return False
            continue
        nx, ny = [float(n) for n in NUMBER.findall(x)], [float(n) for n in NUMBER.findall(y)]
        if NUMBER.sub("#", x) != NUMBER.sub("#", y) or len(nx) != len(ny):
            return False
        if any(abs(u - v) > TOLERANCE * max(abs(u), abs(v)) + 0.1 for u, v in zip(nx, ny, strict=True)):
            return False
    return True


README = ROOT / "README.md"
BEGIN, END = "<!-- presets: scripts/gen_presets.py writes this table -->", "<!-- presets end -->"


def readme_table(predictions: dict) -> str:
    """The README's "Run on what you have" table: one row per V100/A100 preset, each with its command."""
    rows = [
        BEGIN,
        "| GPUs | preset | predicted training clock | predicted cost per run | command |",
        "|---|---|---|---|---|",
    ]
    for (family, shape), p in predictions.items():
        if "why" in p:
            continue
        nodes, gpus, _ = SHAPES[shape]
        low, mid, high = p["train"]
        rows.append(
            f"| {nodes} x {gpus} {FAMILIES[family][0]} | `{preset_name(family, shape)}` | {_min(mid)} min "
            f"({_min(low)}-{_min(high)}) | ${p['cost']:.0f} | `{command(family, shape)}` |"
        )
    return "\n".join([*rows, END])


def readme_with(table: str) -> str:
    text = README.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{README}: the markers {BEGIN} ... {END} are missing")
    head, rest = text.split(BEGIN, 1)
    return head + table + rest.split(END, 1)[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with configs/presets/ instead of writing")
    args = ap.parse_args(argv)
    stale = []
    OUT.mkdir(parents=True, exist_ok=True)
    predictions = {}
    for family in FAMILIES:
        for shape in SHAPES:
            path = OUT / f"{preset_name(family, shape)}.yaml"
            caps = fitting_caps(family, shape)
            predictions[family, shape] = prediction(family, shape, caps)
            want = text(family, shape, caps, predictions[family, shape])
            if args.check:
                if not path.is_file() or not same(path.read_text(), want):
                    stale.append(str(path.relative_to(ROOT)))
            else:
                path.write_text(want)
                print(f"wrote {path.relative_to(ROOT)}")
    made = {f"{preset_name(family, shape)}.yaml" for family in FAMILIES for shape in SHAPES}
    extra = sorted(p.name for p in OUT.iterdir() if p.name not in made)
    if extra and args.check:  # a preset this script does not write is stale too: its labels would never be updated
        stale += [f"{OUT.relative_to(ROOT)}/{name} (not written by this script: remove it)" for name in extra]
    readme = readme_with(readme_table(predictions))
    if args.check:
        if not same(README.read_text(), readme):
            stale.append("README.md")
    else:
        README.write_text(readme)
        print("wrote README.md (the presets table)")
    if stale:
        print(f"stale presets (run scripts/gen_presets.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
