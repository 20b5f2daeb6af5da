"""data/prepare.py (pre-resized copies: resize, manifest, resume) and data/check.py (what a file really is)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from PIL import Image
from support import FOLDER_PIPELINES, input_args, input_from, tiny_config

from base.errors import DataError
from data import create_input
from data.check import OK, check_headers, inspect_file, quick_problem
from data.make_sample import main as make_sample
from data.prepare import main as prepare_main
from data.prepare import target_size
from recipes.distributed import DistInfo
from recipes.schedule import Schedule


def _damage(root):
    """Add a truncated JPEG, an empty file and a non-image named .JPEG to train/ of `root`."""
    folder = sorted((root / "train").iterdir())[0]
    good = sorted(folder.glob("*_0000*.JPEG"))[0].read_bytes()
    (folder / "bad_truncated.JPEG").write_bytes(good[: len(good) // 3])
    (folder / "bad_empty.JPEG").write_bytes(b"")
    (folder / "bad_text.JPEG").write_bytes(b"<html>not found</html>" * 4)


@pytest.fixture()
def odd_src(tmp_path):
    """2 classes, 5 train / 2 val each, plus a CMYK JPEG, a grayscale JPEG and a PNG named .JPEG."""
    src = tmp_path / "src"
    make_sample(["--out", str(src), "--classes", "2", "--train-per-class", "5", "--val-per-class", "2", "--odd"])
    return src


def test_target_size_keeps_the_short_side_and_scales_down_only():
    assert target_size(500, 375, 160) == (213, 160)  # a longest side of 160 would leave 120: below a 128 px phase
    assert target_size(375, 500, 160) == (160, 213)
    assert target_size(100, 80, 160) == (100, 80)
    assert min(target_size(4000, 161, 160)) == 160


def test_inspect_file_names_each_oddity(odd_src):
    _damage(odd_src)
    kinds = {p.name.split("_", 1)[1]: inspect_file(str(p)).kind for p in (odd_src / "train").rglob("*odd_*")}
    kinds.update({p.name: inspect_file(str(p)).kind for p in (odd_src / "train").rglob("bad_*")})
    assert kinds == {
        "odd_cmyk.JPEG": "cmyk-jpeg",
        "odd_gray.JPEG": "grayscale-jpeg",
        "odd_png.JPEG": "png",
        "bad_truncated.JPEG": "truncated",
        "bad_empty.JPEG": "empty",
        "bad_text.JPEG": "not-an-image",
    }
    plain = next((odd_src / "val").rglob("*.JPEG"))
    assert inspect_file(str(plain)).kind == OK
    # The cheap check (run over a shard when DALI fails) finds the same three undecodable files, nothing else.
    flagged = sorted(p.name for p in (odd_src / "train").rglob("*.JPEG") if quick_problem(str(p)))
    assert flagged == ["bad_empty.JPEG", "bad_text.JPEG", "bad_truncated.JPEG"]


def test_check_lists_every_odd_file_and_fails_on_undecodable(odd_src, tmp_path, capsys):
    assert prepare_main(["--check", str(odd_src), "--workers", "1"]) == 0  # odd but valid: status 0
    out = capsys.readouterr().out
    assert "cmyk-jpeg" in out and "grayscale-jpeg" in out and "PNG RGB" in out and "in a .JPEG file" in out
    assert "0 cannot be decoded" in out
    _damage(odd_src)
    report = tmp_path / "bad.tsv"
    assert prepare_main(["--check", str(odd_src), "--workers", "2", "--out", str(report)]) == 1
    out = capsys.readouterr().out
    assert "3 cannot be decoded" in out
    rows = [line.split("\t") for line in report.read_text().splitlines()[1:]]
    by_name = {os.path.basename(r[1]): r[0] for r in rows}
    assert by_name == {
        "bad_empty.JPEG": "empty",
        "bad_text.JPEG": "not-an-image",
        "bad_truncated.JPEG": "truncated",
        "n01440764_odd_cmyk.JPEG": "cmyk-jpeg",
        "n01443537_odd_gray.JPEG": "grayscale-jpeg",
        "n01440764_odd_png.JPEG": "png",
    }


def test_check_fails_on_an_animated_gif_the_dali_backend_refuses(tmp_path, capsys):
    """An animated GIF named .JPEG passed --check (exit 0, "0 cannot be decoded") and then stopped a DALI run: --check
    names it with DALI's reason and exits 1, for the same file DALI's header scan refuses."""
    folder = tmp_path / "root" / "train" / "n01440764"
    folder.mkdir(parents=True)
    Image.new("RGB", (40, 30)).save(folder / "plain.JPEG")
    frames = [Image.new("RGB", (40, 30), (60 * i, 0, 0)) for i in range(3)]
    gif = folder / "anim.JPEG"
    frames[0].save(gif, format="GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    assert [f for f, _ in check_headers([str(gif), str(folder / "plain.JPEG")], 10**8, 1, 0, 1)] == [str(gif)]
    assert prepare_main(["--check", str(tmp_path / "root"), "--workers", "1"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [ln for ln in lines if "anim.JPEG" in ln and "data.backend=dali refuses a GIF image" in ln], lines
    assert "0 cannot be decoded, 1 would stop data.backend=dali" in lines[-1]


def test_prepare_resizes_to_rgb_jpeg_with_manifest(odd_src, tmp_path, capsys):
    dst = tmp_path / "p64"
    assert prepare_main(["--src", str(odd_src), "--dst", str(dst), "--short-side", "64", "--workers", "2"]) == 0
    src_files = sorted(p.relative_to(odd_src) for p in (odd_src / "train").rglob("*.JPEG"))
    dst_files = sorted(p.relative_to(dst) for p in (dst / "train").rglob("*.JPEG"))
    assert dst_files == src_files and not (dst / "val").exists()  # default: train only
    for rel in dst_files:
        with Image.open(dst / rel) as img:
            assert img.format == "JPEG" and img.mode == "RGB"  # CMYK, grayscale and PNG become RGB JPEGs
            assert min(img.size) == 64  # the short side: a 160 copy feeds 128 px crops from every image
            with Image.open(odd_src / rel) as orig:
                assert img.width / img.height == pytest.approx(orig.width / orig.height, rel=0.05)
    entries = [json.loads(line) for line in (dst / "manifest.jsonl").read_text().splitlines()]
    assert len(entries) == len(src_files) and {e["status"] for e in entries} == {"resized"}
    cmyk = next(e for e in entries if e["file"].endswith("odd_cmyk.JPEG"))
    assert cmyk["kind"] == "JPEG CMYK" and min(cmyk["size"]) == 64
    assert cmyk["bytes"] == os.path.getsize(dst / cmyk["file"])
    settings = json.loads((dst / "prepare.json").read_text())
    assert settings["complete"] is True and settings["resized"] == len(src_files) and settings["short_side"] == 64


def test_prepare_resumes_and_refuses_other_settings(odd_src, tmp_path, capsys):
    dst = tmp_path / "p64"
    args = ["--src", str(odd_src), "--dst", str(dst), "--short-side", "48", "--workers", "1"]
    assert prepare_main(args) == 0
    files = sorted((dst / "train").rglob("*.JPEG"))
    # Simulate an interruption: two outputs never written, the manifest's last line cut in half.
    files[0].unlink()
    files[1].unlink()
    manifest = dst / "manifest.jsonl"
    text = manifest.read_text()
    manifest.write_text(text[: len(text) - 20])
    untouched = {p: p.stat().st_mtime_ns for p in files[2:]}
    capsys.readouterr()
    assert prepare_main(args) == 0
    out = capsys.readouterr().out
    assert "3 file(s) to write" in out  # the two deleted ones and the one whose manifest line was cut
    assert files[0].is_file() and files[1].is_file()
    assert sum(p.stat().st_mtime_ns != t for p, t in untouched.items()) <= 1
    with Image.open(files[0]) as img:
        assert min(img.size) == 48
    assert len(manifest.read_text().splitlines()) == len(files)
    assert prepare_main(["--src", str(odd_src), "--dst", str(dst), "--short-side", "64", "--workers", "1"]) == 2
    assert "other settings" in capsys.readouterr().err


def test_prepare_reports_undecodable_sources(odd_src, tmp_path, capsys):
    _damage(odd_src)
    dst = tmp_path / "p64"
    args = ["--src", str(odd_src), "--dst", str(dst), "--short-side", "64", "--workers", "2"]
    assert prepare_main(args) == 1
    captured = capsys.readouterr()
    assert "bad_truncated.JPEG: truncated" in captured.out and "bad_empty.JPEG: empty" in captured.out
    assert "3 source file(s) cannot be decoded" in captured.err
    assert not list((dst / "train").rglob("bad_*"))  # the copy holds only decodable images
    assert prepare_main([*args, "--skip-corrupt"]) == 0
    settings = json.loads((dst / "prepare.json").read_text())
    assert settings["undecodable"] == 3 and settings["complete"] is False


@pytest.mark.parametrize("backend", FOLDER_PIPELINES)
def test_a_phase_reads_the_prepared_copy(odd_src, tmp_path, backend):
    dst = tmp_path / "p96"
    assert prepare_main(["--src", str(odd_src), "--dst", str(dst), "--short-side", "96", "--workers", "1"]) == 0
    for path in (odd_src / "train").rglob("*.JPEG"):
        path.write_bytes(b"gone")  # the full-size originals no longer decode: only the copy can feed training
    dist = DistInfo(0, 1, 0, 1, torch.device("cpu"))
    phases = (
        "phases=[{epochs: 1, image_size: 32, batch_size: 4, root: '96'}, {epochs: 1, image_size: 32, batch_size: 4}]"
    )
    cfg = tiny_config(odd_src, tmp_path, f"data.backend={backend}", f"data.roots={{'96': {dst}}}", phases)
    pipe = create_input(cfg.data, dist, **input_args(cfg))
    plan = Schedule(cfg.phases, cfg.optim, num_images=pipe.num_train, world_size=1)
    batches = list(pipe.train_batches(plan.epoch_info(0)))
    assert len(batches) == plan.epoch_info(0).steps and batches[0][0].shape == (4, 3, 32, 32)
    with pytest.raises(DataError, match="cannot decode"):
        list(pipe.train_batches(plan.epoch_info(1)))  # phase 2 reads the (now broken) full-size files
    pipe.close()


def _flat_val(root, n: int):
    """A flat validation folder as ImageNet ships it: ILSVRC2012_val_00000001.JPEG, ..."""
    (root / "val").mkdir(parents=True)
    for i in range(1, n + 1):
        Image.new("RGB", (40, 30), (10 * i, 0, 0)).save(root / "val" / f"ILSVRC2012_val_{i:08d}.JPEG")


def test_sort_val_from_kaggle_solution_csv(tmp_path, capsys):
    root = tmp_path / "imagenet"
    _flat_val(root, 5)
    csv = tmp_path / "LOC_val_solution.csv"
    wnids = ["n02", "n01", "n02", "n01", "n03"]
    rows = [f"ILSVRC2012_val_{i:08d},{w} 1 2 30 20 {w} 3 4 10 10\n" for i, w in enumerate(wnids, 1)]
    csv.write_text("ImageId,PredictionString\n" + "".join(reversed(rows)))
    assert prepare_main(["--sort-val", str(root), "--val-solution", str(csv)]) == 0
    assert "moved 5 validation image(s)" in capsys.readouterr().out
    for i, w in enumerate(wnids, 1):
        assert (root / "val" / w / f"ILSVRC2012_val_{i:08d}.JPEG").is_file()
    assert prepare_main(["--sort-val", str(root), "--val-solution", str(csv)]) == 0  # a rerun has nothing left to move
    assert "moved 0" in capsys.readouterr().out
    _flat_val(tmp_path / "other", 6)  # image 6 is not in the CSV
    assert prepare_main(["--sort-val", str(tmp_path / "other"), "--val-solution", str(csv)]) == 2
    assert "no label for" in capsys.readouterr().err


def test_sort_val_from_the_devkit(tmp_path, capsys):
    """A devkit archive laid out as ILSVRC2012_devkit_t12.tar.gz (meta.mat, ground truth, blacklist), read in memory
    (any checksum: a smaller copy is read as the real one)."""
    import io
    import tarfile

    import numpy as np
    import scipy.io

    synsets = np.array(
        [
            (1, "n01", "tench, Tinca tinca", "", 0, 0, 1),
            (2, "n02", "goldfish", "", 0, 0, 1),
            (3, "n00", "fish", "", 2, 1, 0),
        ],
        dtype=[
            ("ILSVRC2012_ID", "O"),
            ("WNID", "O"),
            ("words", "O"),
            ("gloss", "O"),
            ("num_children", "O"),
            ("wordnet_height", "O"),
            ("num_train_images", "O"),
        ],
    )
    mat = io.BytesIO()
    scipy.io.savemat(mat, {"synsets": synsets})
    files = {
        "data/meta.mat": mat.getvalue(),
        "data/ILSVRC2012_validation_ground_truth.txt": b"2\n1\n1\n",
        "data/ILSVRC2012_validation_blacklist.txt": b"3\n",
    }
    devkit = tmp_path / "ILSVRC2012_devkit_t12.tar.gz"
    with tarfile.open(devkit, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"ILSVRC2012_devkit_t12/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    root = tmp_path / "imagenet"
    _flat_val(root, 3)
    assert prepare_main(["--sort-val", str(root), "--devkit", str(devkit)]) == 0
    moved = sorted(p.relative_to(root / "val").as_posix() for p in (root / "val").rglob("*.JPEG"))
    assert moved == [
        "n01/ILSVRC2012_val_00000002.JPEG",
        "n01/ILSVRC2012_val_00000003.JPEG",
        "n02/ILSVRC2012_val_00000001.JPEG",
    ]
    assert (root / "ILSVRC2012_validation_blacklist.txt").read_text() == "3\n"
    assert "data.val_blacklist: ILSVRC2012_validation_blacklist.txt" in capsys.readouterr().out
    assert prepare_main(["--sort-val", str(root), "--devkit", str(tmp_path / "none.tar.gz")]) == 2


def test_a_copy_beside_data_root_is_found_without_configuring_it(odd_src, tmp_path, capsys):
    dist = DistInfo(0, 1, 0, 1, torch.device("cpu"))
    phases = "phases=[{epochs: 1, image_size: 32, batch_size: 4, root: '48'}]"
    with pytest.raises(
        DataError,
        match=f"'{odd_src}-48' does not exist; make it with: python data/prepare.py "
        f"--src {odd_src} --dst {odd_src}-48 --short-side 48",
    ):
        input_from(tiny_config(odd_src, tmp_path, phases), dist)
    assert prepare_main(["--src", str(odd_src), "--dst", f"{odd_src}-48", "--short-side", "48", "--workers", "1"]) == 0
    pipe = input_from(tiny_config(odd_src, tmp_path, phases), dist)
    train, _ = pipe.roots["48"]
    assert str(train.root) == f"{odd_src}-48/train" and len(train) == pipe.num_train
    pipe.close()
