"""The DAWNBench inference protocol: classify validation images one at a time and time each one.

Per image, two latencies are kept, labelled everywhere:
- excluding preprocessing: from the uint8 crop being ready (on the device: prefetched while the previous image
  ran) to its top-5 classes being back on the host. This is the figure DAWNBench entries report.
- including preprocessing: the same plus this image's JPEG decode, resize and center crop on the CPU
  (timed on its own, while no model runs).
Several runners (optimize modes) are measured on the same images, alternating in rounds of `chunk` images so
that a slow drift of the machine's load affects every contender alike; each round starts with one untimed call.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from base.errors import ConfigError
from data.transforms import load_rgb, val_transform
from recipes.config import Config
from recipes.evaluation.accuracy import check_logits, eval_config, load_model
from recipes.evaluation.inference import Runner, build_runner, check_mode
from recipes.rundir.checkpoint_files import load_checkpoint
from recipes.rundir.outputs import git_commit


def select_images(num: int, count: int, seed: int = 0) -> np.ndarray:
    """`count` distinct indices out of `num` (every index when count <= 0 or count >= num): a seeded draw, sorted,
    so that a subset covers all classes of a class-sorted folder."""
    if count <= 0 or count >= num:
        return np.arange(num)
    return np.sort(np.random.default_rng(seed).permutation(num)[:count])


def load_image(path: str, size: int, crop_ratio: float) -> torch.Tensor:
    """The validation crop of one file as uint8 [1, 3, size, size] (same transform as the accuracy evaluation)."""
    return val_transform(load_rgb(path), size, crop_ratio).unsqueeze(0)


class Prefetcher:
    """Yields each host image on the device; on CUDA the copy of image i+1 is issued on a side stream before
    image i is handed out, so it overlaps image i's compute. On the CPU it passes images through."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def _issue(self, host: torch.Tensor | None):
        if host is None:
            return None
        with torch.cuda.stream(self.stream):
            image = host.to(self.device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        return image, done

    def __call__(self, images: Sequence[torch.Tensor]) -> Iterator[torch.Tensor]:
        if self.stream is None:
            yield from images
            return
        it = iter(images)
        pending = self._issue(next(it, None))
        while pending is not None:
            image, done = pending
            pending = self._issue(next(it, None))
            torch.cuda.current_stream(self.device).wait_event(done)
            image.record_stream(torch.cuda.current_stream(self.device))
            yield image


def _stats(ms: np.ndarray) -> dict:
    return {
        "mean": float(ms.mean()),
        "median": float(np.median(ms)),
        "p99": float(np.percentile(ms, 99)),
        "min": float(ms.min()),
        "max": float(ms.max()),
    }


def _percent(hits: torch.Tensor) -> float:
    return 100.0 * int(hits.sum()) / max(hits.numel(), 1)


def run_protocol(
    runners: list[Runner],
    files: Sequence[str],
    labels: Sequence[int],
    size: int,
    *,
    crop_ratio: float,
    warmup: int = 10,
    chunk: int = 32,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Batch-1 latency and accuracy of every runner on the same images; agreement is against runners[0]."""
    if not runners:
        raise ValueError("run_protocol: no runner given")
    device = runners[0].device
    prefetch = Prefetcher(device)
    n = len(files)
    pre_ms = np.zeros(n)
    model_ms = {r.mode: np.zeros(n) for r in runners}
    top = {r.mode: [] for r in runners}
    nonfinite = {r.mode: 0 for r in runners}
    warmed = set()
    for c, start in enumerate(range(0, n, chunk)):
        host = []
        for i in range(start, min(start + chunk, n)):
            t0 = time.perf_counter()
            image = load_image(files[i], size, crop_ratio)
            if device.type == "cuda":
                image = image.pin_memory()
            pre_ms[i] = (time.perf_counter() - t0) * 1e3
            host.append(image)
        order = runners[c % len(runners) :] + runners[: c % len(runners)]
        for r in order:
            first = host[0].to(device)
            for _ in range(1 if r.mode in warmed else max(1, warmup)):
                r.fn(first)
            warmed.add(r.mode)
            times, preds = model_ms[r.mode], top[r.mode]
            for i, image in enumerate(prefetch(host), start):
                t0 = time.perf_counter()
                logits = r.fn(image)
                preds.append(logits.topk(min(5, logits.shape[-1]), dim=-1).indices.cpu().view(-1))
                times[i] = (time.perf_counter() - t0) * 1e3
                nonfinite[r.mode] += int(not torch.isfinite(logits).all())  # after the timing: not part of it
        if log and (c + 1) % 10 == 0:
            log(f"  {min(start + chunk, n)}/{n} images")
    for r in runners:  # accuracy mode's rule, for every mode measured
        check_logits(nonfinite[r.mode], n, f"--latency ({r.mode})")
    y = torch.as_tensor(list(labels)).view(-1, 1)
    ref = torch.stack(top[runners[0].mode])[:, :1]
    results = {}
    for r in runners:
        pred = torch.stack(top[r.mode])
        excl = model_ms[r.mode]
        incl = excl + pre_ms
        results[r.mode] = {
            "mode": r.mode,
            "images": n,
            "latency_ms": {"excluding_preprocessing": _stats(excl), "including_preprocessing": _stats(incl)},
            "images_per_s": {
                "excluding_preprocessing": 1e3 / excl.mean(),
                "including_preprocessing": 1e3 / incl.mean(),
            },
            "top1": _percent(pred[:, :1].eq(y).any(1)),
            "top5": _percent(pred.eq(y).any(1)),
            # Agreement: top-1/top-5 "accuracy" of this mode with the reference's top-1 class as the label.
            "agreement_top1": _percent(pred[:, :1].eq(ref).any(1)),
            "agreement_top5": _percent(pred.eq(ref).any(1)),
            "agreement_with": runners[0].mode,
            "build": r.info,
        }
    return {"preprocessing_ms": _stats(pre_ms), "results": results}


def add_cost(results: dict, price_per_hour: float) -> None:
    """Cost of classifying one image (and 10,000, DAWNBench's unit) at `price_per_hour` USD, from the mean latency."""
    for res in results.values():
        per = {k: price_per_hour * v["mean"] / 3.6e6 for k, v in res["latency_ms"].items()}
        res["cost_usd"] = {
            "price_per_hour": price_per_hour,
            "per_image": per,
            "per_10k_images": {k: 1e4 * v for k, v in per.items()},
        }


def latency_table(results: dict, baseline: str | None = None, extra: dict[str, dict[str, str]] | None = None) -> str:
    """Markdown table of run_protocol's results (one row per mode); `baseline` adds a 'latency vs <baseline>' column
    (this mode's median over the baseline's: 0.50x takes half the time), `extra` more columns ({mode: {column:
    text}})."""
    head = [
        "mode",
        "mean ms",
        "median ms",
        "p99 ms",
        "mean ms incl. preproc.",
        "images/s",
        "top-1 %",
        "top-5 %",
        "agree top-1 %",
        "agree top-5 %",
    ]
    if baseline in results:
        head.append(f"latency vs {baseline}")
    columns = list(next(iter(extra.values())).keys()) if extra else []
    head += columns
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mode, r in results.items():
        ex, inc = r["latency_ms"]["excluding_preprocessing"], r["latency_ms"]["including_preprocessing"]
        row = [
            f"`{mode}`",
            f"{ex['mean']:.3f}",
            f"{ex['median']:.3f}",
            f"{ex['p99']:.3f}",
            f"{inc['mean']:.3f}",
            f"{r['images_per_s']['excluding_preprocessing']:.1f}",
            f"{r['top1']:.2f}",
            f"{r['top5']:.2f}",
            f"{r['agreement_top1']:.2f}",
            f"{r['agreement_top5']:.2f}",
        ]
        if baseline in results:
            base = results[baseline]["latency_ms"]["excluding_preprocessing"]["median"]
            row.append(f"{ex['median'] / base:.2f}x")
        row += [extra.get(mode, {}).get(c, "") for c in columns]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


__all__ = ["Prefetcher", "add_cost", "latency_table", "load_image", "run_protocol", "select_images"]


# The protocol on a checkpoint: what `evaluate.py --latency` runs.


def describe_hardware(device: torch.device, threads: int) -> str:
    if device.type == "cuda":
        return f"1 x {torch.cuda.get_device_name(device)}"
    name = "CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {threads} thread(s)"


def latency_checkpoint(
    path: str,
    *,
    data_root: str | None = None,
    image_size: int | None = None,
    modes: list[str] = ("none",),
    images: int = 0,
    seed: int = 0,
    warmup: int = 10,
    threads: int | None = None,
    calib_images: int = 256,
    device: str = "auto",
    price_per_hour: float | None = None,
    hardware: str | None = None,
    author: str | None = None,
    author_email: str | None = None,
    log=print,
    ema: bool = False,
) -> dict:
    """Batch-1 latency of the checkpoint in each of `modes` (plus the fp32 reference 'none') on `images`
    validation images (0: all of them, as DAWNBench's rules ask: the whole 50,000-image set one at a time); returns
    the results and the DAWNBench entry of the first requested mode."""
    from data.folder import scan_split

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("--latency measures one stream of batch-1 requests: run it without torchrun")
    ck = load_checkpoint(path)
    ck = ck.ema_weights() if ema else ck
    cfg, phase = eval_config(ck, data_root=data_root, image_size=image_size)
    from recipes.dawnbench import check_required

    if author is not None:  # the one who measured, where the training run named nobody (or someone else)
        cfg.dawnbench.author = author
    if author_email is not None:
        cfg.dawnbench.author_email = author_email

    check_required(cfg)  # the entry written at the end must be complete (dawnbench.require)
    size = phase.val_image_size or phase.image_size
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available")
    dev = torch.device(device)
    if threads:
        torch.set_num_threads(threads)
    threads = torch.get_num_threads()
    wanted = list(dict.fromkeys(["none", *modes]))
    for m in wanted:
        check_mode(m, dev)
    classes = ck.model_info.classes
    val = scan_split(cfg.data.root, "val", classes=classes)
    pick = select_images(len(val), images, seed)
    if images > len(val):
        log(f"note: {cfg.data.root}/val has {len(val)} images, fewer than --images {images}: measuring all of them")
    files = [val.files[i] for i in pick]
    labels = [val.labels[i] for i in pick]
    model = load_model(ck, cfg).eval()
    example = load_image(files[0], size, cfg.data.val_crop_ratio).to(dev)
    calibration = None
    if any(check_mode(m, dev).quantize for m in wanted):
        train = scan_split(cfg.data.root, "train", classes=classes)
        calibration = [
            load_image(train.files[i], size, cfg.data.val_crop_ratio)
            for i in select_images(len(train), calib_images, seed + 1)
        ]
    runners = []
    for m in wanted:
        log(f"building {m} ...")
        runners.append(build_runner(m, model, example, calibration, threads))
    log(f"measuring {len(files)} images at batch size 1, {size} px, on {dev} ({threads} thread(s))")
    out = run_protocol(runners, files, labels, size, crop_ratio=cfg.data.val_crop_ratio, warmup=warmup, log=log)
    if price_per_hour is not None:
        add_cost(out["results"], price_per_hour)
    hardware = hardware or describe_hardware(dev, threads)
    out.update(
        {
            "checkpoint": str(path),
            "model": cfg.model.name,
            "data": cfg.data.root,
            "image_size": size,
            "val_images": len(val),
            "device": str(dev),
            "threads": threads,
            "hardware": hardware,
            "images": len(files),
            "seed": seed,
            "warmup": warmup,
            "batch_size": 1,
            "torch": torch.__version__,
        }
    )
    main = wanted[1] if len(wanted) > 1 else "none"
    out["dawnbench"] = dawnbench_entry(out, main, cfg, git_commit())
    return out


def inference_qualification(out: dict, mode: str, author: str, author_email: str) -> list[str]:
    """Why this entry is no DAWNBench ImageNet inference result (empty: it is one): top-5 >= 93% over the whole
    50,000-image validation set, each image at batch size 1, and the format's author fields filled."""
    from recipes.dawnbench import DAWNBENCH_TOP5, IMAGENET_VAL_IMAGES

    reasons = []
    top5 = out["results"][mode]["top5"]
    if top5 < DAWNBENCH_TOP5:
        reasons.append(f"its top-5 is {top5:.2f}%, under DAWNBench's {DAWNBENCH_TOP5:g}%")
    if out["images"] != IMAGENET_VAL_IMAGES:
        reasons.append(
            f"it measured {out['images']:,} validation images, not ImageNet's {IMAGENET_VAL_IMAGES:,} (--images 0 "
            "on the whole set)"
        )
    empty = [k for k, v in (("author", author), ("authorEmail", author_email)) if not v.strip()]
    if empty:
        reasons.append(
            f"its {' and '.join(empty)} {'is' if len(empty) == 1 else 'are'} empty (--author, --author-email)"
        )
    return reasons


def dawnbench_entry(out: dict, mode: str, cfg: Config | None = None, commit: str = "") -> dict:
    """A DAWNBench ImageNet inference entry, field by field as the entries repository's ImageNet/inference/*.json:
    latency in ms per image, cost in USD per image (costPerHour x latency; null without --price-per-hour); author,
    authorEmail, codeURL and model from the checkpoint's dawnbench section (or --author, --author-email); ours at the
    top level, as in the training entry: `qualifies`, and `notQualifyingBecause` when it does not."""
    res = out["results"][mode]
    cost = res.get("cost_usd", {}).get("per_image", {}).get("excluding_preprocessing")
    d = cfg.dawnbench if cfg is not None else None
    framework = f"PyTorch {out['torch']}"
    if "onnxruntime" in res["build"]:
        framework = f"ONNX Runtime {res['build']['onnxruntime']} (exported from {framework})"
    e = {
        "version": "v1.0",
        "author": d.author if d else "",
        "authorEmail": d.author_email if d else "",
        "framework": framework,
    }
    if d and d.code_url:
        e["codeURL"] = d.code_url
    if commit:
        e["commitHash"] = commit
    reasons = inference_qualification(out, mode, e["author"], e["authorEmail"])
    return {
        **e,
        "qualifies": not reasons,
        **({"notQualifyingBecause": reasons} if reasons else {}),
        "model": (d.model if d else "") or out["model"],
        "hardware": out["hardware"],
        "latency": res["latency_ms"]["excluding_preprocessing"]["mean"],
        "cost": cost,
        "top5Accuracy": res["top5"],
        "timestamp": datetime.date.today().isoformat(),
        "misc": {
            "optimize": mode,
            "images": out["images"],
            "all_validation_images": out["images"] == out["val_images"],
            "image_size": out["image_size"],
            "batch_size": 1,
            "latency_including_preprocessing_ms": res["latency_ms"]["including_preprocessing"]["mean"],
            "latency_median_ms": res["latency_ms"]["excluding_preprocessing"]["median"],
            "latency_p99_ms": res["latency_ms"]["excluding_preprocessing"]["p99"],
            "top1Accuracy": res["top1"],
            "threads": out["threads"],
        },
    }
