#!/usr/bin/env python
"""Pre-resized copies of a dataset for the low-resolution phases, and a check of every file.

    python data/prepare.py --src /imagenet --dst /imagenet-160 --max-side 160 [--splits train] [--workers 16]
    python data/prepare.py --check /imagenet [--out bad_files.tsv]

A copy keeps the folder layout and file names; every image is written as an RGB JPEG whose longer side is at most
--max-side (or whose shorter side is --short-side; images are never enlarged). Work is spread over --workers
processes, each file is written atomically and recorded in <dst>/manifest.jsonl (source and output size, bytes,
what the source was), so an interrupted run continues where it stopped. <dst>/prepare.json holds the settings and,
once done, the totals. A phase reads the copy through `data.roots: {160: /imagenet-160}` and `root: '160'`.

--check decodes every image and lists each file that is not a decodable RGB JPEG (CMYK, grayscale, PNG content
named .JPEG, truncated, empty, not an image), with what it is; the exit status is 1 when some cannot be decoded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from multiprocessing import get_context
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from PIL import Image  # noqa: E402

from data.check import OK, inspect_file  # noqa: E402
from data.folder import IMAGE_EXTENSIONS, DataError, scan_split  # noqa: E402

MANIFEST = "manifest.jsonl"
SETTINGS = "prepare.json"


def target_size(width: int, height: int, max_side: int | None, short_side: int | None) -> tuple[int, int]:
    """Output (width, height): scaled down to the limit, never up."""
    scale = max_side / max(width, height) if max_side else short_side / min(width, height)
    if scale >= 1.0:
        return width, height
    return max(1, round(width * scale)), max(1, round(height * scale))


def _resize_one(task: tuple) -> dict:
    src, dst, rel, max_side, short_side, quality = task
    entry = {"file": rel}
    try:
        with Image.open(src) as img:
            fmt, mode, (w, h) = img.format, img.mode, img.size
            tw, th = target_size(w, h, max_side, short_side)
            if fmt == "JPEG":
                img.draft("RGB", (tw, th))  # decode at a reduced DCT scale when that is still >= the target
            out = img.convert("RGB")
        if out.size != (tw, th):
            out = out.resize((tw, th), Image.Resampling.LANCZOS)
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        report = inspect_file(src)
        return {**entry, "status": "undecodable", "kind": report.kind, "error": report.detail or str(e)}
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{dst}.tmp{os.getpid()}"
    if fmt == "JPEG" and mode == "RGB" and (tw, th) == (w, h):
        with open(src, "rb") as fi, open(tmp, "wb") as fo:  # already small: the original bytes, no re-encode
            fo.write(fi.read())
        status = "copied"
    else:
        out.save(tmp, format="JPEG", quality=quality)
        status = "resized"
    os.replace(tmp, dst)  # atomic: a file that exists is complete (what makes a rerun resume safely)
    kind = "rgb-jpeg" if fmt == "JPEG" and mode == "RGB" else f"{fmt} {mode}"
    return {**entry, "status": status, "kind": kind, "src_size": [w, h], "size": [tw, th],
            "bytes": os.path.getsize(dst)}  # fmt: skip


def _read_manifest(path: Path) -> dict[str, dict]:
    done = {}
    if not path.is_file():
        return done
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by an interruption: that file is simply redone
        done[entry["file"]] = entry
    return done


def _pool_map(fn, tasks: list, workers: int):
    if workers <= 1 or len(tasks) <= 1:
        yield from map(fn, tasks)
        return
    with get_context("fork").Pool(workers) as pool:
        yield from pool.imap_unordered(fn, tasks, chunksize=16)


def prepare(src: Path, dst: Path, max_side: int | None, short_side: int | None, splits: list[str], quality: int,
            workers: int, log=print) -> dict:  # fmt: skip
    """Write (or finish writing) the resized copy; returns the totals written to prepare.json."""
    settings = {"src": str(src.resolve()), "max_side": max_side, "short_side": short_side, "quality": quality,
                "splits": splits}  # fmt: skip
    dst.mkdir(parents=True, exist_ok=True)
    settings_path = dst / SETTINGS
    if settings_path.is_file():
        old = json.loads(settings_path.read_text())
        old_settings = {k: old.get(k) for k in settings}
        if old_settings != settings:
            raise DataError(
                f"'{dst}' was prepared with other settings ({old_settings}); use another --dst or delete it"
            )
    settings_path.write_text(json.dumps({**settings, "complete": False}, indent=1) + "\n")
    manifest_path = dst / MANIFEST
    done = _read_manifest(manifest_path)
    tasks, kept = [], 0
    for split in splits:
        found = scan_split(src, split)
        for path in found.files:
            rel = os.path.relpath(path, src)
            out = dst / rel
            entry = done.get(rel)
            if entry and entry["status"] in ("resized", "copied") and out.is_file():
                kept += 1
                continue
            tasks.append((path, str(out), rel, max_side, short_side, quality))
    log(f"{len(tasks)} file(s) to write, {kept} already done (resume), {workers} worker(s)")
    with open(manifest_path, "a") as manifest:
        for i, entry in enumerate(_pool_map(_resize_one, tasks, workers), 1):
            manifest.write(json.dumps(entry) + "\n")
            manifest.flush()
            if i % 5000 == 0:
                log(f"  {i}/{len(tasks)}")
    # One line per file, the last one wins (a resumed run appends): rewrite it compactly.
    final = _read_manifest(manifest_path)
    tmp = manifest_path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(e) + "\n" for _, e in sorted(final.items())))
    os.replace(tmp, manifest_path)
    counts = Counter(e["status"] for e in final.values())
    bad = [e for _, e in sorted(final.items()) if e["status"] == "undecodable"]
    totals = {"resized": counts["resized"], "copied": counts["copied"], "undecodable": len(bad)}
    settings_path.write_text(json.dumps({**settings, "complete": not bad, **totals}, indent=1) + "\n")
    for entry in bad:
        log(f"undecodable: {entry['file']}: {entry['kind']}: {entry['error']}")
    return {**totals, "bad": bad}


def _image_files(root: Path) -> list[str]:
    if not root.is_dir():
        raise DataError(f"--check: '{root}' is not a folder")
    return sorted(
        str(p) for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS and ".tmp" not in p.name
    )


def check(root: Path, workers: int, out: Path | None = None, log=print) -> list:
    """Inspect every image under `root`; print (and optionally write as TSV) each one that is not an RGB JPEG."""
    files = _image_files(root)
    reports = sorted(_pool_map(inspect_file, files, workers), key=lambda r: r.path)
    odd = [r for r in reports if r.kind != OK]
    lines = [f"{r.kind}\t{os.path.relpath(r.path, root)}\t{r.detail}" for r in odd]
    if odd:
        width = max(len(r.kind) for r in odd)
        log(f"{'kind'.ljust(width)}  file  (what it is)")
        for r in odd:
            log(f"{r.kind.ljust(width)}  {os.path.relpath(r.path, root)}  ({r.detail})")
    kinds = Counter(r.kind for r in reports)
    undecodable = [r for r in odd if not r.decodable]
    summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
    log(f"checked {len(reports)} files under {root}: {summary or 'none'}; {len(undecodable)} cannot be decoded")
    if out is not None:
        out.write_text("kind\tfile\tdetail\n" + "".join(line + "\n" for line in lines))
    return odd


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, help="dataset root with train/ (and val/) in ImageNet folder layout")
    ap.add_argument("--dst", type=Path, help="where the resized copy goes (created; resumed when it exists)")
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--max-side", type=int, help="longest side of the copies, in pixels")
    size.add_argument("--short-side", type=int, help="shortest side of the copies, in pixels (fast.ai's layout)")
    ap.add_argument("--splits", nargs="+", default=["train"], help="splits to copy (default: train)")
    ap.add_argument("--quality", type=int, default=90, help="JPEG quality of re-encoded images")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (default: all cores)")
    ap.add_argument("--skip-corrupt", action="store_true", help="exit 0 even if some source files cannot be decoded")
    ap.add_argument("--check", type=Path, metavar="ROOT", help="inspect every image under ROOT instead of copying")
    ap.add_argument("--out", type=Path, help="--check: also write the list as TSV to this file")
    args = ap.parse_args(argv)
    try:
        if args.check is not None:
            odd = check(args.check, args.workers, args.out)
            return 1 if any(not r.decodable for r in odd) else 0
        if args.src is None or args.dst is None:
            ap.error("--src and --dst are required (or --check ROOT)")
        if args.max_side is None and args.short_side is None:
            ap.error("one of --max-side or --short-side is required")
        limit = args.max_side or args.short_side
        if limit < 8:
            ap.error(f"--max-side/--short-side: expected at least 8 pixels, got {limit}")
        if not 1 <= args.quality <= 100:
            ap.error(f"--quality: expected 1..100, got {args.quality}")
        if args.src.resolve() == args.dst.resolve():
            ap.error("--dst must differ from --src")
        result = prepare(args.src, args.dst, args.max_side, args.short_side, args.splits, args.quality, args.workers)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.dst}: {result['resized']} resized, {result['copied']} copied, "
          f"{result['undecodable']} undecodable")  # fmt: skip
    if result["bad"] and not args.skip_corrupt:
        print(f"error: {len(result['bad'])} source file(s) cannot be decoded (listed above); they are not in the "
              "copy. Rerun with --skip-corrupt to accept that.", file=sys.stderr)  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
