"""run.ema in the trainer: updated after every step, validated alongside the model (log, history, summary), saved in
the checkpoint, restored bit-identically on resume, and evaluated by evaluate.py --ema."""

from __future__ import annotations

import pytest
import torch
from support import tiny_config

import evaluate
from recipes.evaluation.accuracy import evaluate_checkpoint
from recipes.rundir import checkpoint_files as ckpt
from recipes.trainer import train

THREE_EPOCHS = "phases=[{epochs: 3, image_size: 32, batch_size: 12}]"


def test_ema_with_decay_zero_is_the_model_and_is_reported(tiny_root, tmp_path, capsys):
    """Decay 0: after every step the EMA equals the weights (and BN statistics) just trained, so it must be
    bit-identical to the model in the checkpoint and score the same at every validation."""
    summary = train(tiny_config(tiny_root, tmp_path, "run.ema=true", "run.ema_decay=0", "log.tensorboard=true"))
    ck = ckpt.load(tmp_path / "tiny" / "checkpoint.pt")
    assert ck["ema"].keys() == ck["model"].keys()
    for k, v in ck["model"].items():
        assert torch.equal(v, ck["ema"][k]), k
    for row in summary["history"]:
        assert (row["ema_top1"], row["ema_top5"]) == (row["top1"], row["top5"])
    assert summary["final_ema_top1"] == summary["final_top1"]
    out = capsys.readouterr().out
    assert f"EMA top1 {summary['final_ema_top1']:.2f}%" in out
    assert "| final EMA top-1 / top-5" in out
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(tmp_path / "tiny" / "tb"))
    ea.Reload()
    assert [e.value for e in ea.Scalars("val/ema_top1")] == pytest.approx([r["ema_top1"] for r in summary["history"]])
    assert {"val/ema_top5", "val/ema_loss"} <= set(ea.Tags()["scalars"])


def test_ema_resumes_bit_identically(tiny_root, tmp_path):
    over = ("run.deterministic=true", "run.ema=true", "run.ema_decay=0.8", THREE_EPOCHS)
    full = train(tiny_config(tiny_root, tmp_path / "a", *over))
    train(tiny_config(tiny_root, tmp_path / "b", *over), stop_after_epochs=1)
    resumed = train(tiny_config(tiny_root, tmp_path / "b", *over))
    a = ckpt.load(tmp_path / "a" / "tiny" / "checkpoint.pt")
    b = ckpt.load(tmp_path / "b" / "tiny" / "checkpoint.pt")
    for k, v in a["ema"].items():
        assert torch.equal(v, b["ema"][k]), k
    assert not all(torch.equal(v, a["model"][k]) for k, v in a["ema"].items())  # an average, not a copy
    assert [r["ema_top1"] for r in resumed["history"]] == [r["ema_top1"] for r in full["history"]]


def test_evaluate_ema_scores_the_ema_weights(tiny_root, tmp_path, tiny_checkpoint, capsys):
    summary = train(tiny_config(tiny_root, tmp_path, "run.ema=true", "run.ema_decay=0.5"))
    path = str(tmp_path / "tiny" / "checkpoint.pt")
    res = evaluate_checkpoint(path, str(tiny_root), ema=True)
    assert (res["top1"], res["top5"], res["weights"]) == (summary["final_ema_top1"], summary["final_ema_top5"], "ema")
    assert evaluate.main([str(tiny_checkpoint), "--data", str(tiny_root), "--ema"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: CheckpointError: checkpoint '{tiny_checkpoint}' has no EMA weights (it was trained with run.ema=false)"
    ]


def test_resume_turns_the_ema_on_and_off(tiny_root, tmp_path, capsys):
    over = ("run.deterministic=true", THREE_EPOCHS)
    train(tiny_config(tiny_root, tmp_path, *over), stop_after_epochs=1)
    before = ckpt.load(tmp_path / "tiny" / "checkpoint.pt")
    assert "ema" not in before
    train(tiny_config(tiny_root, tmp_path, *over, "run.ema=true", "run.ema_decay=1e-9"), stop_after_epochs=1)
    assert "the checkpoint has no EMA (run.ema was off): the EMA starts from its weights" in capsys.readouterr().out
    after = ckpt.load(tmp_path / "tiny" / "checkpoint.pt")
    for k, v in after["model"].items():  # a decay of ~0: the EMA is the weights of its last step
        assert torch.allclose(v.float(), after["ema"][k].float(), atol=1e-6), k
    train(tiny_config(tiny_root, tmp_path, *over))
    assert "the checkpoint's EMA weights are dropped (run.ema=false)" in capsys.readouterr().out
    assert "ema" not in ckpt.load(tmp_path / "tiny" / "checkpoint.pt")
