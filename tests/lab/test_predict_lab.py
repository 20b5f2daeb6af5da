"""lab/predict_lab.py: the step-time model reproduces a network-lab run it was not fitted on (3 hosts; it was fitted
on 2 and 4), and `python lab/predict_lab.py` fits and checks the model on lab files."""

from __future__ import annotations

import json

import pytest

from lab import bench_allreduce, netlab, predict_lab


def _lab_run(tmp_path, flow_ratio: int, contenders: str) -> dict:
    out = tmp_path / f"lab-{flow_ratio}.json"
    argv = ["--no-loopback", "--worlds", "3", "--link-mbit", "100", "--flow-ratio", str(flow_ratio)]
    argv += ["--fraction", "0.05", "--steps", "2", "--rounds", "2", "--contenders", contenders, "--json", str(out)]
    assert bench_allreduce.main(argv) == 0
    return json.loads(out.read_text())[0]


@pytest.mark.slow
@pytest.mark.netns
@pytest.mark.skipif(netlab.available() is not None, reason=str(netlab.available()))
def test_model_reproduces_an_unfitted_lab_run(tmp_path):
    # Per-flow cap of a third of the link: ddp's one flow per direction is held to it. Multistream is checked where
    # the link cap binds (per-flow cap = link): the lab hashes flows into leaves on 8 bits of the source port, and
    # in some runs two of multistream's K connections share a leaf (half the cap for that slice), which the model
    # of a cloud's per-flow cap leaves out (at 40 Mbit/s: measured 1.44 s or 2.12 s for one predicted 1.52 s). At
    # 100 Mbit/s and 1/20 of each gradient the model was within 4% of all three (2026-12-05, 2-core machine).
    runs = [(_lab_run(tmp_path, 3, "ddp"), "ddp")]
    uncapped = _lab_run(tmp_path, 1, "ddp,multistream")
    runs += [(uncapped, "ddp"), (uncapped, "multistream")]
    for rec, method in runs:
        pred, meas = predict_lab.lab_predict(rec, method, predict_lab.LAB_FIT), predict_lab.measured(rec, method)
        assert abs(pred / meas - 1) < 0.15, (method, rec["flow_mbit"], pred, meas)


def test_a_missing_lab_file_is_one_error_line(tmp_path, capsys):
    """`python lab/predict_lab.py FILE ...` (what `scripts/predict.py --validate` did): a file that is not there is
    named on one line, exit 2, before any fitting."""
    missing = tmp_path / "lab.json"
    assert predict_lab.main([str(missing), "--fit-hosts", "2", "4"]) == 2
    assert capsys.readouterr().err == f"error: lab file '{missing}' does not exist\n"


def test_the_lab_file_is_checked_against_the_fit(tmp_path, capsys):
    """One lab record, fitted on its own host count: the table has a row per default method measured there."""
    rec = {"hosts": 2, "link_mbit": 40.0, "flow_mbit": 13.33, "torch": {"fraction": 0.05, "compute_s": 0.2}}
    rec["torch"]["ddp"] = {"settings": "bucket_cap_mb 1.25", "step_s": 1.5}
    path = tmp_path / "lab.json"
    path.write_text(json.dumps([rec]))
    assert predict_lab.main([str(path), "--fit-hosts", "2"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2 |")]
    assert (
        len(rows) == 1
        and rows[0].startswith("| 2 | ddp | bucket_cap_mb 1.25 | 1500 | ")
        and rows[0].endswith("| yes |")
    )
