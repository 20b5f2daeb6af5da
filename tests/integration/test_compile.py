"""run.compile: the compiled training step gives eager's losses (within 1e-3 relative over 7 steps of two phases)
and weights (each tensor within 1e-2 relative, in norm), compiles once per phase (static shapes, not once per step),
its checkpoint is the plain module's (no `_orig_mod.` prefixes), so evaluate.py and a resume without compile read
it, and the run summary reports each phase shape's compile seconds and cache state."""

from __future__ import annotations

import json

import pytest
import torch
from support import tiny_config

from models.factory import compile_unavailable
from recipes.evaluation.accuracy import evaluate_checkpoint
from recipes.rundir import checkpoint_files as ckpt
from recipes.trainer import train

TWO_PHASES = "phases=[{epochs: 1, image_size: 32, batch_size: 12}, {epochs: 1, image_size: 40, batch_size: 16}]"


def step_losses(run_dir) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run_dir / "tb"))
    ea.Reload()
    return [e.value for e in ea.Scalars("train/loss")]


@pytest.mark.slow
def test_compiled_training_matches_eager_and_compiles_once_per_phase(tiny_root, tmp_path, two_layer_model):
    why = compile_unavailable(torch.device("cpu"))
    if why:
        pytest.skip(f"run.compile cannot run here: {why}")
    from torch._dynamo import reset
    from torch._dynamo.utils import counters

    over = ("run.deterministic=true", "log.tensorboard=true", TWO_PHASES)
    over += (f"model.name={two_layer_model}",)
    train(tiny_config(tiny_root, tmp_path / "eager", *over))
    reset()
    counters.clear()
    compiled = train(tiny_config(tiny_root, tmp_path / "compiled", *over, "run.compile=default"))
    assert counters["stats"]["unique_graphs"] == 2  # one per phase (32 px x 12, 40 px x 16), none per step
    # the summary reports each phase shape's compile seconds and cache state (run.compile_cache)
    assert sorted(compiled["compile"]) == ["12x3x32x32", "16x3x40x40"]
    # cold or warm as the machine's cache (run.compile_cache=auto) has it; a cold and a warm process:
    # tests/integration/test_compile_cache.py
    states = {v["cache"] for v in compiled["compile"].values()}
    assert states <= {"cold", "warm", "partial"} and all(v["compile_s"] > 0 for v in compiled["compile"].values())
    written = json.loads((tmp_path / "compiled" / "tiny" / "summary.json").read_text())
    assert written["compile"] == compiled["compile"]

    eager_losses = step_losses(tmp_path / "eager" / "tiny")
    compiled_losses = step_losses(tmp_path / "compiled" / "tiny")
    assert len(eager_losses) == len(compiled_losses) == compiled["steps"] == 7
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-3)

    a = ckpt.load(tmp_path / "eager" / "tiny" / "checkpoint.pt")["model"]
    b = ckpt.load(tmp_path / "compiled" / "tiny" / "checkpoint.pt")["model"]
    assert list(b) == list(a)  # the eager module's names: no `_orig_mod.` prefix
    for k, v in a.items():  # per tensor, the difference's norm within 1e-2 of the tensor's
        if v.is_floating_point():
            rel = float((v - b[k]).norm() / v.norm().clamp_min(1e-12))
            assert rel <= 1e-2, (k, rel)  # measured: at most 1.1e-3 (a BN bias)
    res = evaluate_checkpoint(str(tmp_path / "compiled" / "tiny" / "checkpoint.pt"), str(tiny_root))
    assert res["top1"] == compiled["final_top1"]


def test_compile_without_a_cpp_compiler_stops_before_the_run_starts(tiny_root, tmp_path, monkeypatch):
    import shutil

    from base.errors import ConfigError

    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(
        ConfigError,
        match=r"^run.compile=max-autotune: inductor on CPU needs a C\+\+ compiler .*"
        r"install one, or set run.compile=none$",
    ):
        train(tiny_config(tiny_root, tmp_path, "run.compile=max-autotune"))
    assert not (tmp_path / "tiny").exists()
