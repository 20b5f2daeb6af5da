"""The GPU check's thresholds, pinned as numbers and fed results that must fail: docs/gpu.md promises that no row
passes without a threshold that could have failed. The workers and the GPU are faked; the judging code is real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from recipes.evaluation import latency
from scripts.gpu_check import gpu_check_runs as runs


def _allreduce_rows(monkeypatch, tmp_path: Path, *, max_diff: float, rank_spread: float = 0.0) -> list[dict]:
    """check_allreduce's rows when every worker reports `max_diff` between multistream's and DDP's weights."""
    stats = {"bytes": 10 * 2**20, "steps": runs.WORKER_STEPS}

    def worker(cmd, log, timeout, cwd, env=None):
        out = Path(cmd[cmd.index("scripts.gpu_check.gpu_check_worker") + 1])
        result = {"ddp": stats, "multistream": stats, "max_diff": max_diff, "rank_spread": rank_spread}
        out.write_text(json.dumps(result))
        return 0

    monkeypatch.setattr(runs, "run_logged", worker)
    rows: list[dict] = []
    runs.check_allreduce(rows, tmp_path, gpus=2)
    assert len(rows) == 2  # gloo and NCCL
    return rows


def test_the_weight_threshold_is_1e_4():
    assert runs.WEIGHTS_ATOL == 1e-4  # fp32 SGD, 10 steps: summation order only


@pytest.mark.parametrize(
    "max_diff, rank_spread, result",
    [
        (9e-5, 0.0, "pass"),
        (1e-4, 0.0, "pass"),
        (1.2e-4, 0.0, "fail: 0.00012 > 0.0001"),
        (1e-3, 0.0, "fail: 0.001 > 0.0001"),
        (0.0, 2e-4, "fail: ranks disagree by 2.00e-04"),
    ],
)
def test_multistream_against_ddp_fails_above_1e_4(monkeypatch, tmp_path, max_diff, rank_spread, result):
    for r in _allreduce_rows(monkeypatch, tmp_path, max_diff=max_diff, rank_spread=rank_spread):
        assert r["result"] == result, r
        assert r["threshold"] == "<= 0.0001 max |w| diff"


def _latency_rows(monkeypatch, tmp_path: Path, agreement: dict[str, float]) -> list[dict]:
    """check_eval's rows when the batch-1 latency protocol reports `agreement` (% top-1 agreement with fp32)."""
    sample = tmp_path / "sample"
    for c in ("a", "b"):
        (sample / "train" / c).mkdir(parents=True)
    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.write_bytes(b"x")

    def evaluate(cmd, log, timeout, cwd, env=None):
        Path(cmd[cmd.index("--out") + 1]).write_text(json.dumps({"top1": 100.0, "count": 20}))
        return 0

    def protocol(path, *, data_root, modes, images, device, log):
        counter = log.__self__  # the check's GraphCounter: every graph mode captured one graph
        counter.counts.update({m: 1 for m in modes})
        results = {"none": {"latency_ms": {"excluding_preprocessing": {"mean": 2.0}}, "images": images}}
        for m in modes:
            ms = {"excluding_preprocessing": {"mean": 1.0}}
            results[m] = {"latency_ms": ms, "images": images, "agreement_top1": agreement[m]}
        return {"results": results}

    monkeypatch.setattr(runs, "run_logged", evaluate)
    monkeypatch.setattr(latency, "latency_checkpoint", protocol)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    rows: list[dict] = []
    runs.check_eval(rows, checkpoint, sample, tmp_path, bf16=True)
    return {r["name"]: r for r in rows}


def test_the_agreement_floor_is_90_percent():
    assert runs.AGREEMENT_MIN == 90.0


def test_a_reduced_precision_mode_below_90_percent_agreement_fails(monkeypatch, tmp_path):
    rows = _latency_rows(monkeypatch, tmp_path, {"compile": 100.0, "fp16": 89.5, "bf16": 90.0})
    fp16, bf16 = (
        rows["batch-1 latency --optimize fp16 (CUDA graphs)"],
        rows["batch-1 latency --optimize bf16 (CUDA graphs)"],
    )
    assert fp16["result"] == "fail: 89.5 < 90"
    assert fp16["threshold"] == ">= 90 % top-1 agreement with fp32"
    assert bf16["result"] == "pass"
    assert rows["batch-1 latency --optimize compile (CUDA graphs)"]["result"] == "pass"
    assert rows["evaluate.py (DALI) on the ddp run's checkpoint"]["result"] == "pass"
    zero = _latency_rows(monkeypatch, tmp_path / "zero", {"compile": 0.0, "fp16": 0.0, "bf16": 0.0})
    assert zero["batch-1 latency --optimize compile (CUDA graphs)"]["result"] == "fail: 0 < 90"
