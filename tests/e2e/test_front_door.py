"""The README's first command, run as a user types it: `make quickstart` (its own sample, torchrun and evaluate.py
lines), into a temporary sample folder and run directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT


def _make(*args: str) -> subprocess.CompletedProcess:
    """`make ARGS` from the repository root, as a user's shell runs it (no make or pytest variables inherited)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "PYTEST"))}
    p = subprocess.run(["make", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    return p


@pytest.mark.slow
def test_make_quickstart_trains_and_evaluates_as_typed(tmp_path):
    venv = Path(sys.prefix)
    if not (venv / ".installed").is_file():
        pytest.skip(f"{venv} was not made by `make install` (no .installed stamp): run the suite through `make test`")
    sample, run = tmp_path / "sample", tmp_path / "run"
    p = _make("quickstart", f"VENV={venv}", f"SAMPLE={sample}", f"RUN_DIR={run}")
    assert (sample / "sample.json").is_file()  # the Makefile's own `python data/make_sample.py` line ran, as a file
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert summary["final_top1"] >= 90.0
    assert summary["time_to_target_seconds"] is not None
    assert p.stdout.count("| summary") == 1  # rank 1 is quiet
    assert len((run / "dawnbench.tsv").read_text().splitlines()) == 1 + summary["epochs"]
    evaluation = json.loads((run / "eval.json").read_text())
    assert evaluation["count"] == 200
    assert evaluation["top1"] == pytest.approx(summary["final_top1"], abs=0.01)

    # `make compare` as the README shows it, on this run and a copy of it (the Makefile's own compare_runs line)
    shutil.copytree(run, tmp_path / "again")
    out = tmp_path / "compare"
    runs = f"{run} {tmp_path / 'again'}"
    _make("compare", f"VENV={venv}", f"RUNS={runs}", f"COMPARE_OUT={out}")
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = [ln for ln in out.with_suffix(".md").read_text().splitlines() if ln.startswith(("| run |", "| again |"))]
    top = f"| {summary['final_top1']:.2f}% / {summary['final_top5']:.2f}% |"
    assert sum(ln.endswith(top) for ln in rows) == 2, rows
