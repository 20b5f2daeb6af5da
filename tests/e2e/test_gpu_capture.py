"""gpu_check's `capture` part (scripts/gpu_check/gpu_check_capture.py) on the CPU: every case through the same code,
at tiny sizes, with tests/support.py's stand-in for torch.cuda's graph API where capturing needs CUDA; its rows
written after every case; and a record that states a wrong contract shown to fail its row."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from support import ROOT, FakeCudaGraphs, _Capture

from base import registry
from scripts.gpu_check import gpu_check
from scripts.gpu_check import gpu_check_capture as cap
from scripts.gpu_check import gpu_check_capture_cases as cases
from scripts.gpu_check import gpu_check_capture_probe as kit

pytest.importorskip("timm")


@pytest.fixture
def probe(monkeypatch):
    """A smoke probe capturing under the stand-in (installed first: GraphStep makes its side stream when built)."""
    fake = FakeCudaGraphs(None)
    fake.install(monkeypatch.setattr)
    # the speed bench sets multistream's NCCL order in os.environ; taken back when the test ends
    monkeypatch.setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1")
    p = kit.Probe("cpu", smoke=True, capture=True)
    fake.written = p.written
    p.fake = fake
    yield p
    p.close()


def _by_name(rows: list[dict]) -> dict[str, str]:
    return {r["name"]: r["result"] for r in rows}


def test_every_case_runs_under_the_stand_in_and_is_written_after_each(probe, tmp_path):
    rows, written = [], []
    out = tmp_path / "capture.json"

    def write():
        out.write_text(json.dumps({"rows": rows}))
        written.append([r["name"] for r in json.loads(out.read_text())["rows"]])

    cap.run_cases(rows, probe, write=write)
    got = _by_name(rows)
    phases = [n for n in got if n.startswith("capture phases:")]
    assert [n.split(" at ")[1].split(" px")[0] for n in phases] == ["8", "12", "16"]  # one GraphStep over each change
    assert all(got[n] == "pass" for n in phases), rows
    assert all(r["number"] > 0 for r in rows if r["name"] in phases)  # capture seconds per size
    for name, rec in registry.OPTIMIZERS.items():
        says = "captured" if rec.capturable else "refused"
        assert got[f"capture optimizers: optim.name={name} {says} as its record says"] == "pass", rows
    assert got["capture wrapped: comm.backend=ddp engaged at world 1 stays eager"] == "pass"
    hvd = got["capture wrapped: comm.backend=horovod engaged at world 1 stays eager"]
    assert hvd == ("pass" if not cases.horovod_missing() else f"skip: {cases.horovod_missing()}")
    churn = [n for n in got if n.startswith("capture churn:")]
    assert len(churn) == 2 and all(got[n].startswith("skip: the CUDA caching allocator") for n in churn)
    dali = "capture dali: GraphStep's static copy of DALI's zero-copy batch after a device delay = DALI's host copy"
    assert got[dali] == ("pass" if _dali() else "skip: nvidia.dali does not import (requirements: DALI)")
    speed = [n for n in got if n.startswith("capture speedup:")]
    assert len(speed) == 2 and all(got[n] == f"n/a: {cases.SMOKE}" for n in speed)  # CPU timings are not judged
    hier = [n for n in got if n.startswith("capture hierarchy: 2 processes each its own host")]  # the CPU twin
    assert len(hier) == 1 and got[hier[0]] == "pass" and "(CPU twin, gloo)" in hier[0], rows
    questions = [n for n in got if n.startswith("capture questions:")]
    assert len(questions) == 3 and all(
        got[n] == cases.NEED_CUDA for n in questions
    )  # the allocator's answers need CUDA
    assert not [r for r in rows if r["result"].startswith("fail")]
    # one write per case, each holding every row so far: a run cut off keeps what it measured
    assert len(written) == len(cap.CASES) and written[-1] == [r["name"] for r in rows]
    assert all(a == b[: len(a)] and len(a) < len(b) for a, b in zip(written, written[1:], strict=False))
    # phases 3 + lars and hybrid + dali 1 captured; the refused optimizers and the blocked churn steps never
    assert len(probe.fake.captured) >= 6 and probe.fake.replays > 0


def _dali() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


def test_a_pool_reused_at_the_phase_change_fails_the_phases_rows(probe, monkeypatch):
    """A GraphStep that captured every shape into one pool: the stand-in's allocator refuses the second capture (a
    live cuBLAS workspace holds the pool), and the probe's rows after the first phase change fail."""
    pool = probe.fake._new_pool()
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, **kw: _Capture(probe.fake, graph, pool))
    rows = []
    cap.run_cases(rows, probe, write=lambda: None, cases=["phases"])
    assert rows[0]["result"] == "pass"
    assert all(r["result"].startswith("fail: TrainingError: run.cuda_graph: capturing") for r in rows[1:]), rows
    assert len(rows) == 3


def test_an_optimizer_record_that_claims_capture_wrongly_fails_its_row(probe, monkeypatch):
    """torch's SGD declared capturable: the probe captures it, the capture refuses its host read, the row fails."""
    monkeypatch.setitem(
        registry.OPTIMIZERS, "sgd", dataclasses.replace(registry.OPTIMIZERS["sgd"], tensor_hparams=True)
    )
    monkeypatch.setattr(registry, "OPTIMIZERS", {"sgd": registry.OPTIMIZERS["sgd"]})
    rows = []
    cap.run_cases(rows, probe, write=lambda: None, cases=["optimizers"])
    [r] = rows
    assert r["name"] == "capture optimizers: optim.name=sgd captured as its record says"
    assert r["result"].startswith("fail: TrainingError: run.cuda_graph: capturing the training step"), r


def test_a_backend_decision_that_would_capture_ddp_fails_its_row(probe, monkeypatch):
    """A decision that looks at the world size instead of the wrapping captures the engaged DDP step (world 1),
    and the row says so."""
    decide = probe.decision

    def world_only(cfg, *, world_size: int = 1):
        unwrapped = dataclasses.replace(cfg, comm=dataclasses.replace(cfg.comm, engage_single_rank=False))
        return decide(unwrapped, world_size=world_size)

    monkeypatch.setattr(probe, "decision", world_only)
    monkeypatch.setattr(cases, "horovod_missing", lambda: "left out here")
    rows = []
    cap.run_cases(rows, probe, write=lambda: None, cases=["wrapped"])
    got = _by_name(rows)
    ddp_row = got["capture wrapped: comm.backend=ddp engaged at world 1 stays eager"]
    assert ddp_row.startswith("fail: ") and "graph_decision captures it" in ddp_row
    assert got["capture wrapped: comm.backend=horovod engaged at world 1 stays eager"] == "skip: left out here"


def test_the_cli_smoke_without_a_stand_in_skips_what_needs_cuda(tmp_path):
    """Each case in a process of its own, the rows gathered into one report that lists what was skipped."""
    out = tmp_path / "capture.json"
    cmd = [sys.executable, "-m", "scripts.gpu_check.gpu_check_capture", "--smoke", "--out", str(out), "--allow-skip"]
    p = subprocess.run([*cmd, "--cases", "phases", "optimizers"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads(out.read_text())
    assert report["gpu"] == "cpu" and report["smoke"] is True
    assert report["world_size"] == 1 and {"nccl", "driver", "commit"} <= set(report)
    got = _by_name(report["rows"])
    need = "skip: capturing needs CUDA (the test runs it under a CPU stand-in)"
    assert [got[n] for n in got if n.startswith("capture phases:")] == [need] * 3
    assert len(report["skipped"]) == list(got.values()).count(need) >= 4
    assert all(s.endswith(f"({need})") for s in report["skipped"])
    assert p.stderr.count("capture: phases done in") == 1 and p.stderr.count("capture: optimizers done in") == 1
    assert got["capture optimizers: optim.name=hybrid captured as its record says"] == need
    assert got["capture optimizers: optim.name=sgd refused as its record says"] == "pass"
    assert got["capture optimizers: optim.name=lamb refused as its record says"] == "pass"
    assert "| capture optimizers: optim.name=sgd refused as its record says | pass |" in p.stdout


def test_capture_is_a_part_of_its_own_outside_the_whole_check():
    assert "capture" in gpu_check.PARTS and "capture" not in gpu_check.WHOLE
    assert gpu_check.with_needs(["capture"]) == ["capture"]
    assert kit.CONFIG == "configs/dawnbench_158s_resnet50d.yaml" and cases.PHASE_SIZES == (96, 128, 224, 288)
    assert (cases.SPEEDUP_MIN, cases.WALL_PER_KERNEL_MAX, cases.CHURN_MAX) == (1.6, 1.15, 1.1)
