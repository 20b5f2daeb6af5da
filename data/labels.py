"""Which class each validation image is, and which images to leave out, as ImageNet's downloads say.

image-net.org's ILSVRC2012_devkit_t12.tar.gz holds both (data/meta.mat with scipy.io, the ground truth and the
blacklist), read here in memory: nothing is written beside the archive, which may sit on a read-only share. Kaggle's
LOC_val_solution.csv gives the labels alone; a blacklist comes from the devkit or from a file of the user's. The
extraction (data/download.py) and the sorting of a validation folder (data/prepare.py) both take their labels here.
"""

from __future__ import annotations

import csv
import io
import re
import tarfile
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from base import reader
from base.errors import DataError
from base.writer import write_output

DEVKIT = "ILSVRC2012_devkit_t12.tar.gz"
KAGGLE_SOLUTION = "LOC_val_solution.csv"
BLACKLIST = "ILSVRC2012_validation_blacklist.txt"

VAL_NAME = re.compile(r"^ILSVRC2012_val_(\d{8})\.JPEG$", re.IGNORECASE)
_CLASS_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")
# Kaggle's LOC_val_solution.csv is 2.3 MB and LOC_synset_mapping.txt 31 KB: a text member or file above this is not
# theirs, and is refused before it is read (a small zip can inflate a CSV to gigabytes).
TEXT_BYTES = 16 << 20
READ_ERRORS = (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, OSError, NotImplementedError)
_ID = re.compile(r"[0-9]{1,6}")  # an ILSVRC2012_ID (1..1000 in the real devkit): ASCII digits only, never '²' or '٢'


def is_class_name(name) -> bool:
    return isinstance(name, str) and _CLASS_NAME.fullmatch(name) is not None


def read_blacklist(path: Path) -> bytes:
    """The bytes of a user's blacklist file (a regular file of at most 1 MiB: 50,000 numbers take 290 KB)."""
    return reader.read_bytes(path, what="--blacklist", error=DataError, max_bytes=1 << 20)


def write_blacklist(data: bytes, source: str, out_dir: Path) -> Path:
    """Check a blacklist (one image number in 1..50000 a line) and write it to `out_dir` as data.val_blacklist
    reads it; the same file whichever route sorted the validation set."""
    try:
        words = data.decode("utf-8").split()
    except UnicodeDecodeError:
        words = ["not UTF-8"]
    if not all(_ID.fullmatch(w) for w in words):  # ASCII digits: int() takes '٢' as 2
        raise DataError(f"{source}: expected one image number (1..50000) a line")
    numbers = [int(w) for w in words]
    if not numbers or not all(1 <= n <= 50_000 for n in numbers) or len(set(numbers)) != len(numbers):
        raise DataError(f"{source}: expected distinct image numbers in 1..50000, one a line")
    out = out_dir / BLACKLIST
    write_output(out, "".join(f"{n}\n" for n in numbers), "the validation blacklist", DataError)
    return out


@dataclass(frozen=True)
class Devkit:
    val_wnids: list[str]  # the wnid of validation image 1, 2, ...
    blacklist: bytes  # data/ILSVRC2012_validation_blacklist.txt as it is


def _devkit_member(tar: tarfile.TarFile, devkit: Path, name: str) -> bytes:
    member = next((m for m in tar.getmembers() if m.name.endswith("/data/" + name) or m.name == "data/" + name), None)
    if member is None or not member.isfile() or member.issparse():
        raise DataError(f"--devkit: '{devkit}' has no data/{name} (expected {DEVKIT} from image-net.org)")
    if member.size > TEXT_BYTES:  # the real meta.mat is 2 MB, the ground truth 270 KB
        raise DataError(
            f"--devkit: data/{name} of '{devkit}' declares {member.size:,} bytes: expected at most {TEXT_BYTES:,} "
            f"(not {DEVKIT} from image-net.org)"
        )
    return tar.extractfile(member).read(TEXT_BYTES + 1)


def devkit_blacklist_bytes(devkit: Path) -> bytes:
    """Only data/ILSVRC2012_validation_blacklist.txt of the devkit (what Kaggle's route takes from it)."""
    if not devkit.is_file():
        raise DataError(f"--devkit: '{devkit}' not found (expected {DEVKIT} from image-net.org)")
    try:
        with tarfile.open(devkit, "r:*") as tar:
            return _devkit_member(tar, devkit, BLACKLIST)
    except READ_ERRORS as e:
        raise DataError(f"--devkit: '{devkit}' is not a readable tar archive ({e}); expected {DEVKIT}") from None


def read_devkit(devkit: Path) -> Devkit:
    """The labels and blacklist of ILSVRC2012_devkit_t12.tar.gz, read in memory. The IDs in meta.mat are not in
    wnid order: image N's class is the leaf synset whose ILSVRC2012_ID is line N of the ground truth."""
    import scipy.io

    if not devkit.is_file():
        raise DataError(f"--devkit: '{devkit}' not found (expected {DEVKIT} from image-net.org)")
    try:
        with tarfile.open(devkit, "r:*") as tar:
            mat = _devkit_member(tar, devkit, "meta.mat")
            truth = _devkit_member(tar, devkit, "ILSVRC2012_validation_ground_truth.txt")
            blacklist = _devkit_member(tar, devkit, BLACKLIST)
    except READ_ERRORS as e:
        raise DataError(f"--devkit: '{devkit}' is not a readable tar archive ({e}); expected {DEVKIT}") from None
    expected = "a 'synsets' table with ILSVRC2012_ID, WNID and num_children (the devkit's data/meta.mat)"
    try:
        synsets = scipy.io.loadmat(io.BytesIO(mat), squeeze_me=True)["synsets"]
        rows = zip(synsets["ILSVRC2012_ID"], synsets["WNID"], synsets["num_children"], strict=True)
        leaves = [(int(i), str(w)) for i, w, children in rows if int(children) == 0]
    except (ValueError, KeyError, TypeError, IndexError, OSError, NotImplementedError, OverflowError):
        raise DataError(f"--devkit: data/meta.mat of '{devkit}' is not {expected}") from None
    ids, wnids = Counter(i for i, _ in leaves), Counter(w for _, w in leaves)
    twice = next((("ILSVRC2012_ID", i) for i, n in ids.items() if n > 1), None)
    twice = twice or next((("WNID", w) for w, n in wnids.items() if n > 1), None)
    if twice is not None:  # the last one would win: a class's images would go to a folder train/ does not have
        raise DataError(
            f"--devkit: data/meta.mat of '{devkit}' lists {twice[0]} {twice[1]} twice: each class must have exactly "
            "one ILSVRC2012_ID and one WNID"
        )
    id_to_wnid = dict(leaves)
    bad = next((w for w in id_to_wnid.values() if not is_class_name(w)), None)
    if not id_to_wnid or bad is not None:
        raise DataError(f"--devkit: data/meta.mat of '{devkit}' is not {expected}")
    val_wnids = []
    for n, line in enumerate(truth.decode("utf-8", "replace").split(), 1):
        wnid = id_to_wnid.get(int(line)) if _ID.fullmatch(line) else None
        if wnid is None:
            raise DataError(
                f"--devkit: line {n} of data/ILSVRC2012_validation_ground_truth.txt in '{devkit}' is not the "
                f"ILSVRC2012_ID of a class in its meta.mat ({len(id_to_wnid)} classes)"
            )
        val_wnids.append(wnid)
    if not val_wnids:
        raise DataError(f"--devkit: data/ILSVRC2012_validation_ground_truth.txt of '{devkit}' is empty")
    return Devkit(val_wnids, blacklist)


def solution_labels(csv_path: Path) -> dict[int, str]:
    """{image number: wnid} from Kaggle's LOC_val_solution.csv (ImageId, PredictionString 'wnid x y x y ...')."""
    if not csv_path.is_file():
        raise DataError(f"--val-solution: '{csv_path}' not found ({KAGGLE_SOLUTION} of Kaggle's ImageNet)")
    text = reader.read_text(csv_path, what="--val-solution", error=DataError, max_bytes=TEXT_BYTES)
    return parse_solution(text, str(csv_path))


def parse_solution(text: str, where: str) -> dict[int, str]:
    out = {}
    reader = csv.DictReader(text.splitlines())
    if not {"ImageId", "PredictionString"} <= set(reader.fieldnames or ()):
        raise DataError(f"{where}:1: expected the header 'ImageId,PredictionString' (Kaggle's {KAGGLE_SOLUTION})")
    for n, row in enumerate(reader, 2):
        m = VAL_NAME.match(f"{row.get('ImageId') or ''}.JPEG")
        parts = (row.get("PredictionString") or "").split()
        if not m or not parts:
            # What is wrong, not the row: the file may be anything the user pointed at.
            raise DataError(
                f"{where}:{n}: expected columns ImageId (ILSVRC2012_val_NNNNNNNN) and PredictionString "
                "('<wnid> x y x y ...')"
            )
        number = int(m.group(1))
        if number in out:
            raise DataError(f"{where}:{n}: ImageId {m.group(0)[:-5]} is listed twice: each image has exactly one label")
        out[number] = parts[0]
    return out
