"""The sample dataset: ImageNet layout, varied sizes, deterministic, odd files."""

from __future__ import annotations

import hashlib
import json

import pytest
from PIL import Image

from base.errors import DataError
from data.make_sample import WNIDS
from data.make_sample import main as make_sample


def digest(root):
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.JPEG")):
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def test_layout_sizes_and_determinism(tmp_path):
    args = ["--classes", "3", "--train-per-class", "6", "--val-per-class", "2"]
    make_sample(["--out", str(tmp_path / "a"), *args])
    make_sample(["--out", str(tmp_path / "b"), *args])
    a = tmp_path / "a"
    assert digest(a) == digest(tmp_path / "b")
    wnids = sorted(p.name for p in (a / "train").iterdir())
    assert len(wnids) == 3 and all(w.startswith("n") and len(w) == 9 and w[1:].isdigit() for w in wnids)
    assert sorted(p.name for p in (a / "val").iterdir()) == wnids
    files = sorted((a / "train").rglob("*.JPEG"))
    assert len(files) == 18 and len(list((a / "val").rglob("*.JPEG"))) == 6
    sizes = set()
    for f in files:
        with Image.open(f) as im:
            assert im.format == "JPEG" and im.mode == "RGB"
            assert 150 <= im.width <= 500 and 150 <= im.height <= 500
            sizes.add(im.size)
    assert len(sizes) == len(files)  # varied sizes and aspect ratios
    info = json.loads((a / "sample.json").read_text())
    assert info["train"] == 18 and info["val"] == 6


def test_odd_files(tmp_path):
    make_sample(["--out", str(tmp_path), "--classes", "3", "--train-per-class", "1", "--val-per-class", "1", "--odd"])
    kinds = {}
    for f in (tmp_path / "train").rglob("*_odd_*.JPEG"):
        with Image.open(f) as im:
            kinds[f.stem.rsplit("_", 1)[1]] = (im.format, im.mode)
    assert kinds == {"cmyk": ("JPEG", "CMYK"), "gray": ("JPEG", "L"), "png": ("PNG", "RGB")}


def test_an_image_name_planted_as_a_link_is_refused_and_its_target_untouched(tmp_path):
    """PIL's Image.save(path) wrote through a link planted at an image's name; images go through the one writer."""
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    folder = tmp_path / "s" / "train" / WNIDS[0]
    folder.mkdir(parents=True)
    (folder / f"{WNIDS[0]}_00000.JPEG").symlink_to(victim)
    with pytest.raises(DataError) as e:
        make_sample(["--out", str(tmp_path / "s"), "--classes", "2", "--train-per-class", "1", "--val-per-class", "1"])
    assert str(e.value).startswith(f"make_sample.py --out: '{folder / WNIDS[0]}_00000.JPEG' is a symbolic link")
    assert victim.read_text() == "mine\n"
