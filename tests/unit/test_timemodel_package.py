"""The time model as a package: the names other modules import from `recipes.timemodel` keep working, every module
stays under 500 lines, and `train.py --plan --gpu` with a backend the time model has no row for says so."""

from __future__ import annotations

import dataclasses

from support import ROOT

import recipes.timemodel as tm
from base import registry
from recipes.config import load_config
from recipes.schedule_report import print_plan


def test_the_package_exports_what_the_tree_imports():
    for name in ("calibrated_compute", "predict", "predicted_seconds", "estimate", "backends", "published"):
        assert callable(getattr(tm, name)), name
    assert tm.IMAGENET_TRAIN_IMAGES == 1_281_167 and tm.VAL_IMAGES == 48_238
    assert sorted(tm.__all__) == sorted(set(tm.__all__))
    assert all(hasattr(tm, n) for n in tm.__all__)
    assert not (ROOT / "recipes" / "timemodel.py").exists()
    big = {
        p.name: n for p in (ROOT / "recipes" / "timemodel").glob("*.py") if (n := len(p.read_text().splitlines())) > 500
    }
    assert not big, big


def test_plan_with_a_backend_without_a_time_model_row(tmp_path, capsys):
    cfg = load_config(ROOT / "configs" / "dawnbench_158s.yaml", [f"run.out_dir={tmp_path}"])
    cfg = dataclasses.replace(cfg, comm=dataclasses.replace(cfg.comm, backend="ddp_fp16"))
    seconds, why = tm.predicted_seconds(cfg, 128, "v100-32gb")
    assert seconds is None
    names = ", ".join(registry.ALLREDUCE_BACKENDS)
    assert why == f"comm.backend 'ddp_fp16' has no row in the time model (backends: {names})"
    assert print_plan(cfg, 1_281_167, 128, png=str(tmp_path / "p.png"), gpu="v100-32gb") == 0
    assert f"predicted time: none ({why})" in capsys.readouterr().out
