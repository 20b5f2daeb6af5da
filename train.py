#!/usr/bin/env python
"""Train from a YAML config:  python train.py -c configs/quickstart.yaml [key=value ...]

Run under torchrun for several processes:  torchrun --nproc-per-node 2 train.py -c configs/quickstart.yaml
"""

from __future__ import annotations

import argparse
import sys

from recipes.argtypes import OneLineParser, bounded_int
from recipes.cli import run_cli
from recipes.memory import GPU_MEMORY_GIB


def parser() -> OneLineParser:
    """The command line (tests read its numeric flags' bounds)."""
    ap = OneLineParser(prog="train.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", help="YAML config file (may 'extends:' another)")
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. optim.lr=0.4")
    ap.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    ap.add_argument("--help-config", action="store_true", help="print every config key with default and meaning")
    ap.add_argument("--plan", action="store_true", help="print the phase table and iteration count, then exit")
    ap.add_argument(
        "--num-images", type=bounded_int(1, 10**9), default=None, help="--plan: training set size (default: scan data)"
    )
    ap.add_argument("--world-size", type=bounded_int(1, 1_048_576), default=None, help="--plan: number of processes")
    ap.add_argument(
        "--gpu",
        default=None,
        choices=list(GPU_MEMORY_GIB),
        help="--plan: per-GPU batch, accumulation and estimated memory on this GPU (default: the config's run.gpu), "
        "and the time model's prediction where it has the GPU's rates",
    )
    ap.add_argument("--run-dir", help="run directory (default: <run.out_dir>/<run.name>)")
    ap.add_argument(
        "--resume",
        nargs="?",
        const="auto",
        default=None,
        metavar="CHECKPOINT",
        help="continue from CHECKPOINT (default: the run directory's checkpoint.pt)",
    )
    ap.add_argument(
        "--stop-after-epochs",
        type=bounded_int(1, 10_000),
        default=None,
        metavar="N",
        help="stop after N epochs of this invocation (rerun to continue)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    return run_cli(parser().parse_intermixed_args(argv))


if __name__ == "__main__":
    sys.exit(main())
