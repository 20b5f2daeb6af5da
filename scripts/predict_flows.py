#!/usr/bin/env python
"""Uneven flows: even striping against communicator- and hop-level balancing (recipes/comm/flowrates.py).

    python scripts/predict_flows.py                     # 2..128 hosts, one-slow and random, the lab's 40 Mbit/s
    python scripts/predict_flows.py --lab docs/data/lab-uneven-4.json   # the model beside the lab's measurements

Every hop has K connections whose ceilings come from the named profile (the same draws as the network lab's leaves
for a seed); the table gives the ring's rate under even striping as a fraction of the link, and the speed-up of
communicator-level balancing (comm.balance) and hop-level balancing over it, median and worst over the seeds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from base import reader  # noqa: E402
from recipes.comm import flowrates  # noqa: E402


def lab_rows(paths: list[str], flows: int) -> list[str]:
    """Per lab run: the model's even-striping rate and communicator-level speed-up for its profile and seed, beside
    what was measured (balanced over ddp-flows and over static multistream)."""
    lines = [
        "| hosts | profile | seed | model: comm-level vs even | measured: balanced vs ddp-flows "
        "| measured: balanced vs multistream |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for path in paths:
        for rec in reader.read_json(path, what="lab JSON", error=SystemExit):
            t, n = rec["torch"], rec["hosts"]
            r = flowrates.ring_rates(rec["profile"], rec["seed"], n, flows, rec["flow_mbit"])
            model = flowrates.ring_mbit(r, rec["link_mbit"], "comm") / flowrates.ring_mbit(r, rec["link_mbit"], "even")
            comm = {m: t[m]["step_s"] - t["compute_s"] for m in ("ddp-flows", "multistream", "balanced") if m in t}
            vs_ddp, vs_ms = comm["ddp-flows"] / comm["balanced"], comm["multistream"] / comm["balanced"]
            lines.append(f"| {n} | {rec['profile']} | {rec['seed']} | {model:.2f}x | {vs_ddp:.2f}x | {vs_ms:.2f}x |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64, 128])
    ap.add_argument("--profiles", nargs="+", default=["one-slow", "random"], choices=flowrates.PROFILES)
    ap.add_argument("--flows", type=int, default=4, help="connections per hop (K)")
    ap.add_argument("--link-mbit", type=float, default=40.0)
    ap.add_argument("--flow-ratio", type=float, default=3.0, help="per-flow cap = link / this")
    ap.add_argument("--seeds", type=int, default=200, help="draws of the profile (seeds 0..N-1)")
    ap.add_argument("--lab", nargs="*", default=[], help="bench_allreduce --profile JSON files: model beside them")
    args = ap.parse_args(argv)
    table = flowrates.prediction_table(
        tuple(args.hosts),
        tuple(args.profiles),
        flows=args.flows,
        link_mbit=args.link_mbit,
        flow_mbit=args.link_mbit / args.flow_ratio,
        seeds=range(args.seeds),
    )
    print("\n".join(table))
    if args.lab:
        print()
        print("\n".join(lab_rows(args.lab, args.flows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
