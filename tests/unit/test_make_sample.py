"""The sample dataset: ImageNet layout, varied sizes, deterministic, odd files."""

from __future__ import annotations

import hashlib
import json

from PIL import Image

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
