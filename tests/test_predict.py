"""scripts/predict.py: the record prediction runs and reports every backend; the model reproduces a lab run it
was not fitted on (3 hosts; it was fitted on 2 and 4)."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import bench_allreduce  # noqa: E402
import netlab  # noqa: E402
import predict  # noqa: E402


def test_bad_input_exits_2(capsys):
    assert predict.main(["--link-gbit", "-1"]) == 2
    assert "error: --link-gbit" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.netns
@pytest.mark.skipif(netlab.available() is not None, reason=str(netlab.available()))
def test_model_reproduces_an_unfitted_lab_run(tmp_path):
    out = tmp_path / "lab.json"
    assert (
        bench_allreduce.main(
            [
                "--no-loopback",
                "--worlds",
                "3",
                "--link-mbit",
                "40",
                "--fraction",
                "0.05",
                "--steps",
                "2",
                "--rounds",
                "2",
                "--contenders",
                "ddp,multistream",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    rec = json.loads(out.read_text())[0]
    for method in ("ddp", "multistream"):
        pred, meas = predict.lab_predict(rec, method, predict.LAB_FIT), predict.measured(rec, method)
        assert abs(pred / meas - 1) < 0.15, (method, pred, meas)
