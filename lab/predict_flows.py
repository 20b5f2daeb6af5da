#!/usr/bin/env python
"""Uneven flows: even striping against communicator- and hop-level balancing (recipes/comm/flowrates.py).

    python lab/predict_flows.py                     # 2..128 hosts, one-slow and random, the lab's 40 Mbit/s
    python lab/predict_flows.py --lab docs/data/lab-uneven-4.json   # the model beside the lab's measurements
    python lab/predict_flows.py --fit docs/data/lab-hop.json   # fitted on the even runs, every uneven run predicted

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
from lab import flow_profiles, uneven_tables  # noqa: E402
from lab.lab_methods import LAB_METHODS  # noqa: E402
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
            r = flow_profiles.ring_rates(rec["profile"], rec["seed"], n, flows, rec["flow_mbit"])
            model = flowrates.ring_mbit(r, rec["link_mbit"], "comm") / flowrates.ring_mbit(r, rec["link_mbit"], "even")
            comm = {m: t[m]["step_s"] - t["compute_s"] for m in ("ddp-flows", "multistream", "balanced") if m in t}
            vs_ddp, vs_ms = comm["ddp-flows"] / comm["balanced"], comm["multistream"] / comm["balanced"]
            lines.append(f"| {n} | {rec['profile']} | {rec['seed']} | {model:.2f}x | {vs_ddp:.2f}x | {vs_ms:.2f}x |")
    return lines


def measured_s(rec: dict, m: str) -> float:
    """Contender `m`'s communication seconds per step in a lab record: its step where its last rank ends it
    (uneven_tables.step_s), less the compute-only step."""
    return max(uneven_tables.step_s({m: uneven_tables.entry(rec, m)}, m) - rec["torch"]["compute_s"], 1e-6)


def _connections(rec: dict, m: str) -> list | None:
    """Contender `m`'s connections on every rank, where the record has them (the torch contenders' under `torch`,
    Horovod's in its own entry)."""
    if m == uneven_tables.APART:
        return (uneven_tables.entry(rec, m) or {}).get("connections")
    return rec["torch"].get("connections", {}).get(m)


def _model_s(rec: dict, m: str, strategy: str, flows: int) -> tuple[float, str] | None:
    """The model's data time for contender `m` in a lab record, and what it modelled: for DDP on gloo devices
    ("devices") and Horovod ("rings"), its collectives as the rings the record's connections show them on
    (flow_profiles.rings_of), all at once (Horovod's fused allreduce is one ring); else the ring rate of `strategy` on
    the profile's draws. Without connections in the record: DDP as even striping, Horovod not modelled (None)."""
    conns = _connections(rec, m)
    local = rec.get("local_ranks", 1)
    if strategy in ("devices", "rings") and conns:
        # several ranks per host: a host's connections together (those inside it, over loopback, are not pinned)
        conns = [[c for r in conns[h * local : (h + 1) * local] for c in r] for h in range(rec["hosts"])]
        return flow_profiles.concurrent_seconds(flow_profiles.rings_of(conns), rec["link_mbit"]), "rings"
    if strategy == "rings":
        return None
    if strategy == "hier" or (strategy == "hop" and local > 1):
        rings = flow_profiles.hop_rings(
            rec["profile"],
            rec["seed"],
            hosts=rec["hosts"],
            local=local,
            flows=flows,
            flow_mbit=rec["flow_mbit"],
            nbytes=rec["torch"]["bytes"],
            hierarchy=strategy == "hier",
        )
        return flow_profiles.concurrent_seconds(rings, rec["link_mbit"]), f"{strategy} rings"
    strategy = "even" if strategy == "devices" else strategy
    rates = flow_profiles.ring_rates(rec["profile"], rec["seed"], rec["hosts"], flows, rec["flow_mbit"])
    rate = flowrates.ring_mbit(rates, rec["link_mbit"], strategy)
    return flowrates.allreduce_seconds(rec["torch"]["bytes"], rec["hosts"], rate), strategy


def lab_strategies() -> dict[str, str]:
    """The lab methods the fit models, by what it models them as: DDP on gloo devices ("devices", `model_s`),
    Horovod by its recorded rings ("rings"), and every method with balance keys by its strategy
    (flow_profiles.strategy_of)."""
    out = {
        name: "devices" if m.flows else flow_profiles.strategy_of(m.overrides)
        for name, m in LAB_METHODS.items()
        if m.flows or m.overrides
    }
    return out | {uneven_tables.APART: "rings"}


def fit_rows(paths: list[str], flows: int, strategies: dict[str, str]) -> tuple[list[str], dict[str, float]]:
    """The model against the lab's uneven runs, fitted on the even ones only: per contender, host count and link,
    the fraction of the model's rate it reached under `even` (one figure); then each uneven run's communication time
    predicted, beside the measured one (`measured_s`). Returns the rows and the worst error per contender."""
    loaded = [(path, rec) for path in paths for rec in reader.read_json(path, what="lab JSON", error=SystemExit)]
    recs, where = [rec for _, rec in loaded], {id(rec): path for path, rec in loaded}

    def model_s(rec, m, strategy, flows):
        try:
            return _model_s(rec, m, strategy, flows) if uneven_tables.entry(rec, m) is not None else None
        except ValueError as e:
            run = f"{rec['hosts']} hosts, {rec['profile']} seed {rec['seed']}"
            raise SystemExit(f"predict_flows --fit: {where[id(rec)]} ({run}, {m}): {e}") from None

    eff = {}
    for rec in recs:
        if rec["profile"] != "even":
            continue
        for m, strategy in strategies.items():
            modelled = model_s(rec, m, strategy, flows)
            if modelled is not None:
                eff[(m, rec["hosts"], rec["link_mbit"])] = modelled[0] / measured_s(rec, m)
    lines = [
        "| hosts | link Mbit/s | profile | seed | method | model | fitted on even | model ms | measured ms | error |",
        "|---:|---:|---|---:|---|---|---:|---:|---:|---:|",
    ]
    worst: dict[str, float] = {}
    for rec in recs:
        if rec["profile"] == "even":
            continue
        for m, strategy in strategies.items():
            e = eff.get((m, rec["hosts"], rec["link_mbit"]))
            modelled = model_s(rec, m, strategy, flows) if e is not None else None
            if modelled is None:
                continue
            seconds, how = modelled
            model, got = seconds / e, measured_s(rec, m)
            err = model / got - 1
            worst[m] = max(worst.get(m, 0.0), abs(err))
            lines.append(
                f"| {rec['hosts']} | {rec['link_mbit']:g} | {rec['profile']} | {rec['seed']} | {m} | {how} | {e:.2f} | "
                f"{model * 1000:.0f} | {got * 1000:.0f} | {100 * err:+.0f}% |"
            )
    return lines, worst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64, 128])
    ap.add_argument("--profiles", nargs="+", default=["one-slow", "random"], choices=flow_profiles.PROFILES)
    ap.add_argument("--flows", type=int, default=4, help="connections per hop (K)")
    ap.add_argument("--link-mbit", type=float, default=40.0)
    ap.add_argument("--flow-ratio", type=float, default=3.0, help="per-flow cap = link / this")
    ap.add_argument("--seeds", type=int, default=200, help="draws of the profile (seeds 0..N-1)")
    ap.add_argument("--lab", nargs="*", default=[], help="bench_allreduce --profile JSON files: model beside them")
    ap.add_argument(
        "--fit",
        nargs="*",
        default=[],
        help="bench_allreduce --profile JSON files with an even run per host count: the model fitted on the even runs, "
        "against every uneven run",
    )
    args = ap.parse_args(argv)
    table = flow_profiles.prediction_table(
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
    if args.fit:
        rows, worst = fit_rows(args.fit, args.flows, lab_strategies())
        print()
        print("\n".join(rows))
        print()
        print("worst error: " + ", ".join(f"{m} {100 * w:.0f}%" for m, w in worst.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
