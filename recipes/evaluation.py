"""What evaluate.py does: exact top-1/top-5 of a checkpoint, the DAWNBench latency protocol, ONNX export."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
from pathlib import Path

import torch
from torch import nn

from recipes import checkpoint as ckpt
from recipes.config import Config, ConfigError, config_from_dict
from recipes.errors import NonFiniteError


def config_from_checkpoint(state: dict, path: str) -> Config:
    if "config" not in state or "model_info" not in state:
        raise ckpt.CheckpointError(f"checkpoint '{path}' has no config: not written by this trainer")
    return config_from_dict(state["config"], f"checkpoint '{path}' config")


def load_model(state: dict, cfg: Config, path: str):
    from models import create_model
    from models.factory import check_compatible

    bad, total, first = ckpt.non_finite_weights(state["model"])
    if bad:
        raise ckpt.CheckpointError(
            f"checkpoint '{path}' has {bad} non-finite values among {total} weights (first in '{first}'): "
            "the training diverged; no accuracy or latency is reported for it"
        )
    model = create_model(cfg.model, state["model_info"]["num_classes"])
    check_compatible(model, state["model"], path)
    model.load_state_dict(state["model"])
    return model


def resolve_data_root(path: str | Path) -> str:
    """The dataset root for `--data`: a root holding val/, or the val folder itself (then its parent)."""
    p = Path(path)
    if (p / "val").is_dir() or not p.is_dir():
        return str(p)  # a missing root gets the data layer's error, which names the expected layout
    if p.name == "val":
        return str(p.parent)
    return str(p)


class FlipTTA(nn.Module):
    """Test-time augmentation: mean of the softmax of the image and of its mirror image, returned as log-probabilities
    (valid logits: top-k and cross-entropy treat them like the model's own)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.model(x).float().softmax(-1) + self.model(x.flip(-1)).float().softmax(-1)
        return (p / 2).log()


TTA = {"none": lambda m: m, "flip": FlipTTA}


def eval_config(
    state: dict,
    path: str,
    data_root: str | None = None,
    image_size: int | None = None,
    batch_size: int = 64,
    backend: str | None = None,
    rect: bool = False,
    val_blacklist: str | None = None,
):
    """(cfg, phase) that evaluate_checkpoint hands to the input pipeline: the checkpoint's last phase at the
    requested resolution, reading `<data_root>/val` (without the checkpoint's data.val_blacklist images, or
    `val_blacklist`'s; '' counts every image)."""
    cfg = config_from_checkpoint(state, path)
    data = {"val_batch_size": batch_size, "workers": min(cfg.data.workers, 2)}
    if val_blacklist is not None:
        data["val_blacklist"] = val_blacklist
    if data_root:
        data["root"], data["roots"] = resolve_data_root(data_root), {}
    if backend:
        data["backend"] = backend
    if image_size is not None and image_size <= 0:
        raise ConfigError(f"--image-size: expected a positive integer, got {image_size}")
    last = cfg.phases[-1]
    phase = dataclasses.replace(last, root="full", val_image_size=image_size or last.val_image_size, rect_val=rect)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **data), phases=[phase])
    return cfg, phase


def evaluate_checkpoint(
    path: str,
    data_root: str | None = None,
    image_size: int | None = None,
    batch_size: int = 64,
    backend: str | None = None,
    tta: str = "none",
    rect: bool = False,
    val_blacklist: str | None = None,
) -> dict:
    """Top-1/top-5 of the checkpoint on `<data_root>/val`, every image counted once over all ranks."""
    from data import create_input
    from recipes.distributed import setup, teardown
    from recipes.trainer import evaluate

    if tta not in TTA:
        raise ConfigError(f"--tta: unknown '{tta}' (expected one of {', '.join(TTA)})")
    state = ckpt.load(path)
    cfg, phase = eval_config(state, path, data_root, image_size, batch_size, backend, rect, val_blacklist)
    dist = setup(cfg)
    try:
        pipe = create_input(cfg, dist)
        _check_classes(pipe.classes, state, cfg.data.root)
        model = TTA[tta](load_model(state, cfg, path)).to(dist.device)
        if cfg.run.channels_last:
            model = model.to(memory_format=torch.channels_last)
        # The input pipeline may hand fp16 images (DALI's `data.dali_dtype`, `auto` under fp16 training) to this
        # fp32 model, which runs without autocast: cast them to the model's own dtype.
        dtype = next(model.parameters()).dtype
        result = evaluate(model, ((x.to(dtype), y) for x, y in pipe.val_batches(phase)), dist)
        result.update(blacklisted=getattr(pipe, "val_excluded", 0), val_blacklist=cfg.data.val_blacklist)
        pipe.close()
    finally:
        teardown()
    result.update(
        {
            "checkpoint": str(path),
            "data": cfg.data.root,
            "image_size": phase.val_image_size or phase.image_size,
            "world_size": dist.world_size,
            "tta": tta,
            "rect_val": phase.rect_val,
            "backend": cfg.data.backend,
        }
    )
    return result


def _check_classes(classes: list[str], state: dict, root: str) -> None:
    if classes != state["model_info"]["classes"]:
        raise ConfigError(
            f"{root}: its classes differ from the checkpoint's ({len(classes)} vs "
            f"{len(state['model_info']['classes'])} classes, or other names)"
        )


# ---------------------------------------------------------------------------------------------------------
# The DAWNBench inference protocol on a checkpoint.


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
    log=print,
) -> dict:
    """Batch-1 latency of the checkpoint in each of `modes` (plus the fp32 reference 'none') on `images`
    validation images (0: all of them, as DAWNBench's rules ask: the whole 50,000-image set one at a time); returns
    the results and the DAWNBench entry of the first requested mode."""
    from data.folder import scan_split
    from recipes.inference import build_runner, check_mode
    from recipes.latency import add_cost, load_image, run_protocol, select_images

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("--latency measures one stream of batch-1 requests: run it without torchrun")
    state = ckpt.load(path)
    cfg, phase = eval_config(state, path, data_root, image_size)
    from recipes.dawnbench import check_required

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
    classes = state["model_info"]["classes"]
    val = scan_split(cfg.data.root, "val", classes=classes)
    pick = select_images(len(val), images, seed)
    if images > len(val):
        log(f"note: {cfg.data.root}/val has {len(val)} images, fewer than --images {images}: measuring all of them")
    files = [val.files[i] for i in pick]
    labels = [val.labels[i] for i in pick]
    model = load_model(state, cfg, path).eval()
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
    out = run_protocol(runners, files, labels, size, cfg.data.val_crop_ratio, warmup=warmup, log=log)
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
    from recipes.trainer import git_commit

    out["dawnbench"] = dawnbench_entry(out, main, cfg, git_commit())
    return out


def dawnbench_entry(out: dict, mode: str, cfg: Config | None = None, commit: str = "") -> dict:
    """A DAWNBench ImageNet inference entry, field by field as the entries repository's ImageNet/inference/*.json:
    latency in ms per image, cost in USD per image (costPerHour x latency; null without --price-per-hour); author,
    authorEmail, codeURL and model from the checkpoint's dawnbench section."""
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
    return {
        **e,
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


def export_checkpoint(path: str, fmt: str, out: str | None = None, image_size: int | None = None) -> Path:
    """Write the checkpoint's model as `fmt` (onnx): input 'image' uint8 [1, 3, S, S] (normalized inside)."""
    from recipes.inference import export_onnx

    if fmt != "onnx":
        raise ConfigError(f"--export: unknown format '{fmt}' (expected onnx)")
    state = ckpt.load(path)
    cfg, phase = eval_config(state, path, image_size=image_size)
    model = load_model(state, cfg, path)
    size = phase.val_image_size or phase.image_size
    return export_onnx(model, size, out or Path(path).with_suffix(".onnx"))


# ---------------------------------------------------------------------------------------------------------
# The command line.


def _write_json(path: str | None, data: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=1) + "\n")


def run_evaluate_cli(args) -> int:
    from data.folder import DataError
    from recipes.latency import latency_table

    main = int(os.environ.get("RANK", "0")) == 0
    try:
        if args.export:
            if int(os.environ.get("WORLD_SIZE", "1")) > 1:
                raise ConfigError("--export: run it without torchrun")
            written = export_checkpoint(args.checkpoint, args.export, args.export_file, args.image_size)
            print(
                f"wrote {written} ({written.stat().st_size / 1e6:.1f} MB): input 'image' uint8 [1, 3, S, S], "
                "output 'logits'"
            )
            if not args.latency:
                return 0
        if args.latency:
            modes = [m.strip() for m in args.optimize.split(",") if m.strip()]
            res = latency_checkpoint(
                args.checkpoint,
                args.data,
                args.image_size,
                modes,
                args.images,
                args.seed,
                args.warmup,
                args.threads,
                args.calib_images,
                args.device,
                args.price_per_hour,
                args.hardware,
            )
            print(
                f"\nbatch-1 latency per image on {res['hardware']}, {res['images']} images at {res['image_size']} "
                f"px; 'incl. preproc.' adds JPEG decode + resize + crop "
                f"(mean {res['preprocessing_ms']['mean']:.3f} ms)\n"
            )
            print(latency_table(res["results"], baseline="none"))
            for mode, r in res["results"].items():
                if "cost_usd" in r:
                    c, k = r["cost_usd"]["per_image"], r["cost_usd"]["per_10k_images"]
                    print(
                        f"cost ({mode}): ${c['excluding_preprocessing']:.3g} per image, "
                        f"${k['excluding_preprocessing']:.3g} per 10,000 images excluding preprocessing; "
                        f"${k['including_preprocessing']:.3g} per 10,000 including it"
                    )
            _write_json(args.out, res)
            _write_json(args.entry, res["dawnbench"])
            return 0
        if args.entry:
            raise ConfigError("--entry: the DAWNBench inference entry comes from --latency")
        res = evaluate_checkpoint(
            args.checkpoint,
            args.data,
            args.image_size,
            args.batch_size,
            args.backend,
            args.tta,
            args.rect,
            args.val_blacklist,
        )
    except (ConfigError, DataError, ckpt.CheckpointError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except NonFiniteError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    if main:
        extra = f", tta {res['tta']}" if res["tta"] != "none" else ""
        if res["blacklisted"]:
            extra += f"; {res['blacklisted']} blacklisted images not counted ({res['val_blacklist']})"
        print(
            f"top-1 {res['top1']:.2f}%  top-5 {res['top5']:.2f}%  on {res['count']} images "
            f"({res['image_size']} px, {res['world_size']} process(es){extra})"
        )
        _write_json(args.out, res)
    return 0


__all__ = ["FlipTTA", "evaluate_checkpoint", "export_checkpoint", "latency_checkpoint"]
