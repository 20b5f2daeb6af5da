"""The DAWNBench JSON entry (recipes/dawnbench.py) and the files a finished run leaves for a submission."""

from __future__ import annotations

import datetime
import json

import pytest
from conftest import ROOT, tiny_config

from recipes.config import ConfigError, load_config
from recipes.dawnbench import entry
from recipes.trainer import train

RECORD = [
    "optim.name=sgd", "optim.lr=25.0", "optim.final_lr=0.2", "optim.warmup_epochs=14", "optim.momentum=0.98",
    "optim.momentum_end=0.90", "optim.momentum_schedule=cyclic", "run.amp=fp16", "run.target_top5=93",
    "phases=[{epochs: 13, image_size: 96, batch_size: 32768}, {epochs: 11, image_size: 128, batch_size: 32768},"
    " {epochs: 3, image_size: 224, batch_size: 32768}, {epochs: 1, image_size: 288, batch_size: 16384,"
    " rect_val: true}]",
]  # fmt: skip
SUMMARY = {"world_size": 128, "epochs": 28, "steps": 1159, "time_to_target_seconds": 158.0, "train_seconds": 158.0,
           "wall_seconds": 171.5, "final_top1": 76.1, "final_top5": 93.04, "images_per_s": 230000.0}  # fmt: skip


def test_entry_fields_as_in_the_dawnbench_repository():
    extra = ["dawnbench.author=Team X", "dawnbench.cost_per_hour=329.6", "dawnbench.model=ResNet-50",
             "dawnbench.code_url=https://x"]  # fmt: skip
    cfg = load_config(ROOT / "configs" / "base.yaml", [*RECORD, *extra])
    e = entry(cfg, SUMMARY, "16 machine(s) x 8 x Tesla V100-SXM2-32GB", datetime.date(2026, 3, 17))
    assert list(e) == ["version", "author", "framework", "codeURL", "model", "hardware", "costPerHour", "timestamp",
                       "misc", "usedBlacklist"]  # fmt: skip
    assert e["version"] == "v1.0" and e["author"] == "Team X" and e["model"] == "ResNet-50"
    assert e["framework"].startswith("PyTorch 2.")
    assert e["hardware"] == "16 machine(s) x 8 x Tesla V100-SXM2-32GB"
    assert e["costPerHour"] == 329.6 and e["timestamp"] == "2026-03-17"
    m = e["misc"]
    assert [p["image_size"] for p in m["imageSize"]] == [96, 128, 224, 288]
    assert [p["epochs"] for p in m["imageSize"]] == [13, 11, 3, 1] and m["imageSize"][3]["rect_val"] is True
    assert m["batchSize"] == [{"batch_size": 32768, "epochs": 27}, {"batch_size": 16384, "epochs": 1}]
    assert m["schedule"]["max_lr"] == 25.0 and m["schedule"]["min_lr"] == 0.2
    assert (m["schedule"]["momentum"], m["schedule"]["max_momentum"], m["schedule"]["min_momentum"]) == (
        "cyclic", 0.98, 0.9)  # fmt: skip
    assert m["warmup_epochs"] == 14 and m["mixed_precision"] == "fp16" and m["target"] == {"top5": 93.0}
    assert m["iterations"] == 1159 and m["processes"] == 128
    assert m["cost_usd"] == pytest.approx(329.6 * 158.0 / 3600, abs=1e-4)


def test_optional_fields_are_left_out_when_not_configured():
    cfg = load_config(ROOT / "configs" / "base.yaml", [])
    e = entry(cfg, SUMMARY, "1 machine(s) x 1 x CPU (x86_64)")
    assert "costPerHour" not in e and "authorEmail" not in e and "codeURL" not in e
    assert "cost_usd" not in e["misc"]
    assert e["model"] == cfg.model.name
    assert datetime.date.fromisoformat(e["timestamp"]) == datetime.date.today()
    with pytest.raises(ConfigError, match="dawnbench.cost_per_hour: expected a number >= 0, got -1.0"):
        load_config(ROOT / "configs" / "base.yaml", ["dawnbench.cost_per_hour=-1"])


def test_a_finished_run_leaves_the_submission_files(tiny_root, tmp_path):
    run_dir = tmp_path / "sub"
    train(tiny_config(tiny_root, tmp_path, "dawnbench.author=Us", "dawnbench.cost_per_hour=3.06",
                      "run.target_top5=90"), run_dir=run_dir)  # fmt: skip
    summary = json.loads((run_dir / "summary.json").read_text())
    e = json.loads((run_dir / "dawnbench.json").read_text())
    assert e["author"] == "Us" and e["costPerHour"] == 3.06
    assert e["hardware"].startswith("1 machine(s) x 1 x CPU (")
    assert e["misc"]["iterations"] == summary["steps"] and e["misc"]["epochs"] == summary["epochs"] == 2
    assert e["misc"]["time_to_target_seconds"] == summary["time_to_target_seconds"]
    assert e["misc"]["cost_usd"] == pytest.approx(3.06 * summary["time_to_target_seconds"] / 3600, abs=1e-4)
    tsv = (run_dir / "dawnbench.tsv").read_text().splitlines()
    assert tsv[0] == "epoch\thours\ttop1Accuracy\ttop5Accuracy" and len(tsv) == 3
    # summary.json carries what compare_runs needs: the per-epoch history with wall-clock time, the comm counters.
    assert [r["epoch"] for r in summary["history"]] == [1, 2]
    assert all(r["wall_seconds"] >= r["train_seconds"] > 0 for r in summary["history"])
    assert summary["comm"]["backend"] == summary["comm_backend"] == "ddp"
    assert summary["comm"]["steps"] == 0 and summary["comm"]["comm_seconds_per_step"] is None  # one process
