#!/usr/bin/env python
"""`make bench`: run every benchmark of scripts/bench/ (bench_*.py) and collect their Markdown tables into one report.

python -m scripts.bench.bench [--out bench_report.md] [--quick] [--only trainer,optim]
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

# Started as a file, Python puts only scripts/bench/ on the path: the repository goes first, so the imports
# below (the repository's packages) resolve as they do under `python -m`.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from base.errors import RunDirError
from base.writer import check_target, write_output

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench_report.md")
    ap.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    ap.add_argument("--only", default="", help="comma-separated names (bench_<name>.py)")
    args = ap.parse_args(argv)
    try:
        check_target(args.out, "--out")  # before the benchmarks, not after them
    except RunDirError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    scripts = sorted(HERE.glob("bench_*.py"))
    if args.only:
        wanted = {f"bench_{n.strip()}.py" for n in args.only.split(",")}
        scripts = [s for s in scripts if s.name in wanted]
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    parts = [
        f"# Benchmark report\n\n{time.strftime('%Y-%m-%d %H:%M')}, {platform.processor() or platform.machine()},"
        f" {torch.get_num_threads()} threads, GPU: {gpu}, torch {torch.__version__}\n"
    ]
    failed = []
    for script in scripts:
        cmd = [sys.executable, "-m", f"scripts.bench.{script.stem}"] + (["--quick"] if args.quick else [])
        print(f"running {' '.join(cmd[1:])}", flush=True)
        t = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        took = time.perf_counter() - t
        parts.append(
            f"## {script.name}\n\n`python -m scripts.bench.{script.stem}{' --quick' if args.quick else ''}` "
            f"({took:.0f} s)\n\n{p.stdout.strip()}\n"
        )
        if p.returncode != 0:
            failed.append(script.name)
            parts.append(f"**failed with exit code {p.returncode}:**\n\n```\n{p.stderr[-2000:]}\n```\n")
        print(p.stdout, flush=True)
    write_output(args.out, "\n".join(parts), "--out")
    print(f"report: {args.out}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
