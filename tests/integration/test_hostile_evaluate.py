"""evaluate.py with clumsy arguments and datasets: every number out of its range (generated from the table the
checks use), outputs that cannot be written (refused before the evaluation runs), a dataset of val/ alone, loose
files, a blacklist that leaves nothing, and logits that are all inf (one rule for accuracy and --latency)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from support import FOLDER_PIPELINES

import evaluate
from recipes.evaluation import cli
from recipes.rundir import checkpoint_files as ckpt


def _bad_values(low, high, is_float: bool) -> list[str]:
    out = [str(low - 1)]
    if high is not None:
        out.append(str(high + 1))
    if is_float:
        out += ["nan", "inf", "-inf"]
    return out


FLOATS = {"price_per_hour"}
CASES = [(flag, value) for flag, name, low, high in cli._NUMBERS for value in _bad_values(low, high, name in FLOATS)]


@pytest.fixture
def no_evaluation(monkeypatch):
    """Fails the test if anything is evaluated or measured: the checks must come first."""

    def boom(*a, **k):
        raise AssertionError("the evaluation ran before the arguments were checked")

    for name in ("evaluate_checkpoint", "latency_checkpoint", "export_checkpoint"):
        monkeypatch.setattr(cli, name, boom)


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("flag, value", CASES, ids=[f"{f}={v}" for f, v in CASES])
def test_every_number_out_of_range_is_refused_first(flag, value, tiny_checkpoint, no_evaluation, capsys):
    latency = ["--latency"] if flag in ("--threads", "--seed", "--images", "--warmup", "--calib-images") else []
    rc = evaluate.main([str(tiny_checkpoint), *latency, f"{flag}={value}"])
    assert rc == 2
    assert f"{flag}: expected" in _one_line(capsys.readouterr().err)


def test_the_bounds_are_accepted(tiny_checkpoint, monkeypatch):
    """Both ends of every range pass the checks (as parsed by evaluate.py's own argument parser)."""
    parsed = []
    monkeypatch.setattr(evaluate, "run_evaluate_cli", lambda args: parsed.append(args) or 0)
    for flag, _, low, high in cli._NUMBERS:
        for value in (low, high) if high is not None else (low,):
            evaluate.main([str(tiny_checkpoint), flag, str(value)])
            cli.check_args(parsed[-1])


@pytest.mark.parametrize("flag", ["--out", "--entry", "--export-file"])
@pytest.mark.parametrize("where", ["directory", "under-a-file", "read-only"])
def test_unwritable_outputs_are_refused_before_the_evaluation(
    flag, where, tiny_checkpoint, tmp_path, no_evaluation, capsys
):
    if where == "directory":
        target = tmp_path
    elif where == "under-a-file":
        (tmp_path / "file").write_text("x")
        target = tmp_path / "file" / "sub" / "out.json"
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        target = ro / "out.json"
        if os.access(ro, os.W_OK):  # root writes anywhere a plain chmod forbids: use a read-only mount instead
            target = "/proc/dawnbench-out.json"
    extra = {"--entry": ["--latency"], "--export-file": ["--export", "onnx"]}.get(flag, [])
    assert evaluate.main([str(tiny_checkpoint), *extra, flag, str(target)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"{flag}: " in line and ("is a directory" in line or "cannot write" in line), line


def _copy_val_only(tiny_root, dest):
    shutil.copytree(tiny_root / "val", dest / "val")
    return dest


def test_a_dataset_of_val_alone_is_enough(tiny_checkpoint, tiny_root, tmp_path, capsys):
    """As --data's help says: a root with val/ only, or the val folder itself; the same numbers as the full root."""
    full = evaluate.main([str(tiny_checkpoint), "--data", str(tiny_root), "--out", str(tmp_path / "full.json")])
    only = _copy_val_only(tiny_root, tmp_path / "only")
    assert full == 0
    for data in (only, only / "val"):
        for backend in FOLDER_PIPELINES:  # evaluate.py --backend
            out = tmp_path / f"{backend}.json"
            assert (
                evaluate.main([str(tiny_checkpoint), "--data", str(data), "--backend", backend, "--out", str(out)]) == 0
            )
            res, ref = json.loads(out.read_text()), json.loads((tmp_path / "full.json").read_text())
            assert res["count"] == 20 and res["top1"] == pytest.approx(ref["top1"], abs=10)


def test_loose_files_in_val_are_reported(tiny_checkpoint, tiny_root, tmp_path, capsys):
    root = tmp_path / "data"
    shutil.copytree(tiny_root, root)
    first = next((root / "val").rglob("*.JPEG"))
    shutil.copy(first, root / "val" / "ILSVRC2012_val_00000001.JPEG")
    assert evaluate.main([str(tiny_checkpoint), "--data", str(root)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "1 image file(s) outside class folders, e.g. 'ILSVRC2012_val_00000001.JPEG'" in line
    assert "--sort-val" in line


def test_a_blacklist_that_excludes_every_image_is_an_error(tiny_checkpoint, tiny_root, tmp_path, capsys):
    bl = tmp_path / "all.txt"
    bl.write_text("".join(f"{i}\n" for i in range(1, 21)))
    assert evaluate.main([str(tiny_checkpoint), "--data", str(tiny_root), "--val-blacklist", str(bl)]) == 2
    assert "excludes every one of the 20 images" in _one_line(capsys.readouterr().err)


def test_latency_applies_accuracy_modes_rule_to_inf_logits(tiny_checkpoint, tiny_root, tmp_path, capsys):
    """Finite weights whose logits overflow to inf: both modes stop with exit 3 and the same sentence, and no
    DAWNBench entry is written."""
    state = ckpt.load(tiny_checkpoint)
    fc = [k for k in state["model"] if k.endswith("fc.weight")][0]
    state["model"][fc] = torch.full_like(state["model"][fc], 3e38)
    bad = tmp_path / "inf.pt"
    ckpt.save_atomic(state, bad)
    assert evaluate.main([str(bad), "--data", str(tiny_root)]) == 3
    acc = _one_line(capsys.readouterr().err)
    entry = tmp_path / "entry.json"
    rc = evaluate.main(
        [str(bad), "--data", str(tiny_root), "--latency", "--images", "4", "--warmup", "1", "--entry", str(entry)]
    )
    assert rc == 3
    lat = capsys.readouterr().err.strip().splitlines()[-1]
    assert "got non-finite logits" in acc and "got non-finite logits" in lat and "no accuracy is reported" in lat
    assert "4 of 4 images" in lat and not entry.exists()
