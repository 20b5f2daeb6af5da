"""Figures the README and docs derive from committed data, recomputed here from that data: prose and data cannot
drift apart (a rate change that moves a figure fails until the docs say the new one)."""

from __future__ import annotations

import pytest
from support import ROOT

from recipes import timemodel as tm


def _flat(path: str) -> str:
    return " ".join((ROOT / path).read_text().split())


@pytest.fixture(scope="module")
def out_of_sample() -> list[dict]:
    entries = ROOT / "tests" / "data" / "dawnbench_entries" / "out_of_sample.json"
    return tm.out_of_sample(entries, tm.profile_model("resnet50"))


def test_out_of_sample_errors_quoted_in_readme_and_scaling(out_of_sample):
    totals = sorted(round(abs(r["mid"] / r["published_s"] - 1) * 100) for r in out_of_sample)
    phases = [s for r in out_of_sample for s in r["sizes"]]
    worst = max(round(abs(s["mid"] / s["published_s"] - 1) * 100) for s in phases)
    span = f"{totals[0]}-{totals[-1]}% off in total"
    assert f"{span}, up to {worst}% in one phase" in _flat("README.md")
    assert f"is {span} on runs it was not fitted on" in _flat("docs/scaling.md")
    fast16, fast8, fast4, huawei = (f"{r['mid'] / r['published_s'] - 1:+.0%}" for r in out_of_sample)
    quoted = f"The totals: fast.ai 16 x 8 {fast16}, 8 x 8 {fast8}, 4 x 8 {fast4}, Huawei {huawei}."
    assert quoted in _flat("docs/scaling.md")
