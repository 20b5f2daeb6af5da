"""ImageNet as downloaded -> the folder layout the loaders read (`<dst>/{train,val}/<wnid>/*.JPEG`) and the blacklist.

Two downloads are read as they are:
- image-net.org's: ILSVRC2012_img_train.tar (a tar of 1,000 per-class tars, <wnid>.tar), ILSVRC2012_img_val.tar
  (50,000 flat images) and ILSVRC2012_devkit_t12.tar.gz (labels of the validation images, and the blacklist);
- Kaggle's (imagenet-object-localization-challenge): the tree ILSVRC/Data/CLS-LOC/{train/<wnid>,val} with
  LOC_synset_mapping.txt and LOC_val_solution.csv beside ILSVRC/, or the zip that holds them.

Tars are read in streaming mode (one pass, nothing extracted first), so a 140 GB train tar needs no second copy on
disk. Every member must be a regular file with a plain name (no folders in it, no links, no devices): nothing is
ever written outside <dst>. Each image is written to a temporary name and renamed, and each finished class of the
train tar leaves a marker in <dst>/.prepare-progress/, so a rerun after an interruption skips the finished classes
(they are still read past: a tar stream cannot seek) and redoes the rest.

The labels of the validation images and the blacklist are read by data/labels.py (the devkit in memory, Kaggle's
solution CSV); this module places the images and writes the blacklist beside them.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
import tarfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from base import reader
from base.errors import DataError
from base.writer import open_new, refuse_irregular, write_output
from data.labels import (
    BLACKLIST,
    DEVKIT,
    KAGGLE_SOLUTION,
    READ_ERRORS,
    TEXT_BYTES,
    VAL_NAME,
    devkit_blacklist_bytes,
    is_class_name,
    parse_solution,
    read_blacklist,
    read_devkit,
    write_blacklist,
)

TRAIN_TAR = "ILSVRC2012_img_train.tar"
VAL_TAR = "ILSVRC2012_img_val.tar"
KAGGLE_ROOT = "ILSVRC/Data/CLS-LOC"
KAGGLE_ZIP = "imagenet-object-localization-challenge.zip"
KAGGLE_MAPPING = "LOC_synset_mapping.txt"
PROGRESS = ".prepare-progress"  # per-class completion markers, inside <dst> (the loaders read train/ and val/ only)

_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
# One image of ImageNet is at most ~15 MB (train) and ~4 MB (val); a member declared larger is not an ImageNet image,
# and a gzip'd archive that inflates past RATIO times the bytes read is not ImageNet's (JPEGs do not compress):
# with these bounds a small archive cannot fill the disk or memory.
MAX_IMAGE_BYTES = 64 << 20
RATIO = 4
_SLACK = 256 << 20  # the budget's allowance before the ratio takes hold (headers, a first large class)
# Zip compression methods Python reads (stored, deflate, bzip2, lzma); Deflate64 (9) and the rest are refused.
_ZIP_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate", zipfile.ZIP_BZIP2: "bzip2"}
_ZIP_METHODS[zipfile.ZIP_LZMA] = "lzma"


def make_folder(path: Path, what: str) -> Path:
    """`path` as a folder (made with its parents when missing); one DataError line when it cannot be: a file in the
    way, a read-only file system, no permission."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise DataError(f"{what}: '{path}' exists and is not a folder: give a folder (or a new name)") from None
    except OSError as e:
        raise DataError(
            f"{what}: cannot create the folder '{path}': {e.strerror or e}; choose a writable place with free space"
        ) from None
    return path


# ---------------------------------------------------------------------------------------------------------
# Writing files, safely and resumably


class Progress:
    """One status line (rewritten in place on a terminal, a line every 30 s in a log): share of the archive read,
    classes and images written, throughput and time left."""

    def __init__(self, what: str, total_bytes: int, *, stream=None, by_class: bool = False):
        """`by_class`: the archive is written class by class (train), so the line counts classes; else images."""
        self.what, self.total, self.stream = what, max(total_bytes, 1), stream or sys.stderr
        self.by_class = by_class
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = self.last = time.monotonic()
        self.classes = self.images = self.skipped = self.bytes = 0

    def line(self, pos: int) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-6)
        share = min(pos / self.total, 1.0)
        eta = elapsed * (1 - share) / share if share > 0 else 0.0
        done = f"{self.classes} class(es) done ({self.skipped} from an earlier run), " if self.by_class else ""
        earlier = f" ({self.skipped:,} from an earlier run)" if self.skipped and not self.by_class else ""
        return (
            f"{self.what}: {100 * share:5.1f}% of {self.total / 1e9:.2f} GB, {done}{self.images:,} image(s) "
            f"written{earlier}, {pos / elapsed / 1e6:.0f} MB/s, {eta / 60:.0f} min left"
        )

    def update(self, pos: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= (0.5 if self.tty else 30.0):
            self.last = now
            end = "" if self.tty and not force else "\n"
            print(("\r" if self.tty else "") + self.line(pos), end=end, file=self.stream, flush=True)


def _plain_name(name: str, archive: str) -> str:
    """A member's name as one plain file name, or a DataError: nothing is extracted outside the destination."""
    plain = name[2:] if name.startswith("./") else name
    if _FILE_NAME.fullmatch(plain) is None:
        raise DataError(
            f"'{archive}': member {ascii(name[:120])} is not a plain file name (a path or odd characters); "
            "refusing to extract it, nothing was written outside the destination"
        )
    return plain


def _check_file_member(member: tarfile.TarInfo, archive: str, max_bytes: int | None = None) -> None:
    if member.isfile() and member.issparse():  # holes read back as zeros: 20 KB of archive can declare 2 GiB
        raise DataError(
            f"'{archive}': member {ascii(member.name[:120])} is a sparse file; an ImageNet archive holds only "
            "image files, refusing to extract it"
        )
    if max_bytes is not None and member.size > max_bytes:
        raise DataError(
            f"'{archive}': member {ascii(member.name[:120])} declares {member.size:,} bytes: an ImageNet image is at "
            f"most {max_bytes:,}; refusing to extract it"
        )
    if not member.isfile():
        kind = "link" if member.issym() or member.islnk() else "device or special file"
        raise DataError(
            f"'{archive}': member {ascii(member.name[:120])} is a {kind}; an ImageNet archive holds only image "
            "files, refusing to extract it"
        )


def _write_atomic(src, out: Path) -> int:
    """Copy the file object `src` to `out` through a temporary name (a file that exists is complete)."""
    refuse_irregular(out, "an image", DataError)  # a regular file or nothing: never replace a FIFO or a device
    tmp = out.with_name(out.name + ".tmp")
    tmp.unlink(missing_ok=True)  # a leftover of an interrupted run (or a planted link: never written through)
    with open_new(tmp, "an image", DataError) as f:
        shutil.copyfileobj(src, f, 1 << 20)
    os.replace(tmp, out)
    return out.stat().st_size


def _within_budget(written: int, read: int, archive: str, unfinished: list[Path] = ()) -> None:
    """Raise DataError when the bytes extracted outgrow the archive's bytes read (a compression bomb), after removing
    `unfinished`: the images of the part not yet marked done (a refused bomb left hundreds of MB behind)."""
    if written > RATIO * read + _SLACK:
        for path in unfinished:
            path.unlink(missing_ok=True)
        raise DataError(
            f"'{archive}': {written:,} bytes extracted from {read:,} bytes read, over {RATIO}x: ImageNet's JPEGs do "
            "not compress that well; refusing to extract more (a compression bomb, or not ImageNet's archive)"
        )


def _members(tar: tarfile.TarFile, archive: str, max_bytes: int | None = None) -> Iterator[tarfile.TarInfo]:
    """The file members of a tar stream (folders skipped), each checked to be a regular file."""
    for member in tar:
        if member.isdir():
            continue
        _check_file_member(member, archive, max_bytes)
        yield member


def extract_train(train_tar: Path, dst: Path, *, stream=None) -> int:
    """The tar of per-class tars -> <dst>/train/<wnid>/; returns the number of classes in <dst>/train."""
    marks = make_folder(dst / PROGRESS / "train", "--dst")
    progress = Progress("train", train_tar.stat().st_size, stream=stream, by_class=True)
    where = str(train_tar)
    with open(train_tar, "rb") as raw:
        try:
            with tarfile.open(fileobj=raw, mode="r|*") as outer:
                for member in _members(outer, where):
                    name = _plain_name(member.name, where)
                    wnid = name[: -len(".tar")]
                    if not name.endswith(".tar") or not is_class_name(wnid):
                        raise DataError(
                            f"'{where}': member {ascii(name)} is not a per-class tar (<wnid>.tar); expected "
                            f"{TRAIN_TAR} from image-net.org"
                        )
                    refuse_irregular(marks / wnid, "a progress marker", DataError)  # a link never marks a class
                    if (marks / wnid).is_file():
                        progress.classes += 1
                        progress.skipped += 1
                        continue
                    folder = make_folder(dst / "train" / wnid, "--dst")
                    inner_where = f"{where}: {name}"
                    written, unfinished = 0, []
                    with tarfile.open(fileobj=outer.extractfile(member), mode="r|") as inner:
                        for im in _members(inner, inner_where, MAX_IMAGE_BYTES):
                            unfinished.append(folder / _plain_name(im.name, inner_where))
                            progress.bytes += _write_atomic(inner.extractfile(im), unfinished[-1])
                            _within_budget(progress.bytes, raw.tell(), where, unfinished)
                            written += 1
                            progress.images += 1
                            progress.update(raw.tell())
                    if written == 0:
                        raise DataError(f"'{inner_where}' holds no images")
                    write_output(marks / wnid, f"{written}\n", "a progress marker", DataError)
                    progress.classes += 1
                    progress.update(raw.tell())
        except READ_ERRORS as e:
            raise DataError(
                f"'{where}' cannot be read past {raw.tell():,} bytes ({e}): truncated or not a tar; the classes "
                "finished so far are kept, a rerun resumes"
            ) from None
    progress.update(train_tar.stat().st_size, force=True)
    if not (dst / "train").is_dir():
        raise DataError(f"'{where}' holds no per-class tars (<wnid>.tar): expected {TRAIN_TAR} from image-net.org")
    return sum(1 for d in (dst / "train").iterdir() if d.is_dir())


def _val_destination(name: str, labels: Callable[[int], str | None], where: str) -> tuple[str, str]:
    m = VAL_NAME.match(name)
    wnid = labels(int(m.group(1))) if m else None
    if wnid is None:
        raise DataError(f"'{where}': no label for {ascii(name)} (expected ILSVRC2012_val_NNNNNNNN.JPEG of the labels)")
    if not is_class_name(wnid):
        raise DataError(f"the label of {ascii(name)} is not a class folder name (expected a WordNet id)")
    return wnid, name


def extract_val(val_tar: Path, dst: Path, val_wnids: list[str], *, stream=None) -> int:
    """The flat validation tar -> <dst>/val/<wnid>/ (labels from the devkit); returns the images written."""
    done = dst / PROGRESS / "val"
    refuse_irregular(done, "a progress marker", DataError)  # before the extraction, not after it
    if done.is_file():
        return 0
    progress = Progress("val", val_tar.stat().st_size, stream=stream)
    where = str(val_tar)
    labels = lambda n: val_wnids[n - 1] if 1 <= n <= len(val_wnids) else None  # noqa: E731
    unfinished: list[Path] = []  # this run's images (the split is marked done only at the end)
    with open(val_tar, "rb") as raw:
        try:
            with tarfile.open(fileobj=raw, mode="r|*") as tar:
                for member in _members(tar, where, MAX_IMAGE_BYTES):
                    wnid, name = _val_destination(_plain_name(member.name, where), labels, where)
                    out = dst / "val" / wnid / name
                    if out.is_file() and out.stat().st_size == member.size:
                        progress.skipped += 1  # written by an interrupted run (files appear complete or not at all)
                        continue
                    make_folder(out.parent, "--dst")
                    unfinished.append(out)
                    progress.bytes += _write_atomic(tar.extractfile(member), out)
                    _within_budget(progress.bytes, raw.tell(), where, unfinished)
                    progress.images += 1
                    progress.update(raw.tell())
        except READ_ERRORS as e:
            raise DataError(
                f"'{where}' cannot be read past {raw.tell():,} bytes ({e}): truncated or not a tar"
            ) from None
    make_folder(done.parent, "--dst")
    write_output(done, f"{progress.images}\n", "a progress marker", DataError)
    progress.update(val_tar.stat().st_size, force=True)
    return progress.images


# ---------------------------------------------------------------------------------------------------------
# Kaggle's tree or zip


@dataclass(frozen=True)
class _Entry:
    split: str  # train or val
    parts: tuple[str, ...]  # (wnid, file) for train, (file,) for val
    size: int
    open: Callable


def _kaggle_entry(rel: str, size: int, opener, where: str) -> _Entry | None:
    """One file of CLS-LOC (path relative to it) as an entry, None for what the layout does not use (test/)."""
    parts = tuple(rel.split("/"))
    if parts[0] == "train" and len(parts) == 3 and is_class_name(parts[1]):
        return _Entry("train", (parts[1], _plain_name(parts[2], where)), size, opener)
    if parts[0] == "val" and len(parts) == 2:
        return _Entry("val", (_plain_name(parts[1], where),), size, opener)
    if parts[0] in ("train", "val"):
        raise DataError(f"'{where}': {ascii(rel[:120])} is not {parts[0]}'s layout in Kaggle's CLS-LOC")
    return None


def _kaggle_tree(base: Path) -> tuple[list[_Entry], bytes, bytes]:
    root = base / KAGGLE_ROOT
    entries = []
    for split in ("train", "val"):
        for path in sorted((root / split).rglob("*")):
            st = path.lstat()
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                raise DataError(f"'{path}' is a link or special file; Kaggle's tree holds only image files")
            entry = _kaggle_entry(
                path.relative_to(root).as_posix(), st.st_size, lambda p=path: open(p, "rb"), str(root)
            )
            entries.append(entry)
    texts = []
    for name in (KAGGLE_SOLUTION, KAGGLE_MAPPING):
        if not (base / name).is_file():
            raise DataError(f"'{base}' has {KAGGLE_ROOT} but no {name} beside ILSVRC/ (Kaggle's download has both)")
        texts.append(reader.read_bytes(base / name, what=name, error=DataError, max_bytes=TEXT_BYTES))
    return entries, texts[0], texts[1]


def _kaggle_zip(zf: zipfile.ZipFile, where: str) -> tuple[list[_Entry], bytes, bytes]:
    entries, texts, declared = [], {}, 0
    for info in zf.infolist():
        if info.is_dir():
            continue
        name = ascii(info.filename[:120])
        if stat.S_IFMT(info.external_attr >> 16) not in (0, stat.S_IFREG):
            raise DataError(f"'{where}': member {name} is a link or special file; refusing it")
        if info.flag_bits & 0x1:
            raise DataError(f"'{where}': member {name} is encrypted: expected Kaggle's zip as downloaded")
        if info.compress_type not in _ZIP_METHODS:
            raise DataError(
                f"'{where}': member {name} uses compression method {info.compress_type} (Deflate64 is 9), which "
                f"Python cannot read: expected {'/'.join(_ZIP_METHODS.values())}; unzip it and give the folder"
            )
        text = info.filename in (KAGGLE_SOLUTION, KAGGLE_MAPPING)
        limit = TEXT_BYTES if text else MAX_IMAGE_BYTES
        if info.file_size > limit:
            raise DataError(f"'{where}': member {name} declares {info.file_size:,} bytes: expected at most {limit:,}")
        declared += info.file_size
        if text:
            texts[info.filename] = zf.read(info)
        elif info.filename.startswith(KAGGLE_ROOT + "/"):
            rel = info.filename[len(KAGGLE_ROOT) + 1 :]
            entry = _kaggle_entry(rel, info.file_size, lambda i=info: zf.open(i), where)
            if entry is not None:
                entries.append(entry)
    _within_budget(declared, os.path.getsize(where), where)  # from the zip's own directory, before a byte is inflated
    missing = [n for n in (KAGGLE_SOLUTION, KAGGLE_MAPPING) if n not in texts]
    if missing or not entries:
        raise DataError(f"'{where}' is not Kaggle's ImageNet zip: no {', '.join(missing) or KAGGLE_ROOT + '/'} in it")
    return entries, texts[KAGGLE_SOLUTION], texts[KAGGLE_MAPPING]


def place_kaggle(entries: list[_Entry], solution: bytes, mapping: bytes, dst: Path, where: str, *, stream=None) -> int:
    """Kaggle's files -> <dst>/{train,val}/<wnid>/; a file already there with the same size is kept (resume)."""
    try:
        labels = parse_solution(solution.decode("utf-8"), f"{where}: {KAGGLE_SOLUTION}")
        known = {line.split()[0] for line in mapping.decode("utf-8").splitlines() if line.strip()}
    except UnicodeDecodeError:
        raise DataError(f"'{where}': {KAGGLE_SOLUTION} or {KAGGLE_MAPPING} is not UTF-8 text") from None
    progress = Progress("kaggle", sum(e.size for e in entries), stream=stream)
    pos = 0
    for entry in entries:
        if entry.split == "train":
            wnid, name = entry.parts
        else:
            wnid, name = _val_destination(entry.parts[0], labels.get, where)
        if wnid not in known:
            raise DataError(f"'{where}': class {ascii(wnid)} ({entry.split}) is not in {KAGGLE_MAPPING}")
        out = dst / entry.split / wnid / name
        pos += entry.size
        if out.is_file() and out.stat().st_size == entry.size:
            progress.skipped += 1
            continue
        make_folder(out.parent, "--dst")
        try:
            with entry.open() as f:
                _write_atomic(f, out)
        except READ_ERRORS as e:
            raise DataError(f"'{where}': cannot read {entry.split}/{'/'.join(entry.parts)} ({e})") from None
        progress.images += 1
        progress.update(pos)
    progress.update(pos, force=True)
    return progress.images


# ---------------------------------------------------------------------------------------------------------
# One command


def from_download(
    src: Path, dst: Path, *, devkit: Path | None = None, blacklist: Path | None = None, log=print, stream=None
) -> dict:
    """Whichever download `src` holds (folder or Kaggle zip) -> the layout in `dst`, with the blacklist when the
    devkit (or --blacklist) gives it. Returns what was done."""
    if src.resolve() == dst.resolve():
        raise DataError("--dst must differ from --download (the layout is written beside the download, not into it)")
    zip_path = src if src.is_file() else src / KAGGLE_ZIP
    make_folder(dst, "--dst")
    if src.is_dir() and ((src / TRAIN_TAR).exists() or (src / VAL_TAR).exists()):
        missing = [n for n in (TRAIN_TAR, VAL_TAR) if not (src / n).is_file()]
        kit = devkit or src / DEVKIT
        if missing or not kit.is_file():
            raise DataError(
                f"'{src}': image-net.org's download needs {TRAIN_TAR}, {VAL_TAR} and {DEVKIT} (or --devkit); "
                f"missing: {', '.join(missing + ([] if kit.is_file() else [str(kit)]))}"
            )
        labels = read_devkit(kit)  # first: a bad devkit stops the command before hours of extraction
        classes = extract_train(src / TRAIN_TAR, dst, stream=stream)
        val = extract_val(src / VAL_TAR, dst, labels.val_wnids, stream=stream)
        write_blacklist(labels.blacklist, f"data/{BLACKLIST} of '{kit}'", dst)
        log(f"wrote {dst}: {classes} class folder(s) in train/, {val} validation image(s) placed, {BLACKLIST}")
        return {"route": "image-net.org", "classes": classes, "blacklist": True}
    if src.is_dir() and (src / KAGGLE_ROOT).is_dir():
        route, (entries, solution, mapping) = "kaggle tree", _kaggle_tree(src)
        written = place_kaggle(entries, solution, mapping, dst, str(src), stream=stream)
    elif zip_path.is_file() and zipfile.is_zipfile(zip_path):
        with zipfile.ZipFile(zip_path) as zf:
            route, (entries, solution, mapping) = "kaggle zip", _kaggle_zip(zf, str(zip_path))
            written = place_kaggle(entries, solution, mapping, dst, str(zip_path), stream=stream)
    else:
        raise DataError(
            f"--download '{src}': expected a folder with {TRAIN_TAR}, {VAL_TAR} and {DEVKIT} (image-net.org), "
            f"a folder with Kaggle's {KAGGLE_ROOT} and {KAGGLE_SOLUTION}, or Kaggle's {KAGGLE_ZIP}"
        )
    if devkit is not None:
        write_blacklist(devkit_blacklist_bytes(devkit), f"data/{BLACKLIST} of '{devkit}'", dst)
    elif blacklist is not None:
        if not blacklist.is_file():
            raise DataError(f"--blacklist: '{blacklist}' not found")
        write_blacklist(read_blacklist(blacklist), f"--blacklist '{blacklist}'", dst)
    classes = sum(1 for d in (dst / "train").iterdir() if d.is_dir()) if (dst / "train").is_dir() else 0
    log(f"wrote {dst} from {route}: {classes} class folder(s) in train/, {written} file(s) written")
    return {"route": route, "classes": classes, "blacklist": (dst / BLACKLIST).is_file()}
