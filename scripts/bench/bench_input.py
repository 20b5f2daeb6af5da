#!/usr/bin/env python
"""Input pipeline throughput: DALI against torchvision, against the decode-only ceiling, full size and pre-resized.

    python -m scripts.bench.bench_input [--data DIR] [--threads 2] [--rounds 5] [--quick] [--json PATH]

All contenders read the same folder of JPEGs (default: 1500 images generated into data/sample_bench, and its
--short-side 160 copy made with data/prepare.py) with the same number of CPU threads (DALI threads, DataLoader
worker processes, decode threads). A measurement is one epoch (every image once) as the trainer runs it: a running
DALI pipeline (built once per phase; its prefetch queue full at both ends), a new DataLoader for torch (workers
started every epoch), so no prefetched batch counts as free. Each round runs every contender
once, in a rotated order, so that a noisy neighbour hurts them alike; the table gives medians over the rounds.
"CPU ms/img" is the CPU time of the process and its DataLoader workers per image: how much work a pipeline does,
whatever else the machine runs. A second table profiles DALI's CPU stages, a third times the header scan the DALI
backend runs before its first pipeline (data/check.py check_headers). On a machine with a GPU a fourth table
measures DALI's mixed (nvJPEG) decoding feeding the GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

# Started as a file, Python puts only scripts/bench/ on the path: the repository goes first, so the imports
# below (the repository's packages) resolve as they do under `python -m`.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from base import registry
from data import create_input
from data.check import check_headers
from data.folder import scan_split
from data.make_sample import main as make_sample
from data.prepare import main as prepare_main
from recipes.config import load_config
from recipes.distributed import DistInfo
from recipes.schedule import EpochInfo
from scripts.bench.record import add_json_arg, check_json, write_json

ROOT = Path(__file__).resolve().parents[2]

BATCH = 64
PIL_MAX_IMAGE_PIXELS = 89_478_485  # data.max_image_pixels' default


def cpu_seconds() -> float:
    """CPU time of this process (all threads), of its reaped children and of its live children (DataLoader workers)."""
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    me, tick = str(os.getpid()), os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended meanwhile
        if fields[1] == me:  # ppid; utime and stime are fields 14 and 15 of /proc/<pid>/stat
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def ensure_data(args) -> tuple[Path, Path]:
    data = Path(args.data) if args.data else ROOT / "data" / "sample_bench"
    if args.data is None:
        info = data / "sample.json"
        if not info.is_file() or json.loads(info.read_text())["train"] != 10 * args.per_class:
            make_sample(
                [
                    "--out",
                    str(data),
                    "--classes",
                    "10",
                    "--train-per-class",
                    str(args.per_class),
                    "--val-per-class",
                    "1",
                ]
            )
    elif not (data / "train").is_dir():
        sys.exit(f"error: --data {data}: no train/ folder")
    small = Path(f"{data}-160")
    if prepare_main(["--src", str(data), "--dst", str(small), "--short-side", "160", "--workers", str(args.threads)]):
        sys.exit("error: data/prepare.py failed")
    return data, small


class Meter:
    """Wall and CPU time from a cold start (building the pipeline) to the last image of one epoch."""

    def __enter__(self):
        self.t, self.c, self.images = time.perf_counter(), cpu_seconds(), 0
        return self

    def __exit__(self, *exc):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.wall, self.cpu = time.perf_counter() - self.t, cpu_seconds() - self.c

    def result(self) -> tuple[float, float]:
        """(images/s, CPU ms per image)"""
        return self.images / self.wall, 1000 * self.cpu / self.images


def standalone_input(overrides: list[str], device: torch.device):
    """(config, input pipeline) of configs/base.yaml with `overrides`, for one process on `device`."""
    cfg = load_config(ROOT / "configs" / "base.yaml", overrides)
    pipe = create_input(
        cfg.data,
        DistInfo(0, 1, 0, 1, device),
        phases=cfg.phases,
        seed=cfg.run.seed,
        channels_last=cfg.run.channels_last,
        amp=cfg.run.amp,
    )
    return cfg, pipe


def pipeline_run(backend: str, size: int, args, device: torch.device, copy: Path | None = None) -> tuple[float, float]:
    """The project's own pipeline (create_input), reading the full-size data or, as a phase would, the copy."""
    phase = f"{{epochs: 1, image_size: {size}, batch_size: {BATCH}, root: {'small' if copy else 'full'}}}"
    overrides = [
        f"data.backend={backend}",
        f"data.root={args.data_root}",
        f"data.workers={args.threads}",
        f"phases=[{phase}]",
        "run.seed=1",
    ] + ([f"data.roots={{small: {copy}}}"] if copy else [])
    cfg, pipe = standalone_input(overrides, device)
    info = EpochInfo(0, 0, cfg.phases[0], 0, math.ceil(pipe.num_train / BATCH))  # every image once
    if registry.INPUT_PIPELINES[backend].streams_epochs:
        # The trainer builds such a pipeline (DALI) once per phase and then streams epoch after epoch: measure an epoch
        # of a running pipeline (its prefetch queue is full at both ends). The torch backend starts a new
        # DataLoader every epoch, so its measured epoch includes starting the workers, as in training.
        for i, _ in enumerate(pipe.train_batches(info)):
            if i == 3:
                break
    with Meter() as m:
        for x, _ in pipe.train_batches(info):
            m.images += x.shape[0]
    pipe.close()
    return m.result()


def dali_decode_only(root: Path, args) -> tuple[float, float]:
    from nvidia.dali import fn, pipeline_def, types

    split = scan_split(root, "train")

    @pipeline_def(batch_size=BATCH, num_threads=args.threads, device_id=None, seed=1)
    def graph():
        jpegs, _ = fn.readers.file(files=split.files, shuffle_after_epoch=True)
        return fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)

    pipe = graph()
    pipe.build()
    for _ in range(3):
        pipe.run()
    with Meter() as m:
        for _ in range(math.ceil(len(split) / BATCH)):
            (images,) = pipe.run()
            m.images += len(images)
    del pipe
    return m.result()


def pil_decode_only(root: Path, args) -> tuple[float, float]:
    from data.transforms import load_rgb

    files = scan_split(root, "train").files
    with Meter() as m, ThreadPoolExecutor(args.threads) as pool:
        for start in range(0, len(files), BATCH):
            m.images += len(list(pool.map(load_rgb, files[start : start + BATCH])))
    return m.result()


def stage_table(data: Path, args) -> tuple[str, dict]:
    """Where the CPU time of DALI's CPU pipeline goes: each stage added in turn, 1 thread, CPU ms per image."""
    from nvidia.dali import fn, pipeline_def, types

    from data.transforms import IMAGENET_MEAN, IMAGENET_STD

    files = scan_split(data, "train").files

    def cost(body) -> float:
        @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, seed=1)
        def graph():
            jpegs, _ = fn.readers.file(files=files, shuffle_after_epoch=True)
            return body(jpegs)

        pipe = graph()
        pipe.build()
        for _ in range(2):
            pipe.run()
        steps = max(2, len(files) // BATCH // 2)
        c0 = cpu_seconds()
        for _ in range(steps):
            pipe.run()
        return 1000 * (cpu_seconds() - c0) / (steps * BATCH)

    def crop(j):
        return fn.decoders.image_random_crop(j, device="cpu", random_area=[0.35, 1.0], adjust_orientation=False)

    def stages(size: int) -> list:
        def resize(j, **kw):
            return fn.resize(crop(j), resize_x=size, resize_y=size, **kw)

        def full(j):
            return fn.crop_mirror_normalize(
                resize(j),
                dtype=types.FLOAT,
                output_layout="CHW",
                mean=list(IMAGENET_MEAN),
                std=list(IMAGENET_STD),
                mirror=fn.random.coin_flip(),
            )

        return [
            ("decode the whole image", lambda j: fn.decoders.image(j, device="cpu")),
            ("decode the random crop only (fused)", crop),
            ("+ resize, bilinear with antialias", resize),
            ("+ resize, nearest neighbour (for scale)", lambda j: resize(j, interp_type=types.INTERP_NN)),
            ("+ resize (bilinear) + flip + normalize", full),
        ]

    rows = ["| stage (DALI CPU operators, 1 thread) | CPU ms/img at 128 px | CPU ms/img at 224 px |", "|---|---:|---:|"]
    costs = {}
    for (name, body128), (_, body224) in zip(stages(128), stages(224), strict=True):
        costs[name] = {"128": cost(body128), "224": cost(body224)}
        rows.append(f"| {name} | {costs[name]['128']:.2f} | {costs[name]['224']:.2f} |")
    return "\n".join(rows) + "\n", costs


def scan_table(data: Path, args) -> tuple[str, list[float]]:
    """Microseconds per file of the DALI backend's header scan (check_headers, one rank) over the full-size files,
    page cache warm: one pass per round, the median of the rounds."""
    files = scan_split(data, "train").files
    check_headers(files, PIL_MAX_IMAGE_PIXELS, args.threads, 0, 1)  # warm the page cache
    per_file = []
    for _ in range(args.rounds):
        t = time.perf_counter()
        bad = check_headers(files, PIL_MAX_IMAGE_PIXELS, args.threads, 0, 1)
        per_file.append(1e6 * (time.perf_counter() - t) / len(files))
        if bad:
            sys.exit(f"error: the header scan refused {bad[0][0]}: {bad[0][1]}")
    text = (
        f"Header scan (check_headers), {len(files)} files, {args.threads} threads, page cache warm: median "
        f"{statistics.median(per_file):.0f} us per file over {args.rounds} passes (min {min(per_file):.0f}).\n"
    )
    return text, per_file


def run_rounds(contenders: dict, rounds: int, raw: dict | None = None) -> dict:
    """Medians, min and max of images/s and the median CPU ms/img per contender; `raw` gets every round's pair."""
    results = {name: [] for name in contenders} if raw is None else raw
    results.update({name: [] for name in contenders})
    names = list(contenders)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            results[name].append(contenders[name]())
        print(f"round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    return {
        name: (
            statistics.median(v[0] for v in vals),
            min(v[0] for v in vals),
            max(v[0] for v in vals),
            statistics.median(v[1] for v in vals),
        )
        for name, vals in results.items()
    }


def dataset_line(root: Path) -> str:
    from PIL import Image

    files = scan_split(root, "train").files
    pixels = 0
    for f in files[:: max(1, len(files) // 100)]:
        with Image.open(f) as img:
            pixels += img.width * img.height
    sample = len(files[:: max(1, len(files) // 100)])
    kb = sum(os.path.getsize(f) for f in files) / len(files) / 1024
    return f"{len(files)} JPEGs, {kb:.0f} KB and {pixels / sample / 1e3:.0f} kpixels on average"


def cpu_table(data: Path, small: Path, args, raw: dict) -> str:
    cpu = torch.device("cpu")
    c = {
        "decode only (DALI, libjpeg-turbo)": lambda: dali_decode_only(data, args),
        "decode only (PIL)": lambda: pil_decode_only(data, args),
        "dali 128": lambda: pipeline_run("dali", 128, args, cpu),
        "torch 128": lambda: pipeline_run("torch", 128, args, cpu),
        "dali 224": lambda: pipeline_run("dali", 224, args, cpu),
        "torch 224": lambda: pipeline_run("torch", 224, args, cpu),
        "dali 128 pre-resized": lambda: pipeline_run("dali", 128, args, cpu, small),
        "torch 128 pre-resized": lambda: pipeline_run("torch", 128, args, cpu, small),
        "decode only pre-resized (DALI)": lambda: dali_decode_only(small, args),
    }
    res = run_rounds(c, args.rounds, raw)
    ceiling = max(res["decode only (DALI, libjpeg-turbo)"][0], res["decode only (PIL)"][0])
    small_ceiling = res["decode only pre-resized (DALI)"][0]
    ceiling_cpu = min(res["decode only (DALI, libjpeg-turbo)"][3], res["decode only (PIL)"][3])
    small_ceiling_cpu = res["decode only pre-resized (DALI)"][3]
    rows = [
        "| pipeline | images/s (median) | min - max | CPU ms/img | vs torchvision | % of ceiling (images/s) "
        "| % of ceiling (CPU/img) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, (med, lo, hi, cpu_ms) in res.items():
        vs = ""
        if name.startswith("dali"):
            vs = f"{med / res[name.replace('dali', 'torch')][0]:.2f}x"
        small_files = "pre-resized" in name
        pct = f"{100 * med / (small_ceiling if small_files else ceiling):.0f}%"
        pct_cpu = f"{100 * (small_ceiling_cpu if small_files else ceiling_cpu) / cpu_ms:.0f}%"
        rows.append(f"| {name} | {med:.0f} | {lo:.0f} - {hi:.0f} | {cpu_ms:.2f} | {vs} | {pct} | {pct_cpu} |")

    def ratios(i: int, invert: bool) -> str:
        def r(a: str, b: str) -> str:
            x, y = res[a][i], res[b][i]
            return f"**{(y / x if invert else x / y):.2f}x**"

        small = r("dali 128 pre-resized", "dali 128")
        return (
            f"pre-resized 128 px phase vs full size (DALI) {small}; DALI vs torchvision "
            f"{r('dali 128', 'torch 128')} at 128 px, {r('dali 224', 'torch 224')} at 224 px"
        )

    return (
        f"CPU, {args.threads} threads each, batch {BATCH}, median of {args.rounds} alternating rounds of one epoch each"
        f"; full size: {dataset_line(data)}; pre-resized (--short-side 160): {dataset_line(small)}."
        f" The ceiling is decode-only of the same files (the copy's for pre-resized rows): the faster decoder in"
        f" images/s, the cheaper in CPU time per image.\n\n"
        + "\n".join(rows)
        + f"\n\nBy images/s: {ratios(0, False)}.\nBy CPU time per image: {ratios(3, True)}.\n"
    )


def gpu_table(data: Path, small: Path, args) -> str:
    gpu = torch.device("cuda", 0)
    c = {
        "dali mixed (nvJPEG) 224": lambda: pipeline_run("dali", 224, args, gpu),
        "torch 224 (CPU decode, to GPU)": lambda: pipeline_run("torch", 224, args, gpu),
        "dali mixed (nvJPEG) 128 pre-resized": lambda: pipeline_run("dali", 128, args, gpu, small),
    }
    res = run_rounds(c, args.rounds)
    rows = ["| pipeline (to the GPU) | images/s (median) | min - max | CPU ms/img |", "|---|---:|---:|---:|"]
    rows += [f"| {n} | {m:.0f} | {lo:.0f} - {hi:.0f} | {c_ms:.1f} |" for n, (m, lo, hi, c_ms) in res.items()]
    return f"GPU: {torch.cuda.get_device_name(0)}, {args.threads} CPU threads each\n\n" + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="dataset root with train/ (default: generate data/sample_bench)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (workers) for every contender")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--per-class", type=int, default=150, help="generated data: training images per class (10)")
    ap.add_argument("--quick", action="store_true", help="2 rounds")
    add_json_arg(ap)
    args = ap.parse_args(argv)
    check_json(args.json)
    if args.quick:
        args.rounds = 2
    torch.set_num_threads(args.threads)
    data, small = ensure_data(args)
    args.data_root = data
    raw: dict = {}
    print(cpu_table(data, small, args, raw))
    stages_text, stages = stage_table(data, args)
    print(stages_text)
    scan_text, scan = scan_table(data, args)
    print(scan_text)
    if torch.cuda.is_available():
        print(gpu_table(data, small, args))
    results = {
        "threads": args.threads,
        "rounds": args.rounds,
        "batch": BATCH,
        "data": {"full": dataset_line(data), "pre-resized": dataset_line(small)},
        # every round's (images/s, CPU ms per image) per contender, in round order
        "pipelines": {name: [list(v) for v in vals] for name, vals in raw.items()},
        "stages_cpu_ms": stages,
        "header_scan_us_per_file": scan,
    }
    write_json(args.json, "scripts.bench.bench_input", argv, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
