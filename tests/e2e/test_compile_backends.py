"""run.compile on 2 gloo ranks: DDP (compiled around its wrapper) and multistream (its gradient hooks outside the
compiled graph, the kind Horovod's are too; `run_two_ranks` takes "horovod" for a local check) still average the
gradients, so the compiled runs end with the eager run's weights (each tensor within 1e-2 relative, in norm, after
4 steps), with run.ema on (its BN statistics averaged over ranks before validation)."""

from __future__ import annotations

import pytest
import torch
from support import ROOT, horovodrun, torchrun

from models.factory import compile_unavailable
from recipes.run import checkpoint_files as ckpt

PHASE = "phases=[{epochs: 1, image_size: 32, batch_size: 12}]"


def run_two_ranks(root, run_dir, backend: str, *overrides: str) -> dict:
    args = ["train.py", "-c", str(ROOT / "tests" / "tiny.yaml"), "--run-dir", str(run_dir), f"data.root={root}"]
    args += [f"comm.backend={backend}", "run.deterministic=true", "run.ema=true", "run.ema_decay=0.5", PHASE]
    p = horovodrun(2, [*args, *overrides]) if backend == "horovod" else torchrun(2, [*args, *overrides])
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    return ckpt.load(run_dir / "checkpoint.pt")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ddp", "multistream"])  # Horovod's hooks are multistream's kind; CI time
def test_compiled_training_averages_gradients_on_every_backend(tiny_root, tmp_path, backend):
    why = compile_unavailable(torch.device("cpu"))
    if why:
        pytest.skip(f"run.compile cannot run here: {why}")
    eager = run_two_ranks(tiny_root, tmp_path / "eager", backend)
    compiled = run_two_ranks(tiny_root, tmp_path / "compiled", backend, "run.compile=default")
    assert list(compiled["model"]) == list(eager["model"])
    for entry in ("model", "ema"):  # per tensor, the difference's norm within 1e-2 of the tensor's
        for k, v in eager[entry].items():
            if v.is_floating_point():
                rel = float((v - compiled[entry][k]).norm() / v.norm().clamp_min(1e-12))
                assert rel <= 1e-2, (entry, k, rel)
