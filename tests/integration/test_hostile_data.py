"""Hostile data: decompression bombs (sizes read from the header, never PIL's exception), files DALI cannot
decode in either split (one scan, one skip-or-refuse rule), fewer validation images than ranks, DataLoader
worker errors, and files whose content ends up in messages or paths. Cases are generated (hypothesis)."""

from __future__ import annotations

import io
import shutil
import struct
import tarfile
import time
import zlib
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from support import input_args, run_context, tiny_config

from base.errors import DataError
from data import create_input
from data.check import check_headers, header_size, inspect_file
from data.dali_loader import DaliPipeline
from data.folder import Split, read_blacklist, scan_split
from data.labels import write_blacklist
from data.prepare import BLACKLIST, sort_val
from data.prepare import main as prepare_main
from data.rect import image_sizes
from data.transforms import load_rgb
from recipes.distributed import DistInfo
from recipes.schedule import Schedule

CPU = DistInfo(0, 1, 0, 1, torch.device("cpu"))
PIL_LIMIT = Image.MAX_IMAGE_PIXELS  # PIL raises DecompressionBombError only above twice this
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)


# -- decompression bombs: files that are a header and nothing else -------------------------------------------


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header(w: int, h: int) -> bytes:
    """A PNG that says it is w x h (1-bit grey) and holds one empty IDAT: a few dozen bytes."""
    ihdr = struct.pack(">IIBBBBB", w, h, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"")) + _chunk(b"IEND", b"")


def jpeg_header(w: int, h: int) -> bytes:
    """A baseline JPEG that says it is w x h (SOF0, one component) and ends at once."""
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, h, w, 1) + b"\x01\x11\x00"
    sos = b"\xff\xda" + struct.pack(">HB", 8, 1) + b"\x01\x00\x00\x3f\x00"
    return b"\xff\xd8" + sof + sos + b"\x00" * 4 + b"\xff\xd9"


SIZES = st.tuples(st.integers(1, 65535), st.integers(1, 65535))
LIMITS = st.sampled_from([1_000_000, 5_000_000, PIL_LIMIT, 2 * PIL_LIMIT + 1, 1_000_000_000, 2_147_483_647])


@SETTINGS
@given(size=SIZES, limit=LIMITS, fmt=st.sampled_from(["png", "jpeg"]))
def test_every_size_guard_reads_the_header_and_compares_it_with_the_limit(size, limit, fmt, tmp_path_factory):
    """Property: for any declared size and any data.max_image_pixels, whatever PIL's own limit says (below it, between
    it and twice it, above twice it), the DALI scan and the torch loader refuse the file exactly when w x h is
    above the limit, from the header, in milliseconds and without decoding; prepare.py --check reports it as
    too large instead of decoding it."""
    w, h = size
    path = tmp_path_factory.mktemp("bomb") / f"x.{fmt}"
    path.write_bytes((png_header if fmt == "png" else jpeg_header)(w, h))
    assert header_size(str(path)) == (w, h)
    assert image_sizes([str(path)]).tolist() == [[w, h]]
    start = time.monotonic()
    found = check_headers([str(path)], limit, 1, 0, 1)
    too_big = w * h > limit
    assert ("above data.max_image_pixels" in (found[0][1] if found else "")) == too_big
    if too_big:
        with pytest.raises(DataError, match="above data.max_image_pixels"):
            load_rgb(str(path), limit)
        assert inspect_file(str(path), limit).kind == "too-large"
    assert time.monotonic() - start < 2


def test_a_30000_square_png_of_a_few_kilobytes_is_refused_without_decoding(tmp_path):
    """The probe's case: 900 Mpixel (10x PIL's limit, where PIL raises DecompressionBombError) was treated as
    'no problem' and decoded to 8.85 GB."""
    path = tmp_path / "bomb.png"
    path.write_bytes(png_header(30000, 30000))
    [(_, why)] = check_headers([str(path)], PIL_LIMIT, 1, 0, 1)
    assert "30000x30000 = 900,000,000 pixels, above data.max_image_pixels (89,478,485)" in why
    # A limit raised above PIL's own is honoured: the guard is ours, not PIL's exception.
    assert check_headers([str(path)], 10**9, 1, 0, 1) == []


# -- one scan and one rule for both DALI splits ---------------------------------------------------------------

BAD = {
    "text": lambda good: b"<html>404 Not Found</html>\n" * 4,
    "gif": lambda good: _gif(),
    "empty": lambda good: b"",
    "truncated": lambda good: good[: len(good) // 3],
    "bomb": lambda good: png_header(3000, 2000),
}


def _gif() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 10, 10)).save(out, format="GIF")
    return out.getvalue()


def _dist(rank: int = 0, world: int = 1) -> DistInfo:
    return DistInfo(rank, world, 0, world, torch.device("cpu"))


@pytest.mark.parametrize("split", ["train", "val"])
@pytest.mark.parametrize("kind", sorted(BAD))
@pytest.mark.parametrize("skip", [False, True])
def test_dali_scans_both_splits_with_one_rule(tiny_root, tmp_path, split, kind, skip, capsys):
    """Every kind of file DALI must not be handed, in either split: refused with its name before a pipeline is
    built (a text or GIF file named .JPEG used to crash DALI's validation with SIGSEGV), or with data.skip_corrupt
    left out and reported, the rest read in full."""
    root = tmp_path / "data"
    shutil.copytree(tiny_root, root)
    victim = sorted((root / split).rglob("*.JPEG"))[3]
    victim.write_bytes(BAD[kind](victim.read_bytes()))
    cfg = tiny_config(
        root,
        tmp_path,
        "data.backend=dali",
        "data.max_image_pixels=5000000",
        f"data.skip_corrupt={str(skip).lower()}",
        "phases=[{epochs: 1, image_size: 32, batch_size: 6, min_scale: 1.0}]",
    )
    train, val = scan_split(root, "train"), scan_split(root, "val")
    pipe = DaliPipeline(cfg.data, _dist(), run_context(cfg), train, val, {"full": (train, val)})
    run = (
        (lambda: list(pipe.val_batches(cfg.phases[0])))
        if split == "val"
        else (
            lambda: list(
                pipe.train_batches(Schedule(cfg.phases, cfg.optim, num_images=len(train), world_size=1).epoch_info(0))
            )
        )
    )
    try:
        if not skip:
            with pytest.raises(DataError) as e:
                run()
            assert f"'{victim}'" in str(e.value) and "\n" not in str(e.value) and "skip_corrupt" in str(e.value)
            return
        batches = run()
        assert [p for p, _ in pipe.skipped] == [str(victim)]
        assert f"warning: skipping {'validation' if split == 'val' else 'training'} file" in capsys.readouterr().err
        # skipped files are counted where the summary and the DAWNBench entry read them
        assert (pipe.val_skipped, pipe.train_skipped) == ((1, 0) if split == "val" else (0, 1))
        assert pipe.val_excluded == val.excluded + (1 if split == "val" else 0)
        if split == "val":
            assert sum(len(y) for _, y in batches) == len(val) - 1 == pipe.num_val
    finally:
        pipe.close()


@pytest.mark.parametrize("n, world", [(1, 2), (2, 3), (3, 4), (1, 4)])
def test_dali_validation_with_fewer_images_than_ranks(tiny_root, tmp_path, n, world):
    """Each of the n images is validated exactly once over the ranks; DALI asserted with more shards than files."""
    cfg = tiny_config(tiny_root, tmp_path, "data.backend=dali", "phases=[{epochs: 1, image_size: 32, batch_size: 8}]")
    train, val = scan_split(tiny_root, "train"), scan_split(tiny_root, "val")
    val = Split(val.root, val.classes, val.files[:n], list(range(n)))
    seen = []
    for rank in range(world):
        pipe = DaliPipeline(cfg.data, _dist(rank, world), run_context(cfg), train, val, {"full": (train, val)})
        seen += [int(y) for _, labels in pipe.val_batches(cfg.phases[0]) for y in labels]
        pipe.close()
    assert sorted(seen) == list(range(n))


# -- the torch backend's worker errors ------------------------------------------------------------------------


@pytest.mark.parametrize("split", ["train", "val"])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_torch_decode_errors_are_one_line_whatever_the_worker_count(tiny_root, tmp_path, split, workers):
    root = tmp_path / "data"
    shutil.copytree(tiny_root, root)
    victim = sorted((root / split).rglob("*.JPEG"))[0]
    victim.write_bytes(b"not an image at all")
    cfg = tiny_config(root, tmp_path, f"data.workers={workers}", "phases=[{epochs: 1, image_size: 32, batch_size: 6}]")
    pipe = create_input(cfg.data, CPU, **input_args(cfg))
    with pytest.raises(DataError) as e:
        if split == "train":
            list(
                pipe.train_batches(
                    Schedule(cfg.phases, cfg.optim, num_images=pipe.num_train, world_size=1).epoch_info(0)
                )
            )
        else:
            list(pipe.val_batches(cfg.phases[0]))
    pipe.close()
    assert "\n" not in str(e.value) and "Traceback" not in str(e.value), str(e.value)
    assert str(e.value).startswith(f"cannot decode image '{victim}': ")


# -- file contents never printed, never a path ----------------------------------------------------------------


@SETTINGS
@given(content=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_a_blacklist_error_never_prints_the_file(content, tmp_path_factory):
    """Property: any content gives the indices, or one line saying what is wrong, holding none of the file's text."""
    path = tmp_path_factory.mktemp("bl") / "list.txt"
    path.write_bytes(content)
    try:
        out = read_blacklist(path)
    except DataError as e:
        msg = str(e)
        assert "\n" not in msg
        words = {w for w in content.decode("utf-8", "replace").split() if len(w) >= 3}
        assert not any(w in msg.replace(str(path), "") for w in words), msg
        return
    assert out == [int(x) for x in content.decode().split()]


def test_a_passwd_file_as_blacklist_is_described_not_shown(tmp_path):
    path = tmp_path / "passwd"
    path.write_text("root:x:0:0:root:/root:/bin/bash\n")
    with pytest.raises(DataError) as e:
        read_blacklist(path)
    assert "root:x" not in str(e.value) and "line 1 is not an image index" in str(e.value)


def _flat_val(root: Path, n: int) -> None:
    (root / "val").mkdir(parents=True)
    for i in range(1, n + 1):
        Image.new("RGB", (20, 20)).save(root / "val" / f"ILSVRC2012_val_{i:08d}.JPEG")


NAMES = st.one_of(
    st.sampled_from(["..", ".", "../escape", "/tmp/abs", "a/b", "a\\b", "", " ", "n01/../../x", "\x00", "~"]),
    st.text(min_size=1, max_size=12),
)


@SETTINGS
@given(label=NAMES)
def test_sort_val_never_moves_a_file_out_of_val(label, tmp_path_factory):
    """Property: whatever class name a CSV or devkit gives, every move stays inside <root>/val as one class folder,
    or nothing moves at all."""
    base = tmp_path_factory.mktemp("sort")
    root = base / "imagenet"
    _flat_val(root, 2)
    before = sorted(p.relative_to(base) for p in base.rglob("*"))
    try:
        sort_val(root, {1: "n01440764", 2: label}, log=lambda *_: None)
    except DataError as e:
        assert "nothing was moved" in str(e)
        assert len(label) < 4 or label not in str(e).replace("n01440764", ""), str(e)  # described, not echoed
        assert sorted(p.relative_to(base) for p in base.rglob("*")) == before
        return
    moved = sorted(p for p in base.rglob("*.JPEG"))
    assert len(moved) == 2 and all(p.parent.parent == root / "val" for p in moved)


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("LOC_val_solution.csv", b"ImageId,PredictionString\n\xff\xfe\n", "is not UTF-8 text"),
        ("LOC_val_solution.csv", b"root:x:0:0:root:/root:/bin/bash\n", "expected the header 'ImageId,Predicti"),
        ("LOC_val_solution.csv", b"ImageId,PredictionString\nroot:x:0:0,\n", "expected columns ImageId"),
    ],
)
def test_solution_csv_errors_are_one_line_without_content(tmp_path, capsys, name, content, message):
    root = tmp_path / "imagenet"
    _flat_val(root, 1)
    (tmp_path / name).write_bytes(content)
    assert prepare_main(["--sort-val", str(root), "--val-solution", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "root:x" not in err[0], err


@pytest.mark.parametrize("which", ["prepare.json", "manifest.jsonl"])
@pytest.mark.parametrize("content", [b"\xff\xfe\x00garbage", b"[1, 2]", b"{not json"])
def test_prepare_state_files_that_are_not_ours(tmp_path, capsys, which, content):
    """prepare.json / manifest.jsonl replaced by bytes that are not ours: one line, or (manifest lines that are not
    entries) the files are redone."""
    src = tmp_path / "src"
    (src / "train" / "n01").mkdir(parents=True)
    Image.new("RGB", (64, 48)).save(src / "train" / "n01" / "a.JPEG")
    dst = tmp_path / "dst"
    assert prepare_main(["--src", str(src), "--dst", str(dst), "--short-side", "16", "--workers", "1"]) == 0
    (dst / which).write_bytes(content)
    capsys.readouterr()
    rc = prepare_main(["--src", str(src), "--dst", str(dst), "--short-side", "16", "--workers", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    if which == "manifest.jsonl" and not content.startswith(b"\xff"):
        assert rc == 0  # not entries: redone
        return
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: ") and "garbage" not in err[0], err


def _devkit(tmp_path: Path, blacklist: bytes) -> Path:
    path = tmp_path / "devkit.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(f"ILSVRC2012_devkit_t12/data/{BLACKLIST}")
        info.size = len(blacklist)
        tar.addfile(info, io.BytesIO(blacklist))
    return path


@SETTINGS
@given(numbers=st.lists(st.integers(1, 50_000), min_size=1, max_size=50, unique=True))
def test_the_kaggle_route_writes_the_devkit_routes_blacklist(numbers, tmp_path_factory):
    """Property: --val-solution with --blacklist FILE, or with --devkit ARCHIVE, writes byte for byte the file the
    devkit route writes, so the record configs' data.val_blacklist reads the same indices."""
    base = tmp_path_factory.mktemp("kaggle")
    listing = "".join(f"{n}\n" for n in numbers).encode()
    (base / "bl.txt").write_bytes(listing)
    devkit = _devkit(base, listing)
    csv = base / "LOC_val_solution.csv"
    csv.write_text("ImageId,PredictionString\nILSVRC2012_val_00000001,n01440764 1 2 3 4\n")
    written = []
    for extra in (["--blacklist", str(base / "bl.txt")], ["--devkit", str(devkit)]):
        root = base / f"r{len(written)}"
        _flat_val(root, 1)
        assert prepare_main(["--sort-val", str(root), "--val-solution", str(csv), *extra]) == 0
        written.append((root / BLACKLIST).read_bytes())
        assert read_blacklist(root / BLACKLIST) == numbers
    assert written[0] == written[1] == listing


def test_a_blacklist_that_is_not_one_is_refused_by_prepare(tmp_path, capsys):
    root = tmp_path / "imagenet"
    _flat_val(root, 1)
    csv = tmp_path / "s.csv"
    csv.write_text("ImageId,PredictionString\nILSVRC2012_val_00000001,n01440764 1 2 3 4\n")
    (tmp_path / "bl.txt").write_text("root:x:0:0\n")
    assert (
        prepare_main(["--sort-val", str(root), "--val-solution", str(csv), "--blacklist", str(tmp_path / "bl.txt")])
        == 2
    )
    err = capsys.readouterr().err
    assert "root:x" not in err and "expected one image number" in err


@pytest.mark.parametrize("content", ["1\n2\n\u00b3\n", "\u0661\u0662\n", "1234567890123\n"])
def test_a_blacklist_index_is_ascii_digits(tmp_path, content):
    """str.isdigit() takes '³' and Arabic-Indic digits, which int() refuses or reads: both are refused in one line."""
    path = tmp_path / "list.txt"
    path.write_text(content)
    with pytest.raises(DataError, match=r"line \d is not an image index"):
        read_blacklist(path)


def test_a_blacklist_that_is_no_regular_file_is_one_line(tmp_path):
    with pytest.raises(DataError, match="expected a regular file"):
        read_blacklist("/dev/zero")
    with pytest.raises(DataError, match="is a directory"):
        read_blacklist(tmp_path)


@pytest.mark.parametrize(
    "data, said",
    [
        (b"1\n2\n2\n", "expected distinct image numbers"),  # a repeat: the check the audit's mutation removed
        ("1\n\u0662\n".encode(), "expected one image number"),  # an Arabic-Indic 2, which int() reads as 2
        (b"1\n+2\n", "expected one image number"),
    ],
)
def test_a_blacklist_written_by_the_data_tools_lists_each_image_once_in_ascii(tmp_path, data, said):
    with pytest.raises(DataError, match=said):
        write_blacklist(data, "test", tmp_path)
    assert not (tmp_path / BLACKLIST).exists()


def test_a_blacklist_read_by_a_run_lists_each_image_once(tmp_path):
    path = tmp_path / "bl.txt"
    path.write_text("5\n7\n5\n")
    with pytest.raises(DataError, match=r"line 3 repeats the index of line 1"):
        read_blacklist(path)
    path.write_text("5\n7\n")
    assert read_blacklist(path) == [5, 7]
