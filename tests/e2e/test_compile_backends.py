"""run.compile on 2 gloo ranks: DDP (compiled around its wrapper) and multistream (its gradient hooks outside the
compiled graph, the kind Horovod's are too; `run_two_ranks` takes "horovod" for a local check) still average the
gradients, so the compiled runs end with the eager run's weights within fp32's rounding of the reordered reductions,
with run.ema on (its BN statistics averaged over ranks before validation).

The tolerance comes from the dtype and the operation, not from one machine: the compiled graph fuses kernels and
sums in another order (and with another vector width on AVX2 than on AVX-512), which moves a sum of n fp32 terms by
at most about n x u of the sum of their magnitudes (u = 2^-24, Higham's gamma_n), once per optimizer step. A tensor
whose values cancel (a BN bias ahead of another BN is ~1e-6) has no precision of its own, so the scale each tensor
is judged against is its norm plus the entry's root-mean-square value over its elements."""

from __future__ import annotations

import json

import pytest
import torch
from support import ROOT, TORCHRUN_BACKENDS, TWO_LAYER, horovodrun, rank_results, torchrun

from base import registry
from models.factory import compile_unavailable
from recipes.rundir import checkpoint_files as ckpt

PHASE = "phases=[{epochs: 1, image_size: 32, batch_size: 12}]"
U = 2.0**-24  # fp32 unit roundoff
LONGEST_SUM = 12 * 32 * 32  # a weight gradient sums over at most the global batch x pixels at 32 px


def within_rounding(eager: dict, compiled: dict, steps: int) -> list[tuple[str, float, float]]:
    """(name, |difference|, allowed) of every floating-point tensor of `eager` outside the rounding bound."""
    floats = {k: v.double() for k, v in eager.items() if v.is_floating_point()}
    rms = (sum(float(v.pow(2).sum()) for v in floats.values()) / sum(v.numel() for v in floats.values())) ** 0.5
    bad = []
    for k, v in floats.items():
        diff = float((v - compiled[k].double()).norm())
        allowed = steps * LONGEST_SUM * U * (float(v.norm()) + rms * v.numel() ** 0.5)
        if diff > allowed:
            bad.append((k, diff, allowed))
    return bad


def run_two_ranks(root, run_dir, backend: str, *overrides: str) -> dict:
    """tests/tiny.yaml with the two-layer network (TWO_LAYER: inductor compiles it in seconds, resnet10t in minutes)
    on 2 ranks of `backend`, through tests/train_worker.py (train.py's `train`, with the network registered)."""
    over = [f"data.root={root}", f"model.name={TWO_LAYER.name}", f"comm.backend={backend}", "run.deterministic=true"]
    over += ["run.ema=true", "run.ema_decay=0.5", PHASE, *overrides]
    job = {"id": backend, "config": "tests/tiny.yaml", "overrides": over, "run_dir": str(run_dir), "two_layer": True}
    jobs = run_dir.parent / f"{run_dir.name}-jobs.json"
    jobs.write_text(json.dumps([job]))
    args = [str(ROOT / "tests" / "train_worker.py"), str(jobs)]
    p = horovodrun(2, args) if backend == "horovod" else torchrun(2, args)
    rank_results(run_dir, 2, (p.stdout + p.stderr)[-3000:])
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    return ckpt.load(run_dir / "checkpoint.pt")


@pytest.fixture(scope="module")
def eager_run(tiny_root, tmp_path_factory) -> dict:
    """The eager reference: DDP. Multistream's eager gradients are DDP's to fp32 rounding (tests/e2e/
    test_comm_backends.py: vs_ddp <= 1e-7), so one eager run is the reference for every backend's compiled run."""
    return run_two_ranks(tiny_root, tmp_path_factory.mktemp("eager"), "ddp")


@pytest.mark.slow
@pytest.mark.parametrize("backend", TORCHRUN_BACKENDS)  # Horovod's hooks are multistream's kind; CI time
def test_compiled_training_averages_gradients_on_every_backend(tiny_root, tmp_path, backend, eager_run):
    why = compile_unavailable(torch.device("cpu"))
    if why:
        pytest.skip(f"run.compile cannot run here: {why}")
    if registry.ALLREDUCE_BACKENDS[backend].wire_dtype is not None:
        # ddp_bf16 compiled ended 0.035 (max abs) from eager DDP's weights after 4 steps; against its own eager run
        # it was not compared yet: not claimed
        pytest.skip(f"{backend} under run.compile is not checked (its wire format rounds; no eager reference)")
    eager = eager_run
    compiled = run_two_ranks(tiny_root, tmp_path / "compiled", backend, "run.compile=default")
    assert list(compiled["model"]) == list(eager["model"])
    steps = eager["state"]["step"]
    assert steps == compiled["state"]["step"] == 4  # 48 images, a global batch of 12
    for entry in ("model", "ema"):
        assert within_rounding(eager[entry], compiled[entry], steps) == [], entry
