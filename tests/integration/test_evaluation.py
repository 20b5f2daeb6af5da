"""evaluate.py accuracy: exact counts for any world size, flip TTA, --rect, --data forms, clear errors."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from support import tiny_config, torchrun

import evaluate
from data.folder import scan_split
from data.transforms import normalize
from recipes.evaluation.accuracy import (
    FlipTTA,
    config_from_checkpoint,
    eval_config,
    evaluate_checkpoint,
    load_model,
    validated_phase,
)
from recipes.evaluation.latency import load_image
from recipes.rundir import checkpoint_files as ckpt
from recipes.trainer import train


def _manual_counts(checkpoint, root, tta: bool) -> tuple[int, int, int]:
    """top-1 hits, top-2 hits and count over every validation image, one at a time, without the pipeline."""
    ck = ckpt.load_checkpoint(checkpoint)
    cfg = config_from_checkpoint(ck)
    model = load_model(ck, cfg).eval()
    val = scan_split(root, "val", classes=ck.model_info.classes)
    size = cfg.phases[-1].val_image_size or cfg.phases[-1].image_size
    c1 = c2 = 0
    with torch.no_grad():
        for f, y in zip(val.files, val.labels, strict=True):
            x = normalize(load_image(f, size, cfg.data.val_crop_ratio), False)
            p = model(x).softmax(-1)
            if tta:
                p = p + model(x.flip(-1)).softmax(-1)
            top = p.topk(2, dim=-1).indices[0].tolist()
            c1 += top[0] == y
            c2 += y in top
    return c1, c2, len(val)


def test_flip_tta_is_mean_softmax_of_image_and_mirror():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(5))
    x = torch.randn(2, 3, 8, 8)
    net(x)
    want = ((net(x).softmax(-1) + net(x.flip(-1)).softmax(-1)) / 2).log()
    torch.testing.assert_close(FlipTTA(net)(x), want)
    sym = torch.cat([x[..., :4], x[..., :4].flip(-1)], dim=-1)  # a mirror-symmetric image: TTA changes nothing
    torch.testing.assert_close(FlipTTA(net)(sym).softmax(-1), net(sym).softmax(-1))


@pytest.mark.parametrize("tta", ["none", "flip"])
def test_accuracy_matches_image_by_image_count(tiny_checkpoint, tiny_root, tta):
    res = evaluate_checkpoint(str(tiny_checkpoint), str(tiny_root), batch_size=7, tta=tta)
    c1, _, n = _manual_counts(tiny_checkpoint, tiny_root, tta == "flip")
    assert res["count"] == n == 20
    assert res["top1"] == pytest.approx(100.0 * c1 / n)
    assert res["tta"] == tta


def test_cli_json_and_val_folder_form(tiny_checkpoint, tiny_root, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert evaluate.main([str(tiny_checkpoint), "--data", str(tiny_root / "val"), "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["data"] == str(tiny_root) and res["count"] == 20 and res["image_size"] == 32
    assert res["world_size"] == 1 and res["tta"] == "none" and res["rect_val"] is False
    assert "on 20 images (32 px, 1 process(es))" in capsys.readouterr().out
    assert evaluate.main([str(tiny_checkpoint), "--data", str(tiny_root), "--image-size", "40", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["image_size"] == 40


def test_rect_flag_reaches_the_phase(tiny_checkpoint, tiny_root, tmp_path):
    ck = ckpt.load_checkpoint(tiny_checkpoint)
    _, phase = eval_config(ck, data_root=str(tiny_root), rect=True)
    assert phase.rect_val is True and phase.root == "full"
    _, phase = eval_config(ck, data_root=str(tiny_root))
    assert phase.rect_val is False
    out = tmp_path / "rect.json"
    assert evaluate.main([str(tiny_checkpoint), "--data", str(tiny_root), "--rect", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["rect_val"] is True and res["count"] == 20


@pytest.mark.slow
def test_counts_every_image_once_for_any_world_size(tiny_checkpoint, tiny_root, tmp_path):
    single = evaluate_checkpoint(str(tiny_checkpoint), str(tiny_root), batch_size=3, tta="flip")
    for nproc in (2,):  # world size 3 (7, 7 and 6 images) without TTA: tests/e2e/test_distributed.py
        out = tmp_path / f"eval{nproc}.json"
        p = torchrun(
            nproc,
            [
                "evaluate.py",
                str(tiny_checkpoint),
                "--data",
                str(tiny_root),
                "--batch-size",
                "3",
                "--tta",
                "flip",
                "--out",
                str(out),
            ],
            timeout=300,
        )
        assert p.returncode == 0, p.stderr[-3000:]
        res = json.loads(out.read_text())
        assert res["world_size"] == nproc and res["count"] == 20
        assert res["top1"] == pytest.approx(single["top1"]) and res["top5"] == pytest.approx(single["top5"])
        assert res["loss"] == pytest.approx(single["loss"], rel=1e-5)


def test_bad_checkpoints_and_options_exit_2(tiny_checkpoint, tiny_root, tmp_path, capsys):
    assert evaluate.main([str(tmp_path / "nope.pt"), "--data", str(tiny_root)]) == 2
    assert "nope.pt' not found" in capsys.readouterr().err
    torch.save({"model": {}}, tmp_path / "foreign.pt")
    assert evaluate.main([str(tmp_path / "foreign.pt"), "--data", str(tiny_root)]) == 2
    assert "has no config: not written by this trainer" in capsys.readouterr().err
    state = ckpt.load(tiny_checkpoint)
    state["config"]["model"]["name"] = "resnet18"  # weights of resnet10t, config says resnet18
    torch.save(state, tmp_path / "mixed.pt")
    assert evaluate.main([str(tmp_path / "mixed.pt"), "--data", str(tiny_root)]) == 2
    assert "checkpoint was made for a different model" in capsys.readouterr().err
    cases = [
        (["--latency", "--optimize", "fast"], "unknown mode 'fast' (expected one of none, fuse"),
        (["--image-size", "-4"], "--image-size: expected an integer in [1, 4,096], got -4"),
        (["--entry", str(tmp_path / "e.json")], "--entry: the DAWNBench inference entry comes from"),
    ]
    for opts, msg in cases:
        assert evaluate.main([str(tiny_checkpoint), "--data", str(tiny_root), *opts]) == 2
        assert msg in capsys.readouterr().err


def test_dali_float16_images_evaluate_like_float32(tiny_checkpoint, tiny_root, tmp_path):
    """A checkpoint whose config makes DALI hand over fp16 images (GPU fp16 training) evaluates on the fp32 model."""
    pytest.importorskip("nvidia.dali")
    state = ckpt.load(tiny_checkpoint)
    state["config"]["data"]["dali_dtype"] = "float16"
    half = tmp_path / "half.pt"
    ckpt.save_atomic(state, half)
    res16 = evaluate_checkpoint(str(half), str(tiny_root), batch_size=7, backend="dali")
    res32 = evaluate_checkpoint(str(tiny_checkpoint), str(tiny_root), batch_size=7, backend="dali")
    assert res16["count"] == res32["count"] == 20
    assert res16["top1"] == pytest.approx(res32["top1"], abs=5.0)  # fp16 rounding may flip one image of 20
    assert res16["loss"] == pytest.approx(res32["loss"], rel=1e-2)


def test_a_mid_epoch_checkpoint_of_several_ranks_evaluates_with_their_average_bn_statistics(tiny_checkpoint):
    ck = ckpt.load_checkpoint(tiny_checkpoint)
    cfg = config_from_checkpoint(ck)
    names = [k for k in ck.model if k.endswith(("running_mean", "running_var"))]
    ranks = [{k: ck.model[k] + 1.0 for k in names}, {k: ck.model[k] + 3.0 for k in names}]
    model = load_model(dataclasses.replace(ck, bn_per_rank=ranks), cfg)
    loaded = model.state_dict()
    assert names and all(torch.allclose(loaded[k], ck.model[k] + 2.0) for k in names)
    plain = load_model(ck, cfg).state_dict()  # an epoch-end checkpoint: as saved
    assert all(torch.equal(plain[k], ck.model[k]) for k in names)


def test_the_default_crop_is_the_one_the_trainer_last_validated_at(tiny_root, tmp_path, capsys):
    two = "phases=[{epochs: 1, image_size: 32, batch_size: 12}, {epochs: 1, image_size: 40, batch_size: 12}]"
    cfg = tiny_config(tiny_root, tmp_path, two, "run.deterministic=true")
    assert validated_phase(cfg, {"epoch": 0}) == (0, "phase 0's: no epoch validated yet (0 of 2 epochs)")
    assert validated_phase(cfg, {"epoch": 2}) == (1, "phase 1's, the last (the run finished)")
    stopped = train(cfg, stop_after_epochs=1)  # stopped in phase 0: it validated at 32 px, not the last phase's 40
    out = tmp_path / "eval.json"
    assert evaluate.main([str(tmp_path / "tiny" / "checkpoint.pt"), "--data", str(tiny_root), "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["image_size"] == 32
    assert res["image_size_from"] == "phase 0's, where the trainer last validated (after epoch 1 of 2)"
    assert (
        "crop size 32 px: phase 0's, where the trainer last validated (after epoch 1 of 2)" in capsys.readouterr().out
    )
    assert (res["top1"], res["top5"]) == (stopped["final_top1"], stopped["final_top5"])
