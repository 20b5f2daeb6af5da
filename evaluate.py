#!/usr/bin/env python
"""Evaluate a checkpoint: exact top-1/top-5, the DAWNBench batch-1 latency protocol, ONNX export.

Accuracy (every validation image exactly once, any world size):
  python evaluate.py runs/quickstart/checkpoint.pt --data data/sample [--image-size 96] [--tta flip] [--out eval.json]
  torchrun --nproc-per-node 2 evaluate.py CHECKPOINT --data /imagenet/val
Latency (batch size 1, optimize modes compared with eager fp32 on the same images):
  python evaluate.py CHECKPOINT --latency --optimize int8 --price-per-hour 0.5 --out latency.json
Export:
  python evaluate.py CHECKPOINT --export onnx [--export-file model.onnx]
"""

from __future__ import annotations

import argparse
import sys

from base import registry
from recipes.argtypes import OneLineParser
from recipes.evaluation.accuracy import TTA
from recipes.evaluation.cli import run_evaluate_cli
from recipes.evaluation.inference import MODES


def parser() -> OneLineParser:
    """The command line (tests read its numeric flags' bounds)."""
    ap = OneLineParser(prog="evaluate.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="checkpoint.pt written by train.py")
    ap.add_argument("--data", help="dataset root with val/, or the val folder (default: the checkpoint's data.root)")
    ap.add_argument(
        "--image-size",
        type=int,
        help="validation crop size (default: the one the trainer last validated at: the phase of the checkpoint's "
        "last finished epoch; the last phase's for a finished run)",
    )
    ap.add_argument("--out", help="write the results as JSON to this file")
    ap.add_argument(
        "--ema",
        action="store_true",
        help="use the checkpoint's EMA weights (trained with run.ema) instead of the model's",
    )
    acc = ap.add_argument_group("accuracy")
    acc.add_argument("--batch-size", type=int, default=64, help="per-process batch size")
    acc.add_argument(
        "--backend",
        choices=[name for name, r in registry.INPUT_PIPELINES.items() if r.reads_folders],
        help="input pipeline over the images, data.backend (default: the checkpoint's)",
    )
    acc.add_argument(
        "--tta",
        choices=list(TTA),
        default="none",
        help="test-time augmentation: flip = mean of the softmax of the image and its mirror image",
    )
    acc.add_argument(
        "--val-blacklist",
        metavar="FILE",
        help="devkit blacklist whose images are not counted "
        "(default: the checkpoint's data.val_blacklist; '' counts every image)",
    )
    acc.add_argument("--rect", action="store_true", help="rectangular validation (aspect-ratio batches, no crop)")
    lat = ap.add_argument_group("latency (DAWNBench inference protocol)")
    lat.add_argument("--latency", action="store_true", help="measure batch-1 latency per image")
    lat.add_argument(
        "--images",
        type=int,
        default=0,
        help="images to classify (default 0: every validation "
        "image, all 50,000 as DAWNBench's rules say; N: a seeded draw of N)",
    )
    lat.add_argument(
        "--optimize",
        default="none",
        help="comma-separated modes, each compared with eager fp32 "
        "('none'): " + "; ".join(f"{k}: {v.help}" for k, v in MODES.items()),
    )
    lat.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: cuda if available")
    lat.add_argument("--threads", type=int, help="CPU threads (torch and ONNX Runtime; default: all cores)")
    lat.add_argument("--warmup", type=int, default=10, help="untimed runs per mode before timing")
    lat.add_argument("--calib-images", type=int, default=256, help="training images that calibrate int8")
    lat.add_argument("--seed", type=int, default=0, help="which validation images (a seeded draw)")
    lat.add_argument(
        "--price-per-hour",
        type=float,
        help="machine price in USD/hour: adds cost per image",
    )
    lat.add_argument("--hardware", help="hardware description for the DAWNBench entry (default: detected)")
    lat.add_argument("--author", help="the entry's author (default: the checkpoint's dawnbench.author)")
    lat.add_argument(
        "--author-email", help="the entry's authorEmail (default: the checkpoint's dawnbench.author_email)"
    )
    lat.add_argument("--entry", help="write the DAWNBench inference JSON entry (first --optimize mode) here")
    ex = ap.add_argument_group("export")
    ex.add_argument("--export", choices=["onnx"], help="write the model in this format (uint8 image in, logits out)")
    ex.add_argument("--export-file", help="output file (default: the checkpoint's path with .onnx)")
    return ap


def main(argv: list[str] | None = None) -> int:
    return run_evaluate_cli(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
