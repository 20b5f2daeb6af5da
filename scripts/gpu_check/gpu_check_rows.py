"""The GPU check's result rows (gpu_check.py): one per check, each with the threshold that decides it and
the seconds it took; a Markdown table of them; the failures.

A row passes only by meeting a threshold that could have failed: `judged` is the only way to a 'pass'. Other
results are 'fail: why', 'skip: why' (not run here, and why) or 'n/a: why' (ran, but nothing to compare with).
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
import traceback


def row(
    name: str,
    result: str,
    number: float | None = None,
    unit: str = "",
    *,
    reference: str = "",
    threshold: str = "",
    seconds: float | None = None,
) -> dict:
    """One line of the table: result is 'pass', 'fail', 'skip' or 'n/a' (and why, after a colon)."""
    return {
        "name": name,
        "result": result,
        "number": number,
        "unit": unit,
        "threshold": threshold,
        "reference": reference,
        "seconds": seconds,
    }


def fmt(v: float | None) -> str:
    if v is None:
        return ""
    if v == 0 or abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def judged(
    name: str,
    value: float | None,
    unit: str,
    *,
    at_least: float | None = None,
    at_most: float | None = None,
    reference: str = "",
    why: str = "",
) -> dict:
    """A row decided by its threshold: pass when `value` is within [at_least, at_most], else fail saying by how much.

    why: a reason it fails whatever the number (e.g. 'moved 0 bytes'): the row cannot pass then."""
    if at_least is None and at_most is None:
        raise ValueError(f"{name}: a judged row needs a threshold")
    parts = []
    if at_least is not None:
        parts.append(f">= {fmt(at_least)}")
    if at_most is not None:
        parts.append(f"<= {fmt(at_most)}")
    threshold = " and ".join(parts) + (f" {unit}" if unit else "")
    if why:
        result = f"fail: {why}"
    elif value is None or not math.isfinite(value):
        result = "fail: no number"
    elif at_least is not None and value < at_least:
        result = f"fail: {fmt(value)} < {fmt(at_least)}"
    elif at_most is not None and value > at_most:
        result = f"fail: {fmt(value)} > {fmt(at_most)}"
    else:
        result = "pass"
    return row(name, result, value, unit, reference=reference, threshold=threshold)


def markdown_table(rows: list[dict]) -> str:
    """The rows as one Markdown table; '|' inside a cell is escaped."""

    def cell(s) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    lines = [
        "| check | result | number | unit | threshold | reference | s |",
        "|---|---|---:|---|---|---|---:|",
    ]
    lines += [
        f"| {cell(r['name'])} | {cell(r['result'])} | {fmt(r['number'])} | {cell(r['unit'])} | "
        f"{cell(r.get('threshold', ''))} | {cell(r['reference'])} | "
        f"{'' if r.get('seconds') is None else format(r['seconds'], '.0f')} |"
        for r in rows
    ]
    return "\n".join(lines)


def failed(rows: list[dict]) -> list[str]:
    return [r["name"] for r in rows if r["result"].startswith("fail")]


def guard(rows: list[dict], name: str):
    """Run a check body, timed: the first row it adds carries the seconds it took; an exception becomes a 'fail' row
    naming it (the other checks still run)."""

    @contextlib.contextmanager
    def cm():
        first, t = len(rows), time.perf_counter()
        try:
            yield
        except Exception as e:  # noqa: BLE001 - a check that raises is a failed check, reported in its row
            traceback.print_exc(file=sys.stderr)
            rows.append(row(name, f"fail: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"))
        finally:
            if len(rows) > first and rows[first].get("seconds") is None:
                rows[first]["seconds"] = time.perf_counter() - t

    return cm()
