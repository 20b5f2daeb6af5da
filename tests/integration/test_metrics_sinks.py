"""One name per metric in every sink: a tiny CPU training's console step lines, TensorBoard tags, progress.json,
history rows (checkpoint and summary.json) carry the names of recipes/metrics.py, and the same values."""

from __future__ import annotations

import json

import pytest
from support import tiny_config

from recipes import metrics
from recipes.rundir import checkpoint_files as ckpt
from recipes.trainer import train


def test_every_sink_carries_the_records_names(tiny_root, tmp_path, capsys):
    summary = train(tiny_config(tiny_root, tmp_path, "log.tensorboard=true"))  # run.ema off: no ema_* metrics
    run = tmp_path / "tiny"
    window_names = {m.name for m in metrics.WINDOW}
    epoch_names = {m.name for m in metrics.EPOCH if not m.name.startswith("ema_")}

    progress = json.loads((run / "progress.json").read_text())
    assert set(progress) == {"step", "epoch", "wall_seconds"} | window_names  # the wall time: what a restart loses
    window = {k: v for k, v in progress.items() if k not in ("step", "epoch", "wall_seconds")}
    assert window["grad_norm"] > 0 and window["loss"] > 0 and window["lr"] == 0.0  # the last step: decayed to 0

    # the last step line is the record's format of the window progress.json holds
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("epoch 2/2  step")]
    assert lines[-1] == metrics.step_line(1, 2, 4, 4, window)
    assert "grad_norm " in lines[-1]

    history = ckpt.load(run / "checkpoint.pt")["state"]["history"]
    saved = json.loads((run / "summary.json").read_text())
    assert [set(r) for r in history] == [epoch_names] * 2
    assert saved["history"] == history == summary["history"]
    assert saved["images_per_s"] > 0 and all(r["grad_norm"] > 0 for r in history)
    # the data wait (is the run input-bound?): a number between 0 and the mean step's time, and its share of it
    step_ms = saved["train_seconds"] / history[-1]["step"] * 1000
    assert 0 < saved["data_wait_ms"] < step_ms and 0 < saved["data_wait_share"] < 1
    assert saved["data_wait_ms"] == pytest.approx(sum(r["data_wait_ms"] for r in history) / len(history))
    assert window["data_wait_ms"] > 0 and f"data wait {window['data_wait_ms']:.1f} ms" in lines[-1]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run / "tb"))
    ea.Reload()
    tags = {metrics.window_tag(m) for m in metrics.WINDOW}
    tags |= {metrics.epoch_tag(m) for m in metrics.EPOCH if metrics.epoch_tag(m) and m.name in epoch_names}
    assert set(ea.Tags()["scalars"]) == tags
    assert ea.Scalars("train/grad_norm")[-1].value == pytest.approx(window["grad_norm"], rel=1e-6)
    assert [e.value for e in ea.Scalars("epoch/grad_norm")] == pytest.approx([r["grad_norm"] for r in history])
    assert [e.value for e in ea.Scalars("val/loss")] == pytest.approx([r["val_loss"] for r in history])
