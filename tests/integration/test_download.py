"""data/prepare.py --download: ImageNet as downloaded (image-net.org's tars and devkit, Kaggle's tree and zip) ->
the trainer's layout, the blacklist and the pre-resized copy, in one command; streaming, resumable, and safe."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import scipy.io
from PIL import Image

from data.download import PROGRESS
from data.folder import scan_split
from data.prepare import main as prepare_main

# Real wnids; the devkit numbers them in another order than the sorted one (as the real devkit does).
WNIDS = ["n01440764", "n01443537", "n01484850"]
IDS = {"n01484850": 1, "n01440764": 2, "n01443537": 3}
VAL = ["n01443537", "n01484850", "n01440764", "n01440764", "n01484850", "n01443537"]  # image 1..6
BLACKLIST = b"2\n5\n"


def _jpeg(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64 + 4 * i, 48), (20 * i % 256, 90, 160)).save(buf, format="JPEG")
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes, kind=tarfile.REGTYPE, link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.linkname = (len(data) if kind == tarfile.REGTYPE else 0), kind, link
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def _class_tar(wnid: str, extra=None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for k in range(2):
            _add(tar, f"{wnid}_{k + 1}.JPEG", _jpeg(k + len(wnid)))
        if extra:
            extra(tar)
    return buf.getvalue()


def _devkit(path: Path, meta: bytes | None = None, *, truth: bytes | None = None, ids: dict | None = None) -> Path:
    ids = ids or IDS
    rows = [(ids[w], w, w, "", 0, [], 0, 2) for w in WNIDS] + [(4, "n00015388", "animal", "", 3, [1, 2, 3], 5, 0)]
    fields = ["ILSVRC2012_ID", "WNID", "words", "gloss", "num_children", "children", "wordnet_height"]
    synsets = np.array(rows, dtype=[(f, "O") for f in [*fields, "num_train_images"]])
    mat = io.BytesIO()
    scipy.io.savemat(mat, {"synsets": synsets})
    truth = truth if truth is not None else "".join(f"{IDS[w]}\n" for w in VAL).encode()
    files = {"meta.mat": meta if meta is not None else mat.getvalue()}
    files.update({"ILSVRC2012_validation_ground_truth.txt": truth, "ILSVRC2012_validation_blacklist.txt": BLACKLIST})
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            _add(tar, f"ILSVRC2012_devkit_t12/data/{name}", data)
    return path


def _imagenet_org(folder: Path, *, train_extra=None, val_extra=None) -> Path:
    folder.mkdir(parents=True)
    with tarfile.open(folder / "ILSVRC2012_img_train.tar", "w") as tar:
        for wnid in WNIDS:
            _add(tar, f"{wnid}.tar", _class_tar(wnid, train_extra if wnid == WNIDS[1] else None))
    with tarfile.open(folder / "ILSVRC2012_img_val.tar", "w") as tar:
        for i in range(1, len(VAL) + 1):
            _add(tar, f"ILSVRC2012_val_{i:08d}.JPEG", _jpeg(i))
        if val_extra:
            val_extra(tar)
    _devkit(folder / "ILSVRC2012_devkit_t12.tar.gz")
    return folder


def _kaggle(folder: Path) -> Path:
    root = folder / "ILSVRC/Data/CLS-LOC"
    for wnid in WNIDS:
        (root / "train" / wnid).mkdir(parents=True)
        for k in range(2):
            (root / "train" / wnid / f"{wnid}_{k + 1}.JPEG").write_bytes(_jpeg(k + len(wnid)))
    (root / "val").mkdir()
    (root / "test").mkdir()
    (root / "test" / "ILSVRC2012_test_00000001.JPEG").write_bytes(_jpeg(0))  # not part of the layout
    for i in range(1, len(VAL) + 1):
        (root / "val" / f"ILSVRC2012_val_{i:08d}.JPEG").write_bytes(_jpeg(i))
    rows = [f"ILSVRC2012_val_{i:08d},{w} 1 2 30 20\n" for i, w in enumerate(VAL, 1)]
    (folder / "LOC_val_solution.csv").write_text("ImageId,PredictionString\n" + "".join(reversed(rows)))
    (folder / "LOC_synset_mapping.txt").write_text("".join(f"{w} fish\n" for w in WNIDS))
    return folder


def _layout(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.JPEG"))


EXPECTED = sorted(
    [f"train/{w}/{w}_{k}.JPEG" for w in WNIDS for k in (1, 2)]
    + [f"val/{w}/ILSVRC2012_val_{i:08d}.JPEG" for i, w in enumerate(VAL, 1)]
)


def test_the_imagenet_org_download_becomes_the_layout_blacklist_and_copy_in_one_command(tmp_path, capsys):
    src = _imagenet_org(tmp_path / "download")
    before = sorted(os.listdir(src))
    dst = tmp_path / "imagenet"
    args = ["--download", str(src), "--dst", str(dst), "--short-side", "32", "--workers", "1"]
    assert prepare_main(args) == 0
    assert _layout(dst) == EXPECTED  # each validation image in its devkit class, through the unsorted IDs
    assert (dst / "ILSVRC2012_validation_blacklist.txt").read_bytes() == BLACKLIST
    assert sorted(os.listdir(src)) == before  # no meta.bin (or anything else) beside the archives
    assert _layout(Path(f"{dst}-32")) == sorted(p for p in EXPECTED if p.startswith("train/"))
    with Image.open(Path(f"{dst}-32") / f"train/{WNIDS[0]}/{WNIDS[0]}_1.JPEG") as img:
        assert min(img.size) == 32
    assert scan_split(dst, "val", scan_split(dst, "train").classes).labels == [0, 0, 1, 1, 2, 2]
    err = capsys.readouterr().err
    assert "train: 100.0% of" in err and "3 class(es) done" in err  # the progress line
    val = next(ln for ln in err.splitlines() if ln.startswith("val: 100.0% of"))  # flat: images, no class count
    assert "class(es)" not in val and " 6 image(s) written, " in val
    assert prepare_main(["--check", str(dst), "--workers", "1"]) == 0


def test_an_interrupted_train_tar_resumes_from_the_finished_classes(tmp_path, capsys):
    src = _imagenet_org(tmp_path / "download")
    full = (src / "ILSVRC2012_img_train.tar").read_bytes()
    cut = full.index(b"n01484850.tar")  # the third class's header: the first two are complete before it
    (src / "ILSVRC2012_img_train.tar").write_bytes(full[: cut + 2000])
    dst = tmp_path / "imagenet"
    assert prepare_main(["--download", str(src), "--dst", str(dst)]) == 2
    err = capsys.readouterr().err
    assert "cannot be read past" in err and "a rerun resumes" in err
    assert sorted(os.listdir(dst / ".prepare-progress" / "train")) == WNIDS[:2]
    first = dst / "train" / WNIDS[0] / f"{WNIDS[0]}_1.JPEG"
    os.utime(first, ns=(1, 1))
    (src / "ILSVRC2012_img_train.tar").write_bytes(full)  # the download finished
    assert prepare_main(["--download", str(src), "--dst", str(dst)]) == 0
    assert first.stat().st_mtime_ns == 1  # a finished class is not written again
    assert _layout(dst) == EXPECTED
    assert "(2 from an earlier run)" in capsys.readouterr().err
    # Validation interrupted after some images: those are kept, the missing ones written.
    (dst / ".prepare-progress" / "val").unlink()
    kept, lost = (
        dst / "val" / VAL[0] / "ILSVRC2012_val_00000001.JPEG",
        dst / "val" / VAL[1] / "ILSVRC2012_val_00000002.JPEG",
    )
    os.utime(kept, ns=(1, 1))
    lost.unlink()
    assert prepare_main(["--download", str(src), "--dst", str(dst)]) == 0
    assert kept.stat().st_mtime_ns == 1 and lost.is_file() and _layout(dst) == EXPECTED


@pytest.mark.parametrize("form", ["tree", "zip"])
def test_kaggles_download_becomes_the_same_layout_with_the_devkits_blacklist(form, tmp_path, capsys):
    src = _kaggle(tmp_path / "kaggle")
    if form == "zip":
        archive = tmp_path / "imagenet-object-localization-challenge.zip"
        with zipfile.ZipFile(archive, "w") as zf:
            for p in sorted(src.rglob("*")):
                zf.write(p, p.relative_to(src).as_posix())
        src = archive
    devkit = _devkit(tmp_path / "ILSVRC2012_devkit_t12.tar.gz")
    dst = tmp_path / "imagenet"
    assert prepare_main(["--download", str(src), "--dst", str(dst), "--devkit", str(devkit)]) == 0
    assert _layout(dst) == EXPECTED
    assert (dst / "ILSVRC2012_validation_blacklist.txt").read_bytes() == BLACKLIST
    assert prepare_main(["--download", str(src), "--dst", str(tmp_path / "nobl")]) == 0
    assert "no ILSVRC2012_validation_blacklist.txt written" in capsys.readouterr().err


def _traversal(tar):
    _add(tar, "../../escaped.JPEG", _jpeg(1))


def _symlink(tar):
    _add(tar, "ILSVRC2012_val_00000007.JPEG", b"", kind=tarfile.SYMTYPE, link="/etc/passwd")


@pytest.mark.parametrize(("extra", "said"), [("train", "not a plain file name"), ("val", "is a link")])
def test_a_member_that_would_leave_the_destination_is_refused(extra, said, tmp_path, capsys):
    kwargs = {"train_extra": _traversal} if extra == "train" else {"val_extra": _symlink}
    src = _imagenet_org(tmp_path / "download", **kwargs)
    dst = tmp_path / "out" / "imagenet"
    assert prepare_main(["--download", str(src), "--dst", str(dst)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert said in err[-1] and err[-1].startswith("error: ")
    assert not list(tmp_path.rglob("escaped.JPEG"))
    assert not [p for p in dst.rglob("*") if p.is_symlink()]


def test_a_bad_devkit_is_one_clear_line_before_anything_is_extracted(tmp_path, capsys):
    src = _imagenet_org(tmp_path / "download")
    _devkit(src / "ILSVRC2012_devkit_t12.tar.gz", meta=b"MATLAB 5.0 but not really")
    dst = tmp_path / "imagenet"
    assert prepare_main(["--download", str(src), "--dst", str(dst)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "data/meta.mat of" in err and "'synsets' table" in err
    assert not (dst / "train").exists()
    (src / "ILSVRC2012_devkit_t12.tar.gz").write_bytes(b"<html>403</html>")
    assert prepare_main(["--download", str(src), "--dst", str(dst)]) == 2
    assert "is not a readable tar archive" in capsys.readouterr().err


def test_check_fails_on_a_tree_of_tars_or_of_no_images(tmp_path, capsys):
    tars = tmp_path / "imagenet" / "train"
    tars.mkdir(parents=True)
    for wnid in WNIDS:
        (tars / f"{wnid}.tar").write_bytes(_class_tar(wnid))
    assert prepare_main(["--check", str(tmp_path / "imagenet")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "3 unextracted archive(s)" in err and "--download" in err
    (tmp_path / "empty" / "train").mkdir(parents=True)
    assert prepare_main(["--check", str(tmp_path / "empty")]) == 2
    assert "holds no image" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------
# Hostile downloads: each is one line and exit 2, never a traceback, a filled disk or a silently wrong label.


def _one_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("where", ["a file", "under /proc"])
def test_a_destination_that_cannot_be_made_is_one_line(tmp_path, capsys, where):
    src = _imagenet_org(tmp_path / "download")
    dst = tmp_path / "taken"
    if where == "a file":
        dst.write_text("mine\n")
    else:
        dst = Path("/proc/dawnbench-imagenet")
    assert prepare_main(["--download", str(src), "--dst", str(dst)]) == 2
    line = _one_error(capsys)
    assert f"--dst: '{dst}'" in line or f"--dst: cannot create the folder '{dst}'" in line, line
    if where == "a file":
        assert dst.read_text() == "mine\n"


def test_an_empty_train_tar_is_one_line(tmp_path, capsys):
    src = _imagenet_org(tmp_path / "download")
    with tarfile.open(src / "ILSVRC2012_img_train.tar", "w"):
        pass
    assert prepare_main(["--download", str(src), "--dst", str(tmp_path / "imagenet")]) == 2
    assert "holds no per-class tars" in _one_error(capsys)


def _kaggle_zip(tmp_path, src=None) -> Path:
    src = src or _kaggle(tmp_path / "kaggle")
    archive = tmp_path / "imagenet-object-localization-challenge.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sorted(src.rglob("*")):
            zf.write(p, p.relative_to(src).as_posix())
    return archive


def _patch_first_image(archive: Path, *, method: int | None = None, flags: int | None = None) -> None:
    """Set the compression method or the flag bits of the first image in both of the zip's headers."""
    data = bytearray(archive.read_bytes())
    name = f"ILSVRC/Data/CLS-LOC/train/{WNIDS[0]}/{WNIDS[0]}_1.JPEG".encode()
    for sig, flag_at, method_at, name_at in ((b"PK\x03\x04", 6, 8, 30), (b"PK\x01\x02", 8, 10, 46)):
        pos = data.find(sig)
        while pos >= 0 and data[pos + name_at : pos + name_at + len(name)] != name:
            pos = data.find(sig, pos + 4)
        assert pos >= 0
        if method is not None:
            data[pos + method_at : pos + method_at + 2] = method.to_bytes(2, "little")
        if flags is not None:
            data[pos + flag_at : pos + flag_at + 2] = flags.to_bytes(2, "little")
    archive.write_bytes(bytes(data))


@pytest.mark.parametrize("change, said", [("deflate64", "compression method 9"), ("encrypted", "is encrypted")])
def test_a_zip_member_python_cannot_read_is_one_line_before_extraction(tmp_path, capsys, change, said):
    archive = _kaggle_zip(tmp_path)
    _patch_first_image(archive, **({"method": 9} if change == "deflate64" else {"flags": 1}))
    dst = tmp_path / "imagenet"
    assert prepare_main(["--download", str(archive), "--dst", str(dst)]) == 2
    assert said in _one_error(capsys)
    assert not (dst / "train").exists()


def test_a_zip_whose_csv_inflates_past_its_budget_is_refused_unread(tmp_path, capsys):
    src = _kaggle(tmp_path / "kaggle")
    row = (src / "LOC_val_solution.csv").read_text().splitlines()[1]
    (src / "LOC_val_solution.csv").write_text("ImageId,PredictionString\n" + (row + "\n") * (17 * 2**20 // len(row)))
    archive = _kaggle_zip(tmp_path, src)
    assert archive.stat().st_size < 2**20  # a small zip, 17 MiB of CSV
    assert prepare_main(["--download", str(archive), "--dst", str(tmp_path / "imagenet")]) == 2
    line = _one_error(capsys)
    assert "member 'LOC_val_solution.csv' declares " in line and "expected at most 16,777,216" in line, line
    assert not (tmp_path / "imagenet" / "train").exists()


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar writes the sparse member")
def test_a_sparse_member_is_refused_before_a_byte_is_written(tmp_path, capsys):
    src = _imagenet_org(tmp_path / "download")
    big = tmp_path / "ILSVRC2012_val_00000001.JPEG"
    with open(big, "wb") as f:  # 200 MiB of holes: 20 KB in the tar
        f.truncate(200 * 2**20)
    tar = src / "ILSVRC2012_img_val.tar"
    tar.unlink()
    subprocess.run(["tar", "--sparse", "-cf", str(tar), "-C", str(tmp_path), big.name], check=True)
    assert tar.stat().st_size < 2**20
    dst = tmp_path / "imagenet"
    assert prepare_main(["--download", str(src), "--dst", str(dst)]) == 2
    line = _one_error(capsys)
    assert "is a sparse file" in line or "declares 209,715,200 bytes" in line, line
    assert not list((dst / "val").rglob("*.JPEG")) if (dst / "val").exists() else True


def test_the_shipped_budget_refuses_a_few_hundred_kb_of_gzipped_zeros(tmp_path, capsys):
    """The budget as shipped (RATIO x bytes read + a 256 MiB allowance), not monkeypatched: 280 MiB of zeros in
    about 300 KB is refused, and the images it had written are removed (a refused bomb left 301 MB behind)."""
    src = _imagenet_org(tmp_path / "download")
    tar = src / "ILSVRC2012_img_val.tar"
    with tarfile.open(tar, "w:gz", compresslevel=9) as t:
        for i in range(1, 6):
            _add(t, f"ILSVRC2012_val_{i:08d}.JPEG", bytes(56 << 20))
    assert tar.stat().st_size < 400_000
    assert prepare_main(["--download", str(src), "--dst", str(tmp_path / "imagenet")]) == 2
    line = _one_error(capsys)
    assert "bytes extracted from" in line and "over 4x" in line, line
    assert list((tmp_path / "imagenet" / "val").rglob("*.JPEG*")) == []


def test_a_train_bomb_keeps_the_finished_classes_and_removes_the_refused_ones_images(tmp_path, capsys):
    """The train split (a gzip'd tar of per-class tars, read as a stream): the class finished before the bomb stays
    (marked done, a rerun resumes after it); the bomb's class loses the images it had written."""
    src = _imagenet_org(tmp_path / "download")
    bomb = io.BytesIO()
    with tarfile.open(fileobj=bomb, mode="w") as inner:
        _add(inner, f"{WNIDS[1]}_1.JPEG", _jpeg(1))
        for k in range(2, 7):
            _add(inner, f"{WNIDS[1]}_{k}.JPEG", bytes(56 << 20))
    tar = src / "ILSVRC2012_img_train.tar"
    with tarfile.open(tar, "w:gz", compresslevel=9) as t:
        _add(t, f"{WNIDS[0]}.tar", _class_tar(WNIDS[0]))
        _add(t, f"{WNIDS[1]}.tar", bomb.getvalue())
    assert tar.stat().st_size < 400_000
    dst = tmp_path / "imagenet"
    assert prepare_main(["--download", str(src), "--dst", str(dst)]) == 2
    line = _one_error(capsys)
    assert f"'{tar}': " in line and "bytes extracted from" in line and "over 4x" in line, line
    assert _layout(dst) == [f"train/{WNIDS[0]}/{WNIDS[0]}_{k}.JPEG" for k in (1, 2)]
    assert list((dst / "train" / WNIDS[1]).iterdir()) == []
    assert sorted(p.name for p in (dst / PROGRESS / "train").iterdir()) == [WNIDS[0]]  # a rerun starts after it


@pytest.mark.parametrize("line", ["²", "٢", "9" * 5000, "+2", " 2x", "0x2"])
def test_a_ground_truth_line_is_ascii_digits_of_a_known_id(tmp_path, capsys, line):
    src = _imagenet_org(tmp_path / "download")
    truth = "".join(f"{IDS[w]}\n" for w in VAL[:-1]) + line + "\n"
    _devkit(src / "ILSVRC2012_devkit_t12.tar.gz", truth=truth.encode())
    assert prepare_main(["--download", str(src), "--dst", str(tmp_path / "imagenet")]) == 2
    msg = _one_error(capsys)
    assert f"line {len(VAL)} of data/ILSVRC2012_validation_ground_truth.txt" in msg, msg


def test_a_class_listed_twice_in_meta_mat_is_refused(tmp_path, capsys):
    src = _imagenet_org(tmp_path / "download")
    _devkit(src / "ILSVRC2012_devkit_t12.tar.gz", ids={**IDS, "n01443537": IDS["n01484850"]})  # ID 1 twice
    assert prepare_main(["--download", str(src), "--dst", str(tmp_path / "imagenet")]) == 2
    assert "lists ILSVRC2012_ID 1 twice" in _one_error(capsys)


def test_an_image_listed_twice_in_kaggles_csv_is_refused(tmp_path, capsys):
    src = _kaggle(tmp_path / "kaggle")
    csv = src / "LOC_val_solution.csv"
    csv.write_text(csv.read_text() + f"ILSVRC2012_val_00000001,{WNIDS[0]} 1 2 30 20\n")
    assert prepare_main(["--download", str(src), "--dst", str(tmp_path / "imagenet")]) == 2
    assert "ImageId ILSVRC2012_val_00000001 is listed twice" in _one_error(capsys)


def test_sort_val_has_no_label_for_image_0(tmp_path, capsys):
    root = tmp_path / "imagenet"
    (root / "val").mkdir(parents=True)
    (root / "val" / "ILSVRC2012_val_00000000.JPEG").write_bytes(_jpeg(0))  # labels[-1] was image 50,000's
    devkit = _devkit(tmp_path / "ILSVRC2012_devkit_t12.tar.gz")
    assert prepare_main(["--sort-val", str(root), "--devkit", str(devkit)]) == 2
    assert "no label for" in _one_error(capsys)
    assert (root / "val" / "ILSVRC2012_val_00000000.JPEG").is_file()


@pytest.mark.parametrize("name", ["sub/escaped.JPEG", f"{WNIDS[0]}_1.JPEG/../../../escaped.JPEG", "a\\b.JPEG"])
def test_a_member_name_with_a_separator_is_refused(tmp_path, capsys, name):
    """The name check's first character is not its only guard: a '/' later in the name is refused too."""
    src = _imagenet_org(tmp_path / "download", train_extra=lambda tar: _add(tar, name, _jpeg(1)))
    assert prepare_main(["--download", str(src), "--dst", str(tmp_path / "out")]) == 2
    assert "not a plain file name" in _one_error(capsys)
    assert not list(tmp_path.rglob("escaped.JPEG"))
