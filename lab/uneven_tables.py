#!/usr/bin/env python
"""docs/allreduce.md's uneven-flow tables from bench_allreduce --profile JSON (docs/data/lab-uneven-*.json).

    python -m lab.uneven_tables docs/data/lab-uneven-4.json [more.json ...]

Prints one row per run and contender (communication time = step - compute-only step, as bench_allreduce prints it),
then per host count and profile the balanced backend against DDP on as many flows: the median and the worst over
the seeds. For runs of hosts with several local ranks (`--local-ranks`, docs/data/lab-hier-*.json) it prints the
hierarchical ring's tables instead: against DDP with as many flows and the flat hop-balanced ring, with where each
balancer settled. tests/meta/test_docs_numbers.py holds the docs to this output.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

# `python lab/uneven_tables.py` puts lab/ on sys.path, not the repository: the imports below need the root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from base import reader  # noqa: E402

CONTENDERS = ("ddp-flows", "multistream", "balanced", "hop-balanced", "hier-balanced")
APART = "horovod"  # run under its own launcher: a top-level entry of the record (a string where it did not run)


def load(paths: list[str]) -> list[dict]:
    return [rec for p in paths for rec in reader.read_json(p, what="lab JSON", error=SystemExit)]


def entries(rec: dict) -> dict[str, dict]:
    """Every contender that ran in a record, by name: the torch contenders', then Horovod's."""
    t = rec["torch"]
    out = {m: t[m] for m in CONTENDERS if m in t}
    if isinstance(rec.get(APART), dict):
        out[APART] = rec[APART]
    return out


def entry(rec: dict, m: str) -> dict | None:
    """Contender `m`'s entry in a record (None where it did not run): Horovod's own, else under `torch`."""
    got = rec.get(APART) if m == APART else rec["torch"].get(m)
    return got if isinstance(got, dict) else None


def step_s(t: dict, m: str) -> float:
    """Contender `m`'s step in `t` (a record's `torch` part, or `entries`): the median over the timed steps of the
    step's end on its last rank (`rank_times`). A ring's ranks end a step at different times: after the barrier that
    opens each round, a rank that is not the ring's last ends the first step early, which rank 0's median alone
    (`step_s`, the only figure in records before 2cd93ff) counts."""
    ranks = t[m].get("rank_times")
    return statistics.median(max(s) for s in zip(*ranks, strict=True)) if ranks else t[m]["step_s"]


def comm_s(rec: dict) -> dict[str, float]:
    e = entries(rec)
    return {m: max(step_s(e, m) - rec["torch"]["compute_s"], 1e-6) for m in e}


def run_rows(recs: list[dict]) -> list[str]:
    lines = [
        "| hosts | profile | seed | method | settings | step ms | comm ms | % of link cap | vs ddp-flows | CPU load |",
        "|---:|---|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for rec in recs:
        t, e, n, comm = rec["torch"], entries(rec), rec["hosts"], comm_s(rec)
        for m, c in comm.items():
            r = e[m]
            bus = 2 * (n - 1) / n * t["bytes"] * 8 / c / 1e6
            step = step_s(e, m)
            load = sum(r["cpu_s"]) / (rec["cpus"] * step)
            lines.append(
                f"| {n} | {rec['profile']} | {rec['seed']} | {m} | {r['settings']} | {step * 1000:.0f} | "
                f"{c * 1000:.0f} | {100 * bus / rec['link_mbit']:.0f}% | {comm['ddp-flows'] / c:.2f}x | "
                f"{100 * load:.0f}% |"
            )
    return lines


def summary_rows(recs: list[dict]) -> list[str]:
    lines = [
        "| hosts | profile | runs | balanced vs ddp-flows (median, worst) | multistream vs ddp-flows (median) "
        "| balanced, % of link cap (median) |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    groups: dict[tuple[int, str], list[dict]] = {}
    for rec in recs:
        groups.setdefault((rec["hosts"], rec["profile"]), []).append(rec)
    for (n, profile), rs in sorted(groups.items()):
        comms = [comm_s(r) for r in rs]
        bal = [c["ddp-flows"] / c["balanced"] for c in comms]
        ms = [c["ddp-flows"] / c["multistream"] for c in comms]
        pct = [
            200 * (n - 1) / n * r["torch"]["bytes"] * 8 / c["balanced"] / 1e6 / r["link_mbit"]
            for r, c in zip(rs, comms, strict=True)
        ]
        lines.append(
            f"| {n} | {profile} | {len(rs)} | {statistics.median(bal):.2f}x ({min(bal):.2f}x) | "
            f"{statistics.median(ms):.2f}x | {statistics.median(pct):.0f}% |"
        )
    return lines


def link_pct(rec: dict, comm: float) -> float:
    """The allreduce's ring rate as a % of the link cap (2(H-1)/H of the bytes cross each host's link)."""
    n = rec["hosts"]
    return 200 * (n - 1) / n * rec["torch"]["bytes"] * 8 / comm / 1e6 / rec["link_mbit"]


def balancing_rows(recs: list[dict], methods=("balanced", "hop-balanced")) -> list[str]:
    """Per host count, link and profile: each balancing method against DDP on as many flows (median and worst over
    the seeds) and its share of the link cap (median)."""
    head = " | ".join(f"{m} vs ddp-flows (median, worst) | {m}, % of link cap (median)" for m in methods)
    lines = [f"| hosts | link Mbit/s | profile | runs | {head} |", "|---:|---:|---|---:|" + "---:|---:|" * len(methods)]
    groups: dict[tuple[int, float, str], list[dict]] = {}
    for rec in recs:
        groups.setdefault((rec["hosts"], rec["link_mbit"], rec["profile"]), []).append(rec)
    for (n, link, profile), rs in sorted(groups.items()):
        cells = []
        for m in methods:
            got = [(r, comm_s(r)) for r in rs if m in entries(r)]
            if not got:
                cells.append("| ")
                continue
            vs = [c["ddp-flows"] / c[m] for _, c in got]
            pct = [link_pct(r, c[m]) for r, c in got]
            cells.append(
                f"{statistics.median(vs):.2f}x ({min(vs):.2f}x) | {statistics.median(pct):.0f}%"
                + ("" if len(got) == len(rs) else f" ({len(got)} runs)")
            )
        lines.append(f"| {n} | {link:g} | {profile} | {len(rs)} | " + " | ".join(cells) + " |")
    return lines


def settling(rec: dict, m: str) -> str:
    """Where contender `m`'s balancer settled: 'steps / seconds' from its first step (a '+' where it had not settled
    when the bench stopped waiting and timed it)."""
    b = rec["torch"][m]["balancing"]
    return f"{b['steps']}{'' if b['settled'] else '+'} / {b['seconds']:.0f}"


def hier_rows(recs: list[dict]) -> list[str]:
    """Per run of hosts with several local ranks (bench_allreduce --local-ranks): the hierarchical ring against DDP
    with as many flows and against the flat hop-balanced ring, each balancer's settling beside its ratio."""
    lines = [
        "| hosts x ranks | profile | seed | ddp-flows comm ms | hop-balanced vs ddp-flows | its settling, steps / s "
        "| hier-balanced vs ddp-flows | its settling, steps / s | hier-balanced vs hop-balanced "
        "| hier-balanced, % of link cap |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rec in recs:
        c = comm_s(rec)
        lines.append(
            f"| {rec['hosts']} x {rec['local_ranks']} | {rec['profile']} | {rec['seed']} | {c['ddp-flows'] * 1000:.0f} "
            f"| {c['ddp-flows'] / c['hop-balanced']:.2f}x | {settling(rec, 'hop-balanced')} "
            f"| {c['ddp-flows'] / c['hier-balanced']:.2f}x | {settling(rec, 'hier-balanced')} "
            f"| {c['hop-balanced'] / c['hier-balanced']:.2f}x | {link_pct(rec, c['hier-balanced']):.0f}% |"
        )
    return lines


def _span(xs: list) -> str:
    """A sorted list's range as a table cell: 'lo-hi', or the one value."""
    return f"{xs[0]}-{xs[-1]}" if xs[0] != xs[-1] else f"{xs[0]}"


def hier_summary(recs: list[dict]) -> list[str]:
    """Per host count and profile: the hierarchical ring against DDP with as many flows (median and worst over the
    seeds) and against the flat hop-balanced ring (median), and the steps its balancer took to settle (range)."""
    lines = [
        "| hosts x ranks | profile | runs | hier-balanced vs ddp-flows (median, worst) "
        "| hier-balanced vs hop-balanced (median) | hier-balanced settled after, steps (seconds) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    groups: dict[tuple[int, int, str], list[dict]] = {}
    for rec in recs:
        groups.setdefault((rec["hosts"], rec["local_ranks"], rec["profile"]), []).append(rec)
    for (n, local, profile), rs in sorted(groups.items()):
        comms = [comm_s(r) for r in rs]
        vs = [c["ddp-flows"] / c["hier-balanced"] for c in comms]
        flat = [c["hop-balanced"] / c["hier-balanced"] for c in comms]
        b = [r["torch"]["hier-balanced"]["balancing"] for r in rs]
        steps = sorted(x["steps"] for x in b)
        secs = sorted(round(x["seconds"]) for x in b)
        span = f"{_span(steps)} ({_span(secs)})"
        lines.append(
            f"| {n} x {local} | {profile} | {len(rs)} | {statistics.median(vs):.2f}x ({min(vs):.2f}x) | "
            f"{statistics.median(flat):.2f}x | {span} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="bench_allreduce --profile JSON files")
    recs = load(ap.parse_args(argv).files)
    if all(r.get("local_ranks", 1) > 1 for r in recs):  # hosts of several local ranks: the hierarchy's tables
        print("\n".join(hier_summary(recs)))
        print()
        print("\n".join(hier_rows(recs)))
        return 0
    with_static = all("multistream" in r["torch"] for r in recs)
    present = tuple(m for m in ("balanced", "hop-balanced", APART) if any(entry(r, m) for r in recs))
    print("\n".join(summary_rows(recs) if with_static else balancing_rows(recs, present)))
    print()
    print("\n".join(run_rows(recs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
