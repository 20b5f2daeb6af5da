"""A GPU proof has a scope (recipes/proofs.py): `run.cuda_graph=auto` captures a phase only inside the scope of a
proof of every part it uses, `--plan` names the scope that is missing, and scripts/gpu_check/prove.py writes a proof
from the capture probe's own report (a failed or skipped row proves nothing without its flag)."""

from __future__ import annotations

import json

import pytest
from support import ROOT

from base.errors import ConfigError
from recipes import proofs
from recipes.config import load_config
from recipes.steps import graph_decision
from scripts.gpu_check import prove

RECORD = ("optim.name=hybrid", "comm.backend=multistream")


def _report(**rows) -> dict:
    """A capture probe's report: the record's phases and the hybrid row passed, world size 1, no DALI row run."""
    names = {
        "capture phases: the record's step at 96 px (64/GPU), one GraphStep over 96 -> 128 px": "pass",
        "capture phases: the record's step at 128 px (64/GPU), one GraphStep over 96 -> 128 px": "pass",
        "capture optimizers: optim.name=hybrid captured as its record says": "pass",
        "capture optimizers: optim.name=sgd refused as its record says": "pass",
        "capture dali: GraphStep's static copy of DALI's zero-copy batch after a device delay = DALI's host copy": (
            "skip: nvidia.dali does not import (requirements: DALI)"
        ),
        **rows,
    }
    scope = {"gpu": "NVIDIA H200", "torch": "2.14.1+cu130", "nccl": "2.27.3", "driver": "580.65.06"}
    scope |= {"commit": "4dcafaa0123456789", "date": "2026-12-07", "world_size": 1, "complete": True}
    return {**scope, "rows": [{"name": n, "result": r} for n, r in names.items()]}


def _decide(cfg, world: int, known) -> tuple[bool, str]:
    return graph_decision(
        cfg.run,
        cfg.comm,
        optim=cfg.optim.name,
        device_type="cuda",
        world_size=world,
        dali=cfg.data.backend == "dali",
        proofs=known,
    )


def test_a_one_rank_proof_without_dali_leaves_a_two_rank_dali_run_eager_and_says_what_is_missing(tmp_path):
    proof = prove.proof_from_report(_report(), allow_skip=True, record_parts=RECORD)
    assert proof.parts == ("optim.name=hybrid", "comm.backend=multistream") and not proof.dali
    cfg = load_config(ROOT / "configs/dawnbench_158s.yaml")  # data.backend=dali, multistream, hybrid LARS
    ok, why = _decide(cfg, 2, [proof])
    assert not ok
    assert why == (
        "no GPU proof covers this run (optim.name=hybrid: its proof does not cover world size 2 (proven at 1) and "
        "the DALI input pipeline (proven without it); comm.backend=multistream: its proof does not cover world "
        "size 2 (proven at 1) and the DALI input pipeline (proven without it); run.cuda_graph=true captures it; "
        "docs/gpu.md)"
    )
    # inside its scope the same proof unlocks the step: one rank (multistream does not engage), no DALI
    torch_loader = load_config(ROOT / "configs/dawnbench_158s.yaml", ["data.backend=torch"])
    assert _decide(torch_loader, 1, [proof]) == (True, "")
    # a proof at 2 ranks with DALI covers the 2-rank DALI run; not 4 ranks
    wide = proofs.parse_proof({**proofs.to_json(proof), "world_size": 2, "dali": True}, "test")
    assert _decide(cfg, 2, [proof, wide]) == (True, "")
    assert "world size 4 (proven at 2)" in _decide(cfg, 4, [wide])[1]
    other_torch = proofs.Scope(world_size=1, dali=False, torch="2.11.0")
    assert proofs.lacks(proof, other_torch) == ["torch 2.11 (proven on 2.14.1+cu130)"]


def test_plan_names_the_missing_scope_and_the_driver_conditions(tmp_path, capsys, monkeypatch):
    import recipes.schedule_report as report
    import train

    path = tmp_path / "gpu-proofs.json"
    (tmp_path / "gpu_check.json").write_text(json.dumps(_report()))
    args = [str(tmp_path / "gpu_check.json"), "--allow-skip", "--proofs", str(path)]
    assert prove.main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("proven: optim.name=hybrid, comm.backend=multistream on NVIDIA H200, world size 1, without")
    monkeypatch.setattr(proofs, "PROOFS", path)
    monkeypatch.setattr(report, "plot_plan", lambda *a, **k: b"")
    plan = ["-c", str(ROOT / "configs/dawnbench_158s.yaml"), "--plan", "--world-size", "2"]
    assert train.main([*plan, f"run.out_dir={tmp_path}", f"data.root={tmp_path / 'none'}"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("run.cuda_graph=")]
    # the record's multistream on NCCL: what the driver decides, with the advice
    assert "overlap only with NCCL >= 2.26 and a CUDA 12.3 driver or newer (R545+); on an older driver (R535" in out
    assert "a captured step keeps the communicators overlapping only with NCCL >= 2.27.3 and a CUDA 12.9 driver" in out
    assert lines and all(
        "optim.name=hybrid: its proof does not cover world size 2 (proven at 1) and the DALI input pipeline" in ln
        for ln in lines
    ), lines


def test_prove_refuses_a_report_that_proves_nothing_and_a_skip_without_its_flag(tmp_path, capsys):
    skip = "capture dali: GraphStep's static copy of DALI's zero-copy batch after a device delay = DALI's host copy"
    with pytest.raises(ConfigError, match=r"^1 capture row\(s\) skipped \(--allow-skip accepts that\): capture dali"):
        prove.proof_from_report(_report(), allow_skip=False, record_parts=RECORD)
    proof = prove.proof_from_report(_report(), allow_skip=True, record_parts=RECORD)
    assert proof.skipped == (f"{skip} (skip: nvidia.dali does not import (requirements: DALI))",)
    bad = _report(**{"capture optimizers: optim.name=hybrid captured as its record says": "fail: 2e-3 > 1e-4"})
    with pytest.raises(ConfigError, match=r"^1 capture row\(s\) failed, nothing is proven: capture optimizers"):
        prove.proof_from_report(bad, allow_skip=True, record_parts=RECORD)
    with pytest.raises(ConfigError, match="a --smoke report ran on the CPU"):
        prove.proof_from_report({**_report(), "smoke": True}, allow_skip=True, record_parts=RECORD)
    # the DALI row passed: the proof covers DALI; a phases row skipped leaves the record's backend unproven
    ran = _report(
        **{
            skip: "pass",
            "capture phases: the record's step at 96 px (64/GPU), one GraphStep over 96 -> "
            "128 px": "skip: capturing needs CUDA",
        }
    )
    proof = prove.proof_from_report(ran, allow_skip=True, record_parts=RECORD)
    assert proof.dali and proof.parts == ("optim.name=hybrid",)
    # the command: one line naming the report, exit 1, nothing written
    (tmp_path / "r.json").write_text(json.dumps(_report()))
    assert prove.main([str(tmp_path / "r.json"), "--proofs", str(tmp_path / "p.json")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"prove: {tmp_path / 'r.json'}: 1 capture row(s) skipped") and err.count("\n") == 1
    assert not (tmp_path / "p.json").exists()


def test_a_bad_proofs_file_is_one_line(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"proofs": [{**proofs.to_json(_proof()), "world_size": 0}]}))
    with pytest.raises(ConfigError, match=r"proofs\[0\]\.world_size: expected an integer >= 1, got 0$"):
        proofs.load_proofs(path)
    assert proofs.load_proofs(tmp_path / "absent.json") == []


def _proof() -> proofs.Proof:
    return prove.proof_from_report(_report(), allow_skip=True, record_parts=RECORD)
