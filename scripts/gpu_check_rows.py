"""The GPU check's result rows (scripts/gpu_check.py): one per check, a Markdown table of them, failures."""

from __future__ import annotations

import contextlib
import sys
import traceback


def row(name: str, result: str, number: float | None = None, unit: str = "", reference: str = "") -> dict:
    """One line of the table: result is 'pass', 'fail', 'skip' or 'n/a' (and why, after a colon)."""
    return {"name": name, "result": result, "number": number, "unit": unit, "reference": reference}


def _fmt(v: float | None) -> str:
    if v is None:
        return ""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def markdown_table(rows: list[dict]) -> str:
    """The rows as one Markdown table; '|' inside a cell is escaped."""

    def cell(s) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    lines = ["| check | result | number | unit | reference |", "|---|---|---:|---|---|"]
    lines += [
        f"| {cell(r['name'])} | {cell(r['result'])} | {_fmt(r['number'])} | {cell(r['unit'])} | "
        f"{cell(r['reference'])} |"
        for r in rows
    ]
    return "\n".join(lines)


def failed(rows: list[dict]) -> list[str]:
    return [r["name"] for r in rows if r["result"].startswith("fail")]


def guard(rows: list[dict], name: str):
    """Run a check body; an exception becomes a 'fail' row naming it (the other checks still run)."""

    @contextlib.contextmanager
    def cm():
        try:
            yield
        except Exception as e:  # noqa: BLE001 - a check that raises is a failed check, reported in its row
            traceback.print_exc(file=sys.stderr)
            rows.append(row(name, f"fail: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"))

    return cm()
