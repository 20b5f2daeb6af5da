#!/usr/bin/env python
"""Batch-1 inference latency: eager fp32, every --optimize mode and ONNX Runtime (the peer), on the same images.

    python -m scripts.bench.bench_inference [--models resnet50_tweaked,resnet26d] [--images 200] [--threads 2] [--quick]
    python -m scripts.bench.bench_inference --checkpoint runs/x/checkpoint.pt        # a trained model instead
    python -m scripts.bench.bench_inference --json PATH     # and every mode's statistics, for the docs' table

The DAWNBench protocol of evaluate.py --latency (recipes/evaluation/latency.py): images decoded and cropped at
224 px, the contenders alternating in rounds of 32 images, medians compared. Without --checkpoint each network is a
random backbone with BatchNorm statistics and a 1000-way linear classifier fitted on the calibration (training) images
(see probe_model; no pretrained weights are fetched). Agreement: the fraction of images on which a mode's top-1 /
top-5 holds eager fp32's top-1 class.
On a machine with a GPU the GPU modes are measured (fp16/bf16, CUDA graphs, input prefetch).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

# Started as a file, Python puts only scripts/bench/ on the path: the repository goes first, so the imports
# below (the repository's packages) resolve as they do under `python -m`.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from data.folder import scan_split
from data.transforms import normalize
from models import create_model
from recipes.config import ModelConfig
from recipes.evaluation.inference import build_runner
from recipes.evaluation.latency import latency_table, load_image, run_protocol, select_images
from scripts.bench.record import add_json_arg, check_json, write_json

ROOT = Path(__file__).resolve().parents[2]

CPU_MODES = ["none", "fuse", "compile", "int8", "onnxruntime", "onnxruntime-int8"]
GPU_MODES = ["none", "fuse", "compile", "fp16", "bf16"]
FP32_EXACT = ("fuse", "compile")


def sample_data(path: Path) -> Path:
    if not (path / "val").is_dir():
        from data.make_sample import main as make_sample

        make_sample(["--out", str(path), "--odd"])
    return path


def probe_model(name: str, images: list[torch.Tensor], labels: list[int]) -> torch.nn.Module:
    """Random backbone (seed 0, every residual branch active), BN statistics measured on `images`, and a
    1000-way linear classifier fitted to their features: a network whose predictions mean something, so that
    the agreement columns measure what a quantized model loses (no pretrained weights are fetched)."""
    torch.manual_seed(0)
    model = create_model(ModelConfig(name=name, zero_init_last_bn=False), 1000)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the batches below
    batches = [normalize(torch.cat(images[i : i + 16]), False) for i in range(0, len(images), 16)]
    with torch.no_grad():
        model.train()
        for x in batches:
            model(x)
        model.eval()
        feats = torch.cat([model.forward_head(model.forward_features(x), pre_logits=True) for x in batches])
    mean, std = feats.mean(0), feats.std(0) + 1e-6
    head = torch.nn.Linear(feats.shape[1], 1000)
    opt = torch.optim.Adam(head.parameters(), lr=1e-2, weight_decay=1e-4)
    y = torch.as_tensor(labels)
    for _ in range(200):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(head((feats - mean) / std), y).backward()
        opt.step()
    with torch.no_grad():  # fold the feature standardization into the classifier
        fc = model.get_classifier()
        fc.weight.copy_(head.weight / std)
        fc.bias.copy_(head.bias - fc.weight @ mean)
    return model


def bench_model(label: str, model, args, *, files, labels, calibration, device) -> tuple[str, dict]:
    """The Markdown table and bullets of one network, and what they were computed from (for --json)."""
    size = args.image_size
    example = load_image(files[0], size, 0.875).to(device)
    modes = args.modes.split(",") if args.modes else (GPU_MODES if device.type == "cuda" else CPU_MODES)
    if device.type == "cuda":
        import onnxruntime

        if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            modes.append("onnxruntime")
    runners, build_s = [], {}
    for mode in modes:
        t = time.perf_counter()
        runners.append(build_runner(mode, model, example, calibration, args.threads))
        build_s[mode] = time.perf_counter() - t
        print(f"  built {label} {mode} in {build_s[mode]:.1f} s", file=sys.stderr, flush=True)
    out = run_protocol(runners, files, labels, size, crop_ratio=0.875, warmup=args.warmup)
    res = out["results"]
    base = "onnxruntime" if "onnxruntime" in res else "none"
    extra = {m: {"build s": f"{build_s[m]:.0f}"} for m in res}
    lines = [
        f"### {label}, {size} px, batch 1, {len(files)} images, {device.type} ({args.threads} threads)",
        "",
        latency_table(res, baseline=base, extra=extra),
        "",
    ]
    med = {m: r["latency_ms"]["excluding_preprocessing"]["median"] for m, r in res.items()}
    if "onnxruntime" in med:
        exact = min((m for m in FP32_EXACT if m in med), key=med.get, default=None)
        if exact:
            lines.append(
                f"- best fp32-exact mode `{exact}`: {med[exact] / med['onnxruntime']:.2f}x ONNX Runtime's latency "
                "(target <= 1.0)"
            )
        if "int8" in med:
            lines.append(
                f"- `int8`: {med['int8'] / med['onnxruntime']:.2f}x ONNX Runtime fp32's latency (target <= 0.6), "
                f"top-5 agreement {res['int8']['agreement_top5']:.1f}% (target >= 99%)"
            )
        if "int8" in med and "onnxruntime-int8" in med:
            ratio = med["int8"] / med["onnxruntime-int8"]
            lines.append(
                f"- like with like: `int8` {med['int8']:.2f} ms vs ONNX Runtime's static INT8 "
                f"{med['onnxruntime-int8']:.2f} ms ({ratio:.2f}x)"
            )
    lines.append(f"- preprocessing (decode, resize, crop): median {out['preprocessing_ms']['median']:.2f} ms/image")
    record = {
        "model": label,
        "image_size": size,
        "images": len(files),
        "device": device.type,
        "threads": args.threads,
        "build_s": build_s,
        "preprocessing_ms": out["preprocessing_ms"],
        "results": res,
    }
    return "\n".join(lines) + "\n", record


def versions() -> dict[str, str | None]:
    """The versions of the libraries the modes run on (None: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in ("torchao", "onnxruntime", "onnx"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet50_tweaked,resnet26d")
    ap.add_argument("--checkpoint", help="a trained checkpoint instead of random-weight --models")
    ap.add_argument("--data", default=str(ROOT / "data" / "sample"), help="dataset root (made if missing)")
    ap.add_argument("--images", type=int, default=200, help="validation images timed per mode")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--calib-images", type=int, default=128, help="training images that calibrate the int8 modes")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads for torch and ONNX Runtime")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--modes", help="comma-separated modes (default: every mode for this device)")
    ap.add_argument("--quick", action="store_true", help="resnet26d only, 32 images, 32 calibration images")
    add_json_arg(ap)
    args = ap.parse_args(argv)
    check_json(args.json)
    if args.quick:
        args.models, args.images, args.calib_images, args.warmup = "resnet26d", 32, 32, 3
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    root = sample_data(Path(args.data))
    val = scan_split(root, "val")
    train = scan_split(root, "train", classes=val.classes)
    pick = select_images(len(val), args.images, 0)
    files, labels = [val.files[i] for i in pick], [val.labels[i] for i in pick]
    calib = select_images(len(train), args.calib_images, 1)
    calibration = [load_image(train.files[i], args.image_size, 0.875) for i in calib]
    calib_labels = [train.labels[i] for i in calib]
    print(
        f"torch {torch.__version__}, {args.threads} threads, device {device}; ms per image excluding "
        "preprocessing; 'vs' = ratio of medians; agreement = top-1/top-5 holding eager fp32's top-1\n"
    )
    if args.checkpoint:
        from recipes.evaluation.accuracy import config_from_checkpoint, load_model
        from recipes.rundir.checkpoint_files import load_checkpoint

        ck = load_checkpoint(args.checkpoint)
        cfg = config_from_checkpoint(ck)
        text, record = bench_model(
            cfg.model.name,
            load_model(ck, cfg),
            args,
            files=files,
            labels=labels,
            calibration=calibration,
            device=device,
        )
        print(text)
        write_json(args.json, "scripts.bench.bench_inference", argv, {"models": [record], "versions": versions()})
        return 0
    records = []
    for name in args.models.split(","):
        model = probe_model(name, calibration, calib_labels)
        text, record = bench_model(
            name, model, args, files=files, labels=labels, calibration=calibration, device=device
        )
        print(text, flush=True)
        records.append(record)
    write_json(args.json, "scripts.bench.bench_inference", argv, {"models": records, "versions": versions()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
