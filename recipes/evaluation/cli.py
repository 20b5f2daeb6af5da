"""What `evaluate.py` does with its arguments: accuracy, the batch-1 latency protocol, or an ONNX export."""

from __future__ import annotations

import math
import os
import sys
import tempfile
from pathlib import Path

from base.errors import CheckpointError, ConfigError, NonFiniteError
from base.writer import refuse_irregular, to_json, write_output
from recipes.evaluation.accuracy import eval_config, evaluate_checkpoint, load_model
from recipes.evaluation.inference import export_onnx
from recipes.evaluation.latency import latency_checkpoint, latency_table
from recipes.exit_codes import BAD_INPUT, TRAINING_STOPPED
from recipes.rundir.checkpoint_files import load_checkpoint


def export_checkpoint(
    path: str, fmt: str, out: str | None = None, image_size: int | None = None, ema: bool = False
) -> Path:
    """Write the checkpoint's model (its EMA weights with `ema`) as `fmt` (onnx): input 'image' uint8 [1, 3, S, S]
    (normalized inside)."""
    if fmt != "onnx":
        raise ConfigError(f"--export: unknown format '{fmt}' (expected onnx)")
    ck = load_checkpoint(path)
    ck = ck.ema_weights() if ema else ck
    cfg, phase = eval_config(ck, image_size=image_size)
    model = load_model(ck, cfg)
    size = phase.val_image_size or phase.image_size
    return export_onnx(model, size, out or Path(path).with_suffix(".onnx"))


def _write_json(path: str | None, data: dict, flag: str) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_output(path, to_json(data), flag, ConfigError)  # strict JSON, never through a link, FIFO or device


# (flag, attribute, lowest, highest): what each number can be; None = no bound on that side.
_NUMBERS = [
    ("--batch-size", "batch_size", 1, 4096),
    ("--image-size", "image_size", 1, 4096),
    ("--threads", "threads", 1, 1024),
    ("--seed", "seed", 0, 2**31 - 1),
    ("--images", "images", 0, 10**9),
    ("--warmup", "warmup", 0, 10**6),
    ("--calib-images", "calib_images", 1, 10**6),
    ("--price-per-hour", "price_per_hour", 0, 10**6),
]


def check_args(args) -> None:
    """Every number in its range and every output writable, before anything is loaded or measured."""
    for flag, name, low, high in _NUMBERS:
        value = getattr(args, name, None)
        if value is None:
            continue
        finite = isinstance(value, int) or math.isfinite(value)
        if not finite or (low is not None and value < low) or (high is not None and value > high):
            allowed = f"in [{low}, {high:,}]" if high is not None else f">= {low}"
            kind = "an integer" if isinstance(value, int) else "a finite number"
            raise ConfigError(f"{flag}: expected {kind} {allowed}, got {value}")
    for flag, name in (("--out", "out"), ("--entry", "entry"), ("--export-file", "export_file")):
        path = getattr(args, name, None)
        if path is not None:
            check_writable(flag, path)


def check_writable(flag: str, path: str) -> None:
    """Refuse an output path that is a directory or that cannot be written, before the work that fills it."""
    p = Path(path)
    refuse_irregular(p, flag, ConfigError)  # a regular file or a new name: never a folder, FIFO, device or link
    parent = p.parent
    while not parent.exists():  # created when written: the nearest existing folder must take it
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{flag}: cannot write '{p}': '{parent}' is not a directory")
    try:  # a real probe: os.access says yes to root on a read-only mount
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".evaluate-probe-"):
            pass  # the file itself is replaced by a rename: the folder's permission is what counts
    except OSError as e:
        raise ConfigError(f"{flag}: cannot write '{p}': {e.strerror or e}") from None


def run_evaluate_cli(args) -> int:
    from base.errors import DataError

    main = int(os.environ.get("RANK", "0")) == 0
    try:
        check_args(args)
        if args.export:
            if int(os.environ.get("WORLD_SIZE", "1")) > 1:
                raise ConfigError("--export: run it without torchrun")
            written = export_checkpoint(args.checkpoint, args.export, args.export_file, args.image_size, args.ema)
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
                data_root=args.data,
                image_size=args.image_size,
                modes=modes,
                images=args.images,
                seed=args.seed,
                warmup=args.warmup,
                threads=args.threads,
                calib_images=args.calib_images,
                device=args.device,
                price_per_hour=args.price_per_hour,
                hardware=args.hardware,
                author=args.author,
                author_email=args.author_email,
                ema=args.ema,
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
            e = res["dawnbench"]
            print(
                "DAWNBench inference entry: "
                + ("qualifies" if e["qualifies"] else "does NOT qualify: " + "; ".join(e["notQualifyingBecause"]))
            )
            _write_json(args.out, res, "--out")
            _write_json(args.entry, e, "--entry")
            return 0
        if args.entry:
            raise ConfigError("--entry: the DAWNBench inference entry comes from --latency")
        res = evaluate_checkpoint(
            args.checkpoint,
            args.data,
            image_size=args.image_size,
            batch_size=args.batch_size,
            backend=args.backend,
            tta=args.tta,
            rect=args.rect,
            val_blacklist=args.val_blacklist,
            ema=args.ema,
        )
    except (ConfigError, DataError, CheckpointError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return BAD_INPUT
    except NonFiniteError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return TRAINING_STOPPED
    if main:
        extra = f", tta {res['tta']}" if res["tta"] != "none" else ""
        extra += ", EMA weights" if args.ema else ""
        if res["blacklisted"]:
            extra += f"; {res['blacklisted']} blacklisted images not counted ({res['val_blacklist']})"
        print(
            f"top-1 {res['top1']:.2f}%  top-5 {res['top5']:.2f}%  on {res['count']} images "
            f"({res['image_size']} px, {res['world_size']} process(es){extra})"
        )
        print(f"crop size {res['image_size']} px: {res['image_size_from']}")
        try:
            _write_json(args.out, res, "--out")
        except ConfigError as e:  # the disk filled or the folder went away during the evaluation
            print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
    return 0
