"""Gradient accumulation (`run.accumulate`) on every allreduce backend, 2 gloo processes: A micro-batches give the
weights of one batch of A x the size, with the allreduce once per optimizer step (tests/comm_worker.py is one rank)."""

from __future__ import annotations

import pytest
from support import ROOT, TORCHRUN_BACKENDS, horovodrun, needs_horovod, rank_results, torchrun

from base import registry

WORKER = str(ROOT / "tests" / "comm_worker.py")
EXACT = 1e-5  # float32: the same sums in another order, over 3 SGD steps with momentum


def _check(results: list[dict], bytes_counted: bool = True, backend: str = "ddp") -> None:
    record = registry.ALLREDUCE_BACKENDS[backend]
    # a backend whose wire format rounds (ddp_bf16) is held to its own tolerance against the reference
    tol = EXACT if record.wire_dtype is None else record.reference_atol
    wire_bytes = {None: 4, "fp16": 2, "bf16": 2}[record.wire_dtype]
    for r in results:
        assert r["moved"] > 1e-3  # the steps did change the weights
        assert r["vs_one_batch"] < tol
        assert r["grad_norm_err"] < tol  # the logged norm: of the gradients averaged over ranks and micro-batches
        # one allreduce per optimizer step, not one per micro-batch
        assert r["steps"] == 3 and r["comm_steps"] == 3
        if bytes_counted:  # the bytes handed to the collectives (Horovod's count is derived, not measured)
            assert r["comm_bytes"] == 3 * r["param_bytes"] * wire_bytes // 4


@pytest.mark.parametrize("backend", TORCHRUN_BACKENDS)
def test_accumulated_micro_batches_match_one_large_batch(tmp_path, backend):
    out = tmp_path / backend
    out.mkdir()
    p = torchrun(2, [WORKER, "accumulate", str(out), backend, "3"], timeout=300)
    _check(rank_results(out, 2, f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}"), backend=backend)


@needs_horovod
def test_accumulated_micro_batches_match_one_large_batch_under_horovod(tmp_path):
    p = horovodrun(2, [WORKER, "accumulate", str(tmp_path), "horovod", "3"], timeout=300)
    results = rank_results(tmp_path, 2, f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    _check(results, bytes_counted=False, backend="horovod")  # Horovod asserts if a held pass had allreduced
