"""The devkit's validation blacklist (data.val_blacklist): excluded in training-time validation, in evaluate.py, and
reported in the summary and the DAWNBench entry (usedBlacklist)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import tiny_config

import evaluate
from base.errors import DataError
from data.folder import Split, drop_blacklisted, scan_split
from recipes.trainer import train


def test_indices_name_the_sorted_file_names_wherever_the_files_sit(tmp_path):
    # the devkit numbers the flat folder: ILSVRC2012_val_00000001.JPEG is 1, whatever class folder it is in now
    files = [
        "/v/n2/ILSVRC2012_val_00000002.JPEG",
        "/v/n1/ILSVRC2012_val_00000003.JPEG",
        "/v/n1/ILSVRC2012_val_00000004.JPEG",
        "/v/n2/ILSVRC2012_val_00000001.JPEG",
    ]
    split = Split(Path("/v"), ["n1", "n2"], files, [1, 0, 0, 1])
    bl = tmp_path / "ILSVRC2012_validation_blacklist.txt"
    bl.write_text("1\n4\n")
    kept, n = drop_blacklisted(split, bl)
    assert n == 2 and kept.files == [files[0], files[1]] and kept.labels == [1, 0]
    bl.write_text("5\n")
    with pytest.raises(DataError, match="names image 5, but '/v' has 4 images"):
        drop_blacklisted(split, bl)
    bl.write_text("x\n")
    with pytest.raises(DataError, match="ILSVRC2012_validation_blacklist.txt' line 1 is not an image index"):
        drop_blacklisted(split, bl)


def test_training_and_evaluate_leave_the_blacklisted_images_out(tiny_root, tmp_path, capsys):
    val = scan_split(tiny_root, "val")
    # a blacklist beside the data, as data/prepare.py leaves it: 3 of the 20 validation images
    (tiny_root / "blacklist.txt").write_text("2\n7\n20\n")
    try:
        run_dir = tmp_path / "bl"
        summary = train(tiny_config(tiny_root, tmp_path, "data.val_blacklist=blacklist.txt"), run_dir=run_dir)
        assert summary["val_count"] == len(val) - 3 and summary["val_excluded"] == 3
        assert all(r["val_count"] == len(val) - 3 for r in summary["history"])
        assert "| validation images counted" in capsys.readouterr().out
        e = json.loads((run_dir / "dawnbench.json").read_text())
        assert e["usedBlacklist"] is True and e["misc"]["val_images_counted"] == len(val) - 3
        ckpt = str(run_dir / "checkpoint.pt")
        out = tmp_path / "eval.json"
        assert evaluate.main([ckpt, "--data", str(tiny_root), "--out", str(out)]) == 0
        res = json.loads(out.read_text())
        assert (res["count"], res["blacklisted"]) == (len(val) - 3, 3)
        assert "3 blacklisted images not counted" in capsys.readouterr().out
        assert evaluate.main([ckpt, "--data", str(tiny_root), "--out", str(out), "--val-blacklist", ""]) == 0
        assert json.loads(out.read_text())["count"] == len(val)
        assert evaluate.main([ckpt, "--data", str(tiny_root), "--val-blacklist", "missing.txt"]) == 2
        assert "missing.txt' not found" in capsys.readouterr().err
    finally:
        (tiny_root / "blacklist.txt").unlink()
