"""Scanning a dataset in ImageNet folder layout (`<root>/<split>/<wnid>/*.JPEG`) with clear errors."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from base import reader
from base.errors import DataError

IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png")

__all__ = ["IMAGE_EXTENSIONS", "DataError", "Split", "scan_split"]


@dataclass(frozen=True)
class Split:
    root: Path
    classes: list[str]  # sorted wnids; label = index
    files: list[str]  # absolute paths
    labels: list[int]
    excluded: int = 0  # images left out of this split (validation blacklist), not counted

    def __len__(self) -> int:
        return len(self.files)


def _list(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError as e:  # PermissionError on an unreadable folder, EIO on a failing disk...
        raise DataError(f"cannot list '{folder}': {e.strerror or e}") from None


def scan_split(root: str | Path, split: str, classes: list[str] | None = None) -> Split:
    """List `<root>/<split>`; `classes` pins the label mapping (validation must reuse training's)."""
    base = Path(root)
    if not base.is_dir():
        raise DataError(f"dataset root '{base}' does not exist (set data.root or run `make sample`)")
    folder = base / split
    if not folder.is_dir():
        raise DataError(f"'{folder}' not found: expected '{split}/<class>/*.JPEG' under data.root '{base}'")
    entries = _list(folder)
    found = sorted(d.name for d in entries if d.is_dir())
    loose = sorted(p.name for p in entries if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    if loose:
        # Never left out silently: an unsorted (flat) validation folder would be evaluated on nothing, or a part.
        hint = " (sort them: python data/prepare.py --sort-val ROOT ...)" if split == "val" else ""
        raise DataError(
            f"'{folder}' has {len(loose)} image file(s) outside class folders, e.g. '{loose[0]}'; images must be in "
            f"'{split}/<class>/'{hint}"
        )
    if not found:
        raise DataError(f"'{folder}' has no class folders")
    if classes is None:
        classes = found
    else:
        unknown = sorted(set(found) - set(classes))
        if unknown:
            raise DataError(f"'{folder}' has class folders missing from train/: {', '.join(unknown[:5])}")
    index = {c: i for i, c in enumerate(classes)}
    files, labels = [], []
    for wnid in found:
        names = sorted(p for p in _list(folder / wnid) if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
        if not names:
            raise DataError(f"class folder '{folder / wnid}' is empty (no .JPEG/.jpg/.png files)")
        files.extend(str(p) for p in names)
        labels.extend([index[wnid]] * len(names))
    return Split(folder, list(classes), files, labels)


_MAX_BLACKLIST_BYTES = 1 << 20
_INDEX = re.compile(r"[0-9]{1,9}")  # the devkit's list is 9 kB (1,762 indices of 50,000)


def distinct_files(folder: str | Path) -> int:
    """How many distinct images the files in `folder`'s class folders are: distinct files (device and inode, links
    followed) with distinct contents (size and a hash of the first 8 KiB, where a JPEG's entropy-coded data has
    begun), so a folder of 50,000 links to, or copies of, one image is 1, and ImageNet's validation set 50,000.

    Only the loader's own layout is read, `<folder>/<class>/<image>`, two levels: a class folder may be a link (as
    the loader allows), but nothing deeper is entered, so links to `..` cannot make the walk endless (it ran
    forever, at the end of a run, before the run's entry was written)."""
    seen, contents = set(), set()
    try:
        classes = sorted(e.path for e in os.scandir(folder) if e.is_dir())
    except OSError:
        return 0  # no folder to count: the loader reports it
    for dirpath in classes:
        try:
            names = sorted(e.name for e in os.scandir(dirpath) if not e.is_dir())
        except OSError:
            continue
        for name in names:
            if name.lower().endswith(IMAGE_EXTENSIONS):
                path = os.path.join(dirpath, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue  # a dangling link is no image: the loader reports it
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                try:
                    head = reader.read_bytes(path, what="validation image", error=DataError, head=8192)
                except DataError:
                    continue  # not a regular file, or unreadable: the loader reports it
                contents.add((st.st_size, hashlib.sha1(head).digest()))
    return len(contents)


def read_blacklist(path: str | Path) -> list[int]:
    """The devkit's ILSVRC2012_validation_blacklist.txt: one 1-based index into the sorted val file names a line."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"data.val_blacklist: '{p}' not found (the devkit's data/ILSVRC2012_validation_blacklist.txt)")
    # Errors say what is wrong with the file, never what it holds: data.val_blacklist may name any readable file.
    expected = "one 1-based image index a line (the devkit's data/ILSVRC2012_validation_blacklist.txt)"
    try:
        # a regular file (a FIFO or device would hang or never end), at most 1 MiB, strict UTF-8
        text = reader.read_text(p, what="data.val_blacklist:", error=DataError, max_bytes=_MAX_BLACKLIST_BYTES)
    except DataError as e:
        raise DataError(f"{e}; expected {expected}") from None
    out: dict[int, int] = {}  # index -> line
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            if not _INDEX.fullmatch(line.strip()):  # ASCII digits: str.isdigit() takes '³', which int() refuses
                raise DataError(f"data.val_blacklist: '{p}' line {n} is not an image index; expected {expected}")
            index = int(line)
            if index in out:  # each image is listed once: a repeat is a list that is not the devkit's
                raise DataError(
                    f"data.val_blacklist: '{p}' line {n} repeats the index of line {out[index]}; expected each "
                    "image once (the devkit's data/ILSVRC2012_validation_blacklist.txt)"
                )
            out[index] = n
    return list(out)


def drop_blacklisted(split: Split, path: str | Path) -> tuple[Split, int]:
    """`split` without the blacklisted images, and how many were dropped.

    Index i names the i-th of the validation file names in sorted order (ILSVRC2012_val_00000001.JPEG = 1), the
    order of the flat folder the devkit numbers, wherever the files sit in class folders."""
    indices = read_blacklist(path)
    order = sorted(range(len(split)), key=lambda j: Path(split.files[j]).name)
    bad = [i for i in indices if not 1 <= i <= len(order)]
    if bad:
        raise DataError(
            f"data.val_blacklist: '{path}' names image {bad[0]}, but '{split.root}' has {len(order)} images "
            "(the blacklist is for the full 50,000-image ImageNet validation set)"
        )
    drop = {order[i - 1] for i in indices}
    keep = [j for j in range(len(split)) if j not in drop]
    if not keep:
        raise DataError(
            f"data.val_blacklist: '{path}' excludes every one of the {len(split)} images of '{split.root}': no "
            "accuracy can be computed (use the devkit's list with the full validation set, or '' to count every image)"
        )
    kept = Split(split.root, split.classes, [split.files[j] for j in keep], [split.labels[j] for j in keep], len(drop))
    return kept, len(drop)


def blacklist_path(root: str | Path, path: str) -> Path:
    """data.val_blacklist as a path: relative paths are read against data.root (where data/prepare.py puts it)."""
    p = Path(path)
    return p if p.is_absolute() else Path(root) / p
