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
    assert f"is {span} on runs it was not fitted on, and up to {worst}% off in one phase." in _flat("docs/scaling.md")
    fast16, fast8, fast4, huawei = (f"{r['mid'] / r['published_s'] - 1:+.0%}" for r in out_of_sample)
    quoted = f"The totals: fast.ai 16 x 8 {fast16}, 8 x 8 {fast8}, 4 x 8 {fast4}, Huawei {huawei}."
    assert quoted in _flat("docs/scaling.md")


def test_fp16_against_bf16_on_the_h200_is_the_check_files_ratio():
    import json

    rows = json.loads((ROOT / "docs" / "data" / "gpu_check-h200-2026-12-04.json").read_text())["rows"]

    def rate(dtype: str, px: int) -> float:
        [r] = [r for r in rows if r["name"].startswith(f"train step resnet50_tweaked {dtype} {px}px")]
        return r["number"]

    at224, at128 = (f"{rate('fp16', px) / rate('bf16', px):.2f}x" for px in (224, 128))
    quoted = f"fp16, which ran {at224} bf16's rate at 224 px and {at128} at 128 px on one H200"
    assert quoted in _flat("README.md")


def test_the_quickstart_is_measured_in_one_place():
    """The README's quickstart table is the one measurement; docs/input.md points to it instead of quoting another
    run of the same command."""
    text = _flat("docs/input.md")
    assert "README.md#two-commands" in text
    for other in ("1:49", "191-221 img/s", "0:00:27"):
        assert other not in text
