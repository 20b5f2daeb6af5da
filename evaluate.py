#!/usr/bin/env python
"""Evaluate a checkpoint: top-1/top-5 over every validation image exactly once (any world size).

python evaluate.py runs/quickstart/checkpoint.pt --data data/sample [--image-size 96] [--out eval.json]
torchrun --nproc-per-node 2 evaluate.py CHECKPOINT --data /imagenet
"""

from __future__ import annotations

import argparse
import sys

from recipes.evaluation import run_evaluate_cli


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="checkpoint.pt written by train.py")
    ap.add_argument("--data", help="dataset root with val/ (default: the checkpoint's data.root)")
    ap.add_argument("--image-size", type=int, help="validation crop size (default: the last phase's)")
    ap.add_argument("--batch-size", type=int, default=64, help="per-process batch size")
    ap.add_argument("--backend", choices=["torch", "dali"], help="input backend (default: the checkpoint's)")
    ap.add_argument("--out", help="write the results as JSON to this file")
    return run_evaluate_cli(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
