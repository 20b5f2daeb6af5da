"""docs/allreduce.md's hierarchical-ring rows (section "Multi-GPU hosts: comm.hierarchy host") against their sources:
every table row is lab/uneven_tables.py's output from the committed JSON (docs/data/lab-hier-*.json, hosts of 2 local
ranks), the model's rows are lab/predict_flows.py's, and the figures the prose quotes are recomputed here."""

from __future__ import annotations

import statistics

from support import ROOT

from lab import predict_flows, uneven_tables

DOC = ROOT / "docs" / "allreduce.md"
DATA = [ROOT / "docs" / "data" / f"lab-hier-{n}.json" for n in (4, 8)]


def _recs() -> list[dict]:
    return uneven_tables.load([str(p) for p in DATA])


def _flat(path) -> str:
    return " ".join(path.read_text().split())


def test_every_hierarchy_row_is_its_data_files():
    doc = DOC.read_text().splitlines()
    recs = _recs()
    assert {(r["hosts"], r["local_ranks"]) for r in recs} == {(4, 2), (8, 2)}
    rows = uneven_tables.hier_summary(recs)[2:] + uneven_tables.hier_rows(recs)[2:]
    assert len(rows) >= len(recs) + 6
    for row in rows:
        assert row in doc, row


def test_the_models_rows_are_its_data_files():
    """The step model fitted on each host count's even run only, every uneven run predicted (not fitted to them)."""
    doc = DOC.read_text().splitlines()
    rows, _ = predict_flows.fit_rows([str(p) for p in DATA], 4, predict_flows.lab_strategies())
    assert sum("| hier-balanced | hier rings |" in r for r in rows) == sum(r["profile"] != "even" for r in _recs())
    for row in rows[2:]:
        assert row in doc, row


def test_the_reading_quotes_the_data():
    ratio: dict[tuple[int, str], list[float]] = {}
    for r in _recs():
        c = uneven_tables.comm_s(r)
        ratio.setdefault((r["hosts"], r["profile"]), []).append(c["ddp-flows"] / c["hier-balanced"])
    steps = sorted(r["torch"]["hier-balanced"]["balancing"]["steps"] for r in _recs())
    text = _flat(DOC)
    for n in (4, 8):
        assert len(ratio[n, "random"]) >= 3
        quoted = (
            f"at {n} hosts x 2 local ranks it is {ratio[n, 'one-slow'][0]:.2f}x DDP with 4 flows under `one-slow`, "
            f"{statistics.median(ratio[n, 'random']):.2f}x in the median of {len(ratio[n, 'random'])} `random` seeds "
            f"({min(ratio[n, 'random']):.2f}x at worst) and {ratio[n, 'even'][0]:.2f}x under `even`"
        )
        assert quoted in text, quoted
    assert f"its balancer settled after {steps[0]} to {steps[-1]} steps" in text
    # the bars the reading says hold, on the data itself: a rerun that misses one fails here, not only in the prose
    assert "hold at both sizes" in text
    for n in (4, 8):
        assert ratio[n, "one-slow"][0] >= 2 and statistics.median(ratio[n, "random"]) >= 1.5
        assert ratio[n, "even"][0] >= 0.98
