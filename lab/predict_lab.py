#!/usr/bin/env python
"""The step-time model (recipes/comm/stepmodel.py) against the network lab: fit it on some host counts, check it on all.

    python lab/predict_lab.py docs/data/lab-multiflow-2-4.json docs/data/lab-multiflow-8-16.json --fit-hosts 2 4

The lab file is what `python -m lab.bench_allreduce --json` writes: per host count, the compute-only time
and each contender's measured step (the methods of lab/lab_methods.py: under `torch` those the
lab's own ranks run, at the top level one with its own launcher, Horovod). `load_lab`
merges several such files by host count; `lab_predict` is the model's step time for one contender of one record (the
gradient list of bench_allreduce at its `fraction`, compute not overlapped, `LabFit`'s goodput and per-message
latency) and `measured` what the lab measured; `fit_lab` fits goodput and latency (then Horovod's negotiation cost
per rank) by least squares of the log error on some host counts, and `validate` reports every record against that
fit. `LAB_FIT` is the fit of docs/scaling.md, which tests check an unfitted lab run against.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

# `python lab/predict_lab.py` puts lab/ on sys.path, not the repository: the imports below need the root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from base import reader  # noqa: E402
from base.errors import ConfigError  # noqa: E402
from lab import lab_methods  # noqa: E402
from recipes.argtypes import OneLineParser, bounded_int  # noqa: E402
from recipes.comm import stepmodel as sm  # noqa: E402
from recipes.comm.plan import TensorSpec  # noqa: E402

# The methods checked against the model: those the lab measures by default.
LAB_METHODS = tuple(name for name, m in lab_methods.LAB_METHODS.items() if m.default)


@dataclass(frozen=True)
class LabFit:
    efficiency: float
    latency_s: float
    negotiation_s_per_rank: float


LAB_FIT = LabFit(0.93, 9e-6, 0.0)  # the fit on the 2- and 4-host rows of docs/data/lab-multiflow-2-4.json


def lab_specs(fraction: float) -> list[TensorSpec]:
    """ResNet-50's gradient list as lab/bench_allreduce.py builds it (flat tensors at `fraction`)."""
    from lab import bench_allreduce

    named = bench_allreduce.gradient_shapes(fraction)[::-1]  # gradient-ready order
    return [TensorSpec(n, s, "float32") for n, s in named]


def entry(rec: dict, method: str) -> dict | None:
    """The measurement of `method` in one lab record (None when it was not measured there)."""
    r = rec.get(method) if lab_methods.LAB_METHODS[method].own_launcher else rec["torch"].get(method)
    return r if isinstance(r, dict) else None


def lab_predict(rec: dict, method: str, fit: LabFit, specs: list[TensorSpec] | None = None) -> float | None:
    """Predicted step time of `method` in one lab record (None when it was not measured there)."""
    r = entry(rec, method)
    if r is None:
        return None
    torch_res = rec["torch"]
    f = torch_res.get("fraction", 1.0)
    specs = specs or lab_specs(f)
    net = sm.Network(
        rec["hosts"], 1, rec["link_mbit"] / 1000, rec["flow_mbit"] / 1000, fit.latency_s, efficiency=fit.efficiency
    )
    comp = sm.no_overlap(specs, torch_res["compute_s"])
    lab = lab_methods.LAB_METHODS[method]
    model = sm.pattern(lab.model)
    # The settings it ran with, read back from its label (the tuner's winner for a tuned one), and Horovod's fitted
    # negotiation cost; what the label does not say is the config's default at the lab's fraction.
    keys = {"bucket_cap_mb": 25 * f, "bucket_mb": 8 * f, "fusion_mb": 128 * f}
    keys |= model.parse(r["settings"]) | {"negotiation_s_per_rank": fit.negotiation_s_per_rank}
    flows = int(r["settings"].rsplit(",", 1)[1].split()[0]) if lab.flows else None  # 'bucket_cap_mb 1.25, 4 flows'
    return sm.predict_step(lab.model, specs, comp, net, flows=flows, **model.settings(keys)).step_s


def measured(rec: dict, method: str) -> float | None:
    r = entry(rec, method)
    return r["step_s"] if r is not None else None


def fit_lab(records: list[dict]) -> LabFit:
    """Least squares of log(predicted / measured) over every method of `records`: goodput and latency on a grid,
    then Horovod's negotiation cost per rank."""
    specs = {}

    def err(fit: LabFit, methods) -> float:
        e = []
        for rec in records:
            f = rec["torch"].get("fraction", 1.0)
            if f not in specs:
                specs[f] = lab_specs(f)
            for m in methods:
                p, y = lab_predict(rec, m, fit, specs[f]), measured(rec, m)
                if p is not None and y is not None:
                    e.append(math.log(p / y) ** 2)
        return sum(e) / max(len(e), 1)

    # Goodput and latency from the methods without a negotiation cost, then Horovod's cost per rank on top.
    negotiating = [m for m in LAB_METHODS if sm.pattern(lab_methods.LAB_METHODS[m].model).negotiates]
    others = [m for m in LAB_METHODS if m not in negotiating]
    eff, loglat = _refine(lambda e, g: err(LabFit(e, 10**g, 0.0), others), (0.7, 1.3), (-6.0, -2.0))
    lat = 10**loglat
    neg = 10 ** _refine(lambda _, g: err(LabFit(eff, lat, 10**g), negotiating), (eff, eff), (-7.0, -2.0))[1]
    return LabFit(eff, lat, neg)


def load_lab(paths: list[str]) -> list[dict]:
    """Lab records of one or more `bench_allreduce.py --json` files, merged by host count (the first file's
    compute-only time is kept; Horovod and torch contenders may come from different runs)."""
    merged: dict[int, dict] = {}
    for path in paths:
        for rec in reader.read_json(path, what="lab file", error=ConfigError):
            have = merged.get(rec["hosts"])
            if have is None:
                merged[rec["hosts"]] = rec
                continue
            for k, v in rec["torch"].items():
                if isinstance(v, dict):
                    have["torch"].setdefault(k, v)
            for name, m in lab_methods.LAB_METHODS.items():  # Horovod's, from its own launcher's run
                if m.own_launcher and isinstance(rec.get(name), dict):
                    have[name] = rec[name]
    return [merged[h] for h in sorted(merged)]


def _refine(f, xs: tuple[float, float], ys: tuple[float, float], points: int = 7, levels: int = 4):
    """Minimise f(x, y) on a grid over the box, then on finer grids around the best point."""
    best = None
    for _ in range(levels):
        gx = [xs[0] + (xs[1] - xs[0]) * i / (points - 1) for i in range(points)] if xs[1] > xs[0] else [xs[0]]
        gy = [ys[0] + (ys[1] - ys[0]) * j / (points - 1) for j in range(points)]
        best = min(((f(x, y), x, y) for x in gx for y in gy), key=lambda t: t[0])
        dx, dy = (xs[1] - xs[0]) / (points - 1), (ys[1] - ys[0]) / (points - 1)
        xs, ys = (best[1] - dx, best[1] + dx) if dx else xs, (best[2] - dy, best[2] + dy)
    return best[1], best[2]


def validate(paths: list[str], fit_hosts: list[int]) -> list[str]:
    records = load_lab(paths)
    fit = fit_lab([r for r in records if r["hosts"] in fit_hosts])
    lines = [
        f"fitted on {', '.join(map(str, fit_hosts))} hosts: goodput {fit.efficiency:.0%} of the caps, "
        f"{fit.latency_s * 1e6:.0f} us per ring step, Horovod negotiation {fit.negotiation_s_per_rank * 1e6:.0f} "
        "us per rank per fused response",
        "",
        "| hosts | method | settings | measured ms | predicted ms | error | fitted on |",
        "|---:|---|---|---:|---:|---:|---|",
    ]
    for rec in records:
        for m in LAB_METHODS:
            p, y = lab_predict(rec, m, fit), measured(rec, m)
            if p is None or y is None:
                continue
            r = entry(rec, m)
            lines.append(
                f"| {rec['hosts']} | {m} | {r['settings']} | {y * 1000:.0f} | {p * 1000:.0f} | "
                f"{100 * (p / y - 1):+.0f}% | {'yes' if rec['hosts'] in fit_hosts else 'no'} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="predict_lab.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("lab", nargs="+", help="lab/bench_allreduce.py --json files (merged by host count)")
    ap.add_argument("--fit-hosts", type=bounded_int(2, 4096), nargs="+", default=[2, 4], help="host counts to fit on")
    args = ap.parse_args(argv)
    try:  # a file that is missing or not a lab's JSON: one line naming it
        print("\n".join(validate(args.lab, args.fit_hosts)))
        return 0
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
