#!/usr/bin/env python
"""ImageNet as downloaded -> the folder layout the loaders read; pre-resized copies; a check of every file.

    python data/prepare.py --download ~/Downloads/imagenet --dst /imagenet [--short-side 160]   (one command)
    python data/prepare.py --sort-val /imagenet --devkit ILSVRC2012_devkit_t12.tar.gz     (or --val-solution CSV)
    python data/prepare.py --src /imagenet --dst /imagenet-160 --short-side 160 [--splits train] [--workers 16]
    python data/prepare.py --check /imagenet [--out bad_files.tsv]

--download reads the download as it is (image-net.org's ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar and
ILSVRC2012_devkit_t12.tar.gz in one folder; or Kaggle's folder with ILSVRC/Data/CLS-LOC, LOC_synset_mapping.txt and
LOC_val_solution.csv; or Kaggle's zip), streams the tars (see data/download.py), writes <dst>/{train,val}/<wnid>/ and
<dst>/ILSVRC2012_validation_blacklist.txt, and with --short-side N also the copy <dst>-N. A rerun resumes.

--sort-val moves the flat validation folder (<root>/val/ILSVRC2012_val_00000001.JPEG ...) into class folders
(<root>/val/<wnid>/...), with the labels of the devkit (parsed by torchvision's ImageNet devkit parser; needs scipy)
or of Kaggle's LOC_val_solution.csv. With the devkit it also writes <root>/ILSVRC2012_validation_blacklist.txt, the
file data.val_blacklist names. A move is one rename and names carry the image number, so a rerun finishes the job.

A copy keeps the folder layout and file names; every image is written as an RGB JPEG whose shorter side is
--short-side (images are never enlarged), so a copy named 160 feeds crops up to 160 px from every image. Work is
spread over --workers processes, each file is written atomically and recorded in <dst>/manifest.jsonl (source and
output size, bytes, what the source was), so an interrupted run continues where it stopped. <dst>/prepare.json holds
the settings and, once done, the totals. A phase with `root: '160'` reads the copy `<data.root>-160` (found beside
data.root), or the one `data.roots: {160: /elsewhere}` names.

--check decodes every image and lists each file that is not a decodable RGB JPEG (CMYK, grayscale, PNG content
named .JPEG, truncated, empty, not an image, a GIF, which the DALI backend refuses), with what it is; the exit status
is 1 when some cannot be decoded or would stop data.backend=dali, 2 (one line) when ROOT holds no image or still
holds .tar archives (a download not yet extracted: use --download).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from collections import Counter
from multiprocessing import get_context
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from PIL import Image  # noqa: E402

from base import reader  # noqa: E402
from base.errors import DataError  # noqa: E402
from base.writer import (  # noqa: E402
    check_target,
    open_append,
    open_new,
    refuse_irregular,
    to_json,
    write_output,
)
from data.check import OK, inspect_file, open_image, too_many_pixels  # noqa: E402
from data.download import from_download  # noqa: E402
from data.folder import IMAGE_EXTENSIONS, scan_split  # noqa: E402
from data.labels import (  # noqa: E402
    BLACKLIST,
    VAL_NAME,
    devkit_blacklist_bytes,
    is_class_name,
    read_blacklist,
    read_devkit,
    solution_labels,
    write_blacklist,
)

MANIFEST = "manifest.jsonl"
SETTINGS = "prepare.json"


def _read_text(path: Path, what: str) -> str:
    """A text file the tool reads back, or one DataError line saying what is wrong with it (never its content)."""
    # 1 GiB: a manifest holds one ~150-byte line per image (1.28 M for ImageNet's train split)
    return reader.read_text(path, what=what, error=DataError, max_bytes=1 << 30)


def _read_settings(path: Path) -> dict:
    try:
        data = json.loads(_read_text(path, "settings file"))
    except json.JSONDecodeError as e:
        raise DataError(
            f"settings file '{path}' is not valid JSON (line {e.lineno}); delete it to start over"
        ) from None
    if not isinstance(data, dict):
        raise DataError(f"settings file '{path}' does not hold a JSON object; delete it to start over")
    return data


def target_size(width: int, height: int, short_side: int) -> tuple[int, int]:
    """Output (width, height): the shorter side scaled down to `short_side` (at least that after rounding), never up."""
    scale = short_side / min(width, height)
    if scale >= 1.0:
        return width, height
    return max(1, round(width * scale)), max(1, round(height * scale))


def _resize_one(task: tuple) -> dict:
    src, dst, rel, short_side, quality = task
    entry = {"file": rel}
    try:
        with open_image(src) as img:  # the size from the header, compared here: a bomb is never decoded
            fmt, mode, (w, h) = img.format, img.mode, img.size
            if w * h > Image.MAX_IMAGE_PIXELS:
                why = too_many_pixels(src, w, h, Image.MAX_IMAGE_PIXELS)
                return {**entry, "status": "undecodable", "kind": "too-large", "error": why}
            tw, th = target_size(w, h, short_side)
            if fmt == "JPEG":
                img.draft("RGB", (tw, th))  # decode at a reduced DCT scale when that is still >= the target
            out = img.convert("RGB")
        if out.size != (tw, th):
            out = out.resize((tw, th), Image.Resampling.LANCZOS)
    except (OSError, ValueError, SyntaxError, EOFError, struct.error) as e:
        report = inspect_file(src)
        return {**entry, "status": "undecodable", "kind": report.kind, "error": report.detail or str(e)}
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{dst}.tmp{os.getpid()}"
    refuse_irregular(Path(dst), "an image", DataError)  # a regular file or nothing: never replace a FIFO or device
    Path(tmp).unlink(missing_ok=True)  # our own leftover (same pid), or a planted link: never written through
    with open_new(tmp, "an image", DataError) as fo:
        if fmt == "JPEG" and mode == "RGB" and (tw, th) == (w, h):
            with open(src, "rb") as fi:  # already small: the original bytes, no re-encode
                fo.write(fi.read())
            status = "copied"
        else:
            out.save(fo, format="JPEG", quality=quality)
            status = "resized"
    os.replace(tmp, dst)  # atomic: a file that exists is complete (what makes a rerun resume safely)
    kind = "rgb-jpeg" if fmt == "JPEG" and mode == "RGB" else f"{fmt} {mode}"
    return {
        **entry,
        "status": status,
        "kind": kind,
        "src_size": [w, h],
        "size": [tw, th],
        "bytes": os.path.getsize(dst),
    }


def _read_manifest(path: Path) -> dict[str, dict]:
    done = {}
    if not path.is_file():
        return done
    for line in _read_text(path, "manifest").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by an interruption: that file is simply redone
        if isinstance(entry, dict) and isinstance(entry.get("file"), str) and isinstance(entry.get("status"), str):
            done[entry["file"]] = entry  # anything else is not one of ours: that file is redone
    return done


def _pool_map(fn, tasks: list, workers: int):
    if workers <= 1 or len(tasks) <= 1:
        yield from map(fn, tasks)
        return
    with get_context("fork").Pool(workers) as pool:
        yield from pool.imap_unordered(fn, tasks, chunksize=16)


def prepare(src: Path, dst: Path, short_side: int, *, splits: list[str], quality: int, workers: int, log=print) -> dict:
    """Write (or finish writing) the resized copy; returns the totals written to prepare.json."""
    settings = {"src": str(src.resolve()), "short_side": short_side, "quality": quality, "splits": splits}
    dst.mkdir(parents=True, exist_ok=True)
    settings_path = dst / SETTINGS
    if settings_path.is_file():
        old = _read_settings(settings_path)
        old_settings = {k: old.get(k) for k in settings}
        if old_settings != settings:
            raise DataError(
                f"'{dst}' was prepared with other settings ({old_settings}); use another --dst or delete it"
            )
    write_output(settings_path, to_json({**settings, "complete": False}), "the settings file", DataError)
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
            tasks.append((path, str(out), rel, short_side, quality))
    log(f"{len(tasks)} file(s) to write, {kept} already done (resume), {workers} worker(s)")
    with open_append(manifest_path, "the manifest", DataError) as manifest:
        for i, entry in enumerate(_pool_map(_resize_one, tasks, workers), 1):
            manifest.write(json.dumps(entry) + "\n")
            manifest.flush()
            if i % 5000 == 0:
                log(f"  {i}/{len(tasks)}")
    # One line per file, the last one wins (a resumed run appends): rewrite it compactly.
    final = _read_manifest(manifest_path)
    write_output(
        manifest_path, "".join(json.dumps(e) + "\n" for _, e in sorted(final.items())), "the manifest", DataError
    )
    counts = Counter(e["status"] for e in final.values())
    bad = [e for _, e in sorted(final.items()) if e["status"] == "undecodable"]
    totals = {"resized": counts["resized"], "copied": counts["copied"], "undecodable": len(bad)}
    write_output(settings_path, to_json({**settings, "complete": not bad, **totals}), "the settings file", DataError)
    for entry in bad:
        log(f"undecodable: {entry['file']}: {entry['kind']}: {entry['error']}")
    return {**totals, "bad": bad}


# ---------------------------------------------------------------------------------------------------------
# The flat validation folder -> class folders.


def devkit_labels(devkit: Path, out_dir: Path) -> list[str]:
    """The wnid of validation image 1, 2, ... from the devkit archive (read in memory: nothing is written beside
    it), and the devkit's blacklist written to `out_dir`."""
    kit = read_devkit(devkit)
    write_blacklist(kit.blacklist, f"data/{BLACKLIST} of '{devkit}'", out_dir)
    return kit.val_wnids


def devkit_blacklist(devkit: Path, out_dir: Path) -> Path:
    """The devkit's data/ILSVRC2012_validation_blacklist.txt, checked and written to `out_dir`."""
    return write_blacklist(devkit_blacklist_bytes(devkit), f"data/{BLACKLIST} of '{devkit}'", out_dir)


def sort_val(root: Path, labels: list[str] | dict[int, str], log=print) -> int:
    """Move `<root>/val/ILSVRC2012_val_N.JPEG` to `<root>/val/<wnid>/`; `labels` gives image N's wnid (a list:
    labels[N - 1]). Returns the number of files moved."""
    val = root / "val"
    if not val.is_dir():
        raise DataError(f"--sort-val: '{val}' not found (expected the validation images in <root>/val)")
    flat = sorted(p for p in val.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    # image numbers start at 1: image 0 has no label (labels[-1] would be image 50,000's)
    lookup = (lambda n: labels[n - 1] if 1 <= n <= len(labels) else None) if isinstance(labels, list) else labels.get
    moves = []
    inside = val.resolve()
    for p in flat:
        m = VAL_NAME.match(p.name)
        wnid = lookup(int(m.group(1))) if m else None
        if wnid is None:
            raise DataError(f"--sort-val: no label for '{p}' (expected ILSVRC2012_val_NNNNNNNN.JPEG of the labels)")
        # The class name comes from a file: it must name one folder inside val/, never a path out of it.
        dst = val / str(wnid) / p.name
        if not is_class_name(wnid) or dst.parent.resolve().parent != inside:
            raise DataError(
                f"--sort-val: the label of '{p.name}' is not a class folder name (expected a WordNet id such as "
                "n01440764: letters, digits, '_' or '-'); nothing was moved"
            )
        moves.append((p, dst))
    for src, dst in moves:
        dst.parent.mkdir(exist_ok=True)
        os.replace(src, dst)
    folders = sum(1 for d in val.iterdir() if d.is_dir())
    log(f"moved {len(moves)} validation image(s) into class folders; {val} has {folders} class folder(s)")
    return len(moves)


def _image_files(root: Path) -> list[str]:
    """Every image under `root`; a DataError when there is none, or when archives are still to be extracted (a
    folder of per-class tars checks as 0 files otherwise, and would pass)."""
    if not root.is_dir():
        raise DataError(f"--check: '{root}' is not a folder")
    files, archives = [], []
    for p in root.rglob("*"):
        if not p.is_file():
            continue
        if p.suffix.lower() in IMAGE_EXTENSIONS and ".tmp" not in p.name:
            files.append(str(p))
        elif p.name.lower().endswith((".tar", ".tar.gz", ".tgz", ".zip")):
            archives.append(p)
    if archives:
        raise DataError(
            f"--check: '{root}' holds {len(archives)} unextracted archive(s), e.g. "
            f"'{os.path.relpath(min(archives), root)}': make the layout with python data/prepare.py --download "
            "DOWNLOAD_FOLDER --dst ROOT"
        )
    if not files:
        raise DataError(f"--check: '{root}' holds no image (.JPEG, .jpg, .png); expected <root>/<split>/<wnid>/*.JPEG")
    return sorted(files)


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
    not_dali = [r for r in odd if r.decodable and not r.dali_reads]
    summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
    log(
        f"checked {len(reports)} files under {root}: {summary or 'none'}; {len(undecodable)} cannot be decoded, "
        f"{len(not_dali)} would stop data.backend=dali (a format its decoders do not read)"
    )
    if out is not None:
        write_output(out, "kind\tfile\tdetail\n" + "".join(line + "\n" for line in lines), "--out", DataError)
    return odd


def _download(ap: argparse.ArgumentParser, args) -> int:
    """--download FOLDER --dst ROOT [--short-side N]: the layout, the blacklist and the copy ROOT-N in one go."""
    if args.dst is None:
        ap.error("--download needs --dst ROOT (where the train/ and val/ class folders are written)")
    if args.devkit is not None and args.blacklist is not None:
        ap.error("--blacklist: the devkit already holds the blacklist (give one of the two)")
    if args.short_side is not None and args.short_side < 8:
        ap.error(f"--short-side: expected at least 8 pixels, got {args.short_side}")
    done = from_download(args.download, args.dst, devkit=args.devkit, blacklist=args.blacklist)
    if not done["blacklist"]:
        print(
            f"warning: no {BLACKLIST} written: Kaggle's download does not hold it; rerun with --devkit ARCHIVE or "
            "--blacklist FILE (the record configs count accuracy without the blacklisted images)",
            file=sys.stderr,
        )
    if args.short_side is None:
        return 0
    copy = Path(f"{args.dst}-{args.short_side}")  # where a phase's `root: 'N'` finds it (<data.root>-N)
    result = prepare(args.dst, copy, args.short_side, splits=args.splits, quality=args.quality, workers=args.workers)
    print(f"wrote {copy}: {result['resized']} resized, {result['copied']} copied, {result['undecodable']} undecodable")
    return 1 if result["bad"] and not args.skip_corrupt else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, help="dataset root with train/ (and val/) in ImageNet folder layout")
    ap.add_argument("--dst", type=Path, help="where the resized copy goes (created; resumed when it exists)")
    ap.add_argument("--short-side", type=int, help="shorter side of the copies, in pixels (never enlarged)")
    ap.add_argument("--splits", nargs="+", default=["train"], help="splits to copy (default: train)")
    ap.add_argument("--quality", type=int, default=90, help="JPEG quality of re-encoded images")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (default: all cores)")
    ap.add_argument("--skip-corrupt", action="store_true", help="exit 0 even if some source files cannot be decoded")
    ap.add_argument(
        "--download",
        type=Path,
        metavar="FOLDER",
        help="ImageNet as downloaded (image-net.org's tars + devkit, Kaggle's tree or zip) -> the layout in --dst",
    )
    ap.add_argument("--check", type=Path, metavar="ROOT", help="inspect every image under ROOT instead of copying")
    ap.add_argument("--out", type=Path, help="--check: also write the list as TSV to this file")
    ap.add_argument("--sort-val", type=Path, metavar="ROOT", help="move ROOT/val's flat images into class folders")
    ap.add_argument(
        "--devkit", type=Path, help="--sort-val/--download: ILSVRC2012_devkit_t12.tar.gz (labels, blacklist)"
    )
    ap.add_argument("--val-solution", type=Path, help="--sort-val: Kaggle's LOC_val_solution.csv (labels)")
    ap.add_argument(
        "--blacklist",
        type=Path,
        help="--sort-val --val-solution, --download of Kaggle's: the devkit's ILSVRC2012_validation_blacklist.txt "
        "(or give --devkit): written beside the sorted set, as the devkit route writes it",
    )
    args = ap.parse_args(argv)
    try:
        if args.download is not None:
            return _download(ap, args)
        if args.sort_val is not None:
            if args.devkit is None and args.val_solution is None:
                ap.error("--sort-val needs --devkit or --val-solution")
            if args.blacklist is not None and args.devkit is not None:
                ap.error("--blacklist: the devkit already holds the blacklist (give one of the two)")
            if args.val_solution is not None:
                found = solution_labels(args.val_solution)
                if args.devkit is not None:
                    devkit_blacklist(args.devkit, args.sort_val)
                elif args.blacklist is not None:
                    if not args.blacklist.is_file():
                        raise DataError(f"--blacklist: '{args.blacklist}' not found")
                    write_blacklist(read_blacklist(args.blacklist), f"--blacklist '{args.blacklist}'", args.sort_val)
            else:
                found = devkit_labels(args.devkit, args.sort_val)
            sort_val(args.sort_val, found)
            if (args.sort_val / BLACKLIST).is_file():
                print(f"wrote {args.sort_val / BLACKLIST} (data.val_blacklist: {BLACKLIST})")
            else:
                print(
                    f"warning: no {BLACKLIST} written: the record configs count accuracy without the devkit's "
                    "blacklisted images (data.val_blacklist); rerun with --blacklist FILE or --devkit ARCHIVE",
                    file=sys.stderr,
                )
            return 0
        if args.check is not None:
            if args.out is not None:
                check_target(args.out, "--out", DataError)  # before the hours of inspection, not after
            odd = check(args.check, args.workers, args.out)
            return 1 if any(not r.dali_reads for r in odd) else 0
        if args.src is None or args.dst is None:
            ap.error("--src and --dst are required (or --check ROOT)")
        if args.short_side is None:
            ap.error("--short-side is required (the copy's shorter side, e.g. 160 for the 96 and 128 px phases)")
        if args.short_side < 8:
            ap.error(f"--short-side: expected at least 8 pixels, got {args.short_side}")
        if not 1 <= args.quality <= 100:
            ap.error(f"--quality: expected 1..100, got {args.quality}")
        if args.src.resolve() == args.dst.resolve():
            ap.error("--dst must differ from --src")
        result = prepare(
            args.src, args.dst, args.short_side, splits=args.splits, quality=args.quality, workers=args.workers
        )
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # at the edges: a destination that vanished, a file system that filled or went read-only
        where = f" '{e.filename}'" if e.filename else ""
        print(
            f"error: cannot read or write{where}: {e.strerror or e}; check the path, its permissions and free space",
            file=sys.stderr,
        )
        return 2
    print(
        f"wrote {args.dst}: {result['resized']} resized, {result['copied']} copied, {result['undecodable']} undecodable"
    )
    if result["bad"] and not args.skip_corrupt:
        print(
            f"error: {len(result['bad'])} source file(s) cannot be decoded (listed above); they are not in the "
            "copy. Rerun with --skip-corrupt to accept that.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
