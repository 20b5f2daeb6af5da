"""Pre-flight: what every host has (GPUs, driver, library versions, data, free disk), compared before any rank starts.

Each host runs `python scripts/launcher/preflight.py ARGS` (through the transport, all hosts at once) and prints one
`launch-preflight: {json}` line: its `recipes.environment.collect()`, the image count of every data directory, the
blacklist file, and the free space where the run directory will be. The launcher then `assess()`es the reports
together: one line per host, problems named with their host, and a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

MARK = "launch-preflight:"
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
# ImageNet-1k (ILSVRC2012) as published: the counts a 1000-class folder tree is held to.
IMAGENET_IMAGES = {"train": 1_281_167, "val": 50_000}


# ---------------------------------------------------------------------------------------------------------
# On each host.


def count_images(path: Path) -> tuple[int, int] | None:
    """(class folders, images) of a folder-layout split (`<class>/*.JPEG`); None when it cannot be read."""
    classes = images = 0
    try:
        with os.scandir(path) as top:
            for d in top:
                if not d.is_dir():
                    continue
                classes += 1
                with os.scandir(d.path) as files:
                    images += sum(1 for f in files if f.name.lower().endswith(IMAGE_SUFFIXES))
    except OSError:
        return None
    return classes, images


def _free_bytes(path: Path) -> int | None:
    """Free space on the disk that holds `path`, or its nearest existing parent (the run directory may not exist)."""
    for p in (path, *path.parents):
        if p.exists():
            try:
                return shutil.disk_usage(p).free
            except OSError:
                return None
    return None


def host_report(data_dirs: list[str], blacklist: str | None, run_dir: str) -> dict:
    """What this host has: environment, {data dir: [classes, images] or None}, blacklist readable, free bytes."""
    from recipes.environment import collect

    counts = {}
    for d in data_dirs:
        c = count_images(Path(d))
        counts[d] = list(c) if c else None
    return {
        "env": collect(float(os.environ.get("DAWNBENCH_METADATA_TIMEOUT", "0.5"))).to_dict(),
        "data": counts,
        "blacklist": None if not blacklist else os.access(blacklist, os.R_OK),
        "free_bytes": _free_bytes(Path(run_dir).absolute()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="print this host's pre-flight report as one JSON line")
    ap.add_argument("--data", action="append", default=[], help="data split folder to count (repeatable)")
    ap.add_argument("--blacklist", help="file that must be readable")
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args(argv)
    print(MARK, json.dumps(host_report(args.data, args.blacklist, args.run_dir)), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------------------
# On the launching machine.


@dataclass
class Expectation:
    """What every host must have."""

    procs_per_host: int
    device: str = "auto"  # run.device: auto | cpu | cuda
    input_backend: str = "torch"
    data_dirs: list[str] = field(default_factory=list)  # [root/train, root/val, copy/train, ...]
    need_bytes: int = 0  # free space for checkpoints
    images: dict[str, int] | None = None  # {data dir: count}; None: ImageNet-1k's counts for 1000-class trees
    multistream: bool = False  # comm.backend=multistream: the driver decides its concurrency (noted, not refused)


@dataclass
class Assessment:
    lines: list[str]  # one per host, then the summary
    problems: list[str]  # each names its host


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _expected_images(d: str, classes: int, exp: Expectation) -> int | None:
    if exp.images and d in exp.images:
        return exp.images[d]
    if classes == 1000:
        split = Path(d).name
        return IMAGENET_IMAGES.get(split)
    return None


def assess(reports: dict[str, dict], exp: Expectation) -> Assessment:
    """Compare every host's report with the expectation and with the other hosts."""
    from base import registry
    from recipes.environment import VERSION_LABELS, Environment, driver_problem

    problems: list[str] = []
    lines: list[str] = []
    envs = {h: Environment.from_dict(r["env"]) for h, r in reports.items()}
    uses_gpu = exp.device == "cuda" or (exp.device == "auto" and any(e.gpu_count for e in envs.values()))
    width = max(len(h) for h in reports)
    for host, r in reports.items():
        env = envs[host]
        mine: list[str] = []
        if uses_gpu:
            if env.gpu_count < exp.procs_per_host:
                mine.append(
                    f"{env.gpu_count} GPU(s) visible, but {exp.procs_per_host} process(es) per host (slots) need one "
                    "each: give this host's real slots=N, or check CUDA_VISIBLE_DEVICES and nvidia-smi"
                )
            why = driver_problem(env)
            if why:
                mine.append(why)
            pipeline = registry.INPUT_PIPELINES[exp.input_backend]
            if pipeline.env_version and getattr(env, pipeline.env_version) is None:
                missing = f"its package {pipeline.requires} is not installed (make install)"
                mine.append(f"data.backend={exp.input_backend}, but {missing}")
        for d in exp.data_dirs:
            got = r["data"].get(d)
            if got is None:
                mine.append(f"data folder {d} cannot be read")
                continue
            classes, images = got
            want = _expected_images(d, classes, exp)
            if want is not None and images != want:
                mine.append(f"data folder {d} has {images} images in {classes} classes, expected {want}")
        if r.get("blacklist") is False:
            mine.append("the validation blacklist (data.val_blacklist) cannot be read: data/prepare.py writes it")
        free = r.get("free_bytes")
        if free is not None and free < exp.need_bytes:
            mine.append(
                f"{_gib(free)} free where the run directory is, checkpoints need about {_gib(exp.need_bytes)}: "
                "free space, or give another --run-dir / RUN_DIR"
            )
        problems += [f"host {host}: {m}" for m in mine]
        gpus = f"{env.gpu_count} x {env.gpu_model} for {exp.procs_per_host} slot(s)" if env.gpu_count else "no GPU"
        data = ", ".join(
            f"{Path(d).parent.name}/{Path(d).name} {r['data'][d][1]}" for d in exp.data_dirs if r["data"].get(d)
        )
        state = "ok" if not mine else f"{len(mine)} problem(s)"
        lines.append(
            f"pre-flight [{host.ljust(width)}] {state}: {gpus}; {env.versions()}; "
            f"driver {env.driver or 'none'}; images: {data or 'synthetic'}; "
            f"{_gib(free) + ' free' if free is not None else 'free space unknown'}"
        )
        if uses_gpu and exp.multistream:
            from recipes.comm.concurrency import driver_fallback

            lines += [f"pre-flight [{host.ljust(width)}] note: {n}" for n in driver_fallback(env.driver)]
    # The same versions everywhere: the most common value is the reference, the others are named.
    for key, label in VERSION_LABELS.items():
        values = Counter(str(getattr(e, key)) for e in envs.values())
        if len(values) > 1:
            common = values.most_common(1)[0][0]  # on a tie, the first host's
            odd = [h for h, e in envs.items() if str(getattr(e, key)) != common]
            shown = "none" if common == "None" else common
            problems += [
                f"host {h}: {label} {getattr(envs[h], key) or 'none'}, but {shown} on the other host(s): "
                "install the same build everywhere (make install, or one Docker image)"
                for h in odd
            ]
    # Images differ between hosts (no expected count known): every host must read the same dataset.
    for d in exp.data_dirs:
        if any(r["data"].get(d) and _expected_images(d, r["data"][d][0], exp) for r in reports.values()):
            continue  # held to a known count above
        values = Counter(tuple(r["data"][d]) for r in reports.values() if r["data"].get(d))
        if len(values) > 1:
            common = values.most_common(1)[0][0]
            problems += [
                f"host {h}: data folder {d} has {r['data'][d][1]} images, {common[1]} on the other host(s)"
                for h, r in reports.items()
                if r["data"].get(d) and tuple(r["data"][d]) != common
            ]
    same = next(iter(envs.values())).versions()
    if problems:
        lines.append(f"pre-flight: {len(problems)} problem(s) on {len(reports)} host(s); nothing was started")
    else:
        lines.append(f"pre-flight: {len(reports)} host(s) ok; the same {same} everywhere")
    return Assessment(lines, problems)


def instance_env(reports: dict[str, dict], told: dict[str, str]) -> dict[str, str]:
    """DAWNBENCH_PROVIDER / DAWNBENCH_INSTANCE_TYPE for the ranks, from what the hosts' metadata services said, so
    that meta.json and the entry name the machines; nothing where the launcher was told (`told`, the job's env)
    or the hosts disagree or could not say."""
    out = {}
    for var, key in (("DAWNBENCH_PROVIDER", "provider"), ("DAWNBENCH_INSTANCE_TYPE", "instance_type")):
        values = {r["env"].get(key) for r in reports.values()}
        if var not in told and len(values) == 1 and None not in values:
            out[var] = values.pop()
    return out


def checkpoint_bytes(model_cfg, num_classes: int, world_size: int, keep: int) -> int:
    """Free space a run's checkpoints need on one host: `keep` kept plus one being written (model built on the meta
    device: no memory, no weights)."""
    import torch

    from models import create_model
    from recipes.rundir.checkpoint_files import estimate_bytes

    with torch.device("meta"):
        model = create_model(model_cfg, num_classes)
    return (keep + 1) * estimate_bytes(model, world_size)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: recipes.environment
    sys.exit(main())
