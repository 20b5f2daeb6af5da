#!/usr/bin/env python
"""The time model's published evidence (docs/scaling.md): the model on the two Alibaba runs it is calibrated on
(fitted) and on four multi-host V100 entries it was not fitted on (out of sample), each with the software it ran.

    python lab/timemodel_evidence.py            # the three tables docs/scaling.md shows, from the model now
    python lab/timemodel_evidence.py --write    # and the model's rows into docs/data/timemodel-evidence.json

The published numbers and the software each entry ran, as the model represents it (the rate table, the allreduce and
its settings, the per-flow cap, whether start-up is inside the clock), are data: docs/data/timemodel-evidence.json.
This script computes the model's rows from them (ResNet-50's gradient profile); the file keeps the last rows written,
which `scripts/predict.py` prints as the calibration (recipes/timemodel/calibration.py) and
tests/meta/test_docs_numbers.py holds, with the docs' tables, to what this script computes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from base import reader  # noqa: E402
from base.errors import ConfigError, RunDirError  # noqa: E402
from base.writer import to_json, write_output  # noqa: E402
from recipes import timemodel as tm  # noqa: E402
from recipes.comm import stepmodel as sm  # noqa: E402
from recipes.timemodel.calibration import EVIDENCE, calibration_lines  # noqa: E402

PROFILE = "resnet50"
STEP_TERMS = ("compute", "step floor", "intra-host", "exposed comm", "sync", "small collectives")


def load(path: str | Path = EVIDENCE) -> dict:
    return reader.read_json_object(path, what="time-model evidence", error=ConfigError)


def backend(sw: dict) -> tm.Backend:
    """The time model's Backend of a software record: its allreduce at its comm.* settings and wire format."""
    kwargs = {**sm.pattern(sw["backend"]).settings(sw["comm"]), "compression": sw["wire"]}
    extra = {k: sw[k] for k in ("small_ring_passes", "small_source") if k in sw}
    return tm.Backend(sw["label"], sw["backend"], kwargs, overlap=sw["overlap"], **extra)


def _rows(rows: list) -> list[tuple[int, int, int]]:
    return [tuple(r) for r in rows]


def calibration(doc: dict, prof: tm.GradProfile) -> list[dict]:
    """The model on each calibration run, per phase (training clock)."""
    sw = doc["calibration"]["software"]
    out = []
    for run in doc["calibration"]["runs"]:
        cluster = tm.Cluster(run["hosts"], run["gpus_per_host"], run["link_gbit"], run["flow_gbit"])
        phases = tm.entry_phases(_rows(run["rows"]), run["hosts"], run["gpus_per_host"])
        est = tm.estimate(phases, cluster, tm.PUBLISHED[sw["gpu"]], backend=backend(sw), prof=prof)
        out.append(
            {
                "name": run["name"],
                "source": run["source"],
                "phases": [
                    {"image_size": p.phase.image_size, "published_s": pub, "model_s": p.total("train")}
                    for p, pub in zip(est.phases, run["phase_s"], strict=True)
                ],
                "published_s": sum(run["phase_s"]),
                "model_s": est.total("train"),
                "range_s": list(est.range("train")),
            }
        )
    return out


def out_of_sample(doc: dict, prof: tm.GradProfile) -> list[dict]:
    """Each out-of-sample entry against the model, per image size, with the software it ran: nothing is fitted on
    these entries."""
    software = doc["out_of_sample"]["software"]
    out = []
    for e in doc["out_of_sample"]["entries"]:
        sw = software[e["software"]]
        cluster = tm.Cluster(e["hosts"], e["gpus_per_host"], e["link_gbit"], sw["flow_gbit"])
        est = tm.estimate(
            tm.entry_phases(_rows(e["rows"]), e["hosts"], e["gpus_per_host"]),
            cluster,
            tm.PUBLISHED[sw["gpu"]],
            backend=backend(sw),
            prof=prof,
            startup_in_clock=sw["startup_in_clock"],
        )
        by_size: dict[int, list[float]] = {}
        for p in est.phases:
            row = by_size.setdefault(p.phase.image_size, [0.0, 0.0, 0.0])
            for k, w in enumerate(("low", "mid", "high")):
                row[k] += p.total("train", w)
        sizes = [
            {
                "image_size": int(sz),
                "published_s": pub,
                **dict(zip(("low", "mid", "high"), by_size[int(sz)], strict=True)),
            }
            for sz, pub in e["size_s"].items()
        ]
        out.append(
            {
                "name": e["name"],
                "source": e["source"],
                "software": e["software"],
                "steps": [
                    {"image_size": p.phase.image_size, "batch": p.phase.batch, **{k: p.step_ms[k] for k in STEP_TERMS}}
                    for p in est.phases
                ],
                "sizes": sizes,
                "published_s": sum(x["published_s"] for x in sizes),
                "low": est.total("train", "low"),
                "mid": est.total("train"),
                "high": est.total("train", "high"),
            }
        )
    return out


def model_rows(doc: dict) -> dict:
    """What --write keeps under `model`: the calibration and out-of-sample rows (ResNet-50's gradient profile)."""
    prof = tm.profile_model(PROFILE)
    return {"profile": PROFILE, "calibration": calibration(doc, prof), "out_of_sample": out_of_sample(doc, prof)}


def out_of_sample_lines(rows: list[dict]) -> list[str]:
    lines = [
        "| published entry (not fitted, training clock) | px | published s | model s (low-high) | error |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        for i, x in enumerate(r["sizes"]):
            lines.append(
                f"| {r['name'] if i == 0 else ''} | {x['image_size']} | {x['published_s']:.0f} | {x['mid']:.0f} "
                f"({x['low']:.0f}-{x['high']:.0f}) | {x['mid'] / x['published_s'] - 1:+.0%} |"
            )
        lines.append(
            f"| | total | {r['published_s']:.0f} | {r['mid']:.0f} ({r['low']:.0f}-{r['high']:.0f}) | "
            f"{r['mid'] / r['published_s'] - 1:+.0%} |"
        )
    return lines


def out_of_sample_step_lines(rows: list[dict], doc: dict) -> list[str]:
    """The model's per-step terms (ms) of every out-of-sample segment, with the software each entry ran."""
    software = doc["out_of_sample"]["software"]
    lines = [
        "| entry | software (allreduce) | px | batch/GPU | "
        + " | ".join(f"{k} ms" for k in STEP_TERMS)
        + " | step ms |",
        "|---|---|---:|---:|" + "---:|" * (len(STEP_TERMS) + 1),
    ]
    for r in rows:
        for i, s in enumerate(r["steps"]):
            head = f"{r['source'].split('.json')[0]} | {software[r['software']]['label']}" if i == 0 else " | "
            cells = " | ".join(f"{s[k]:.1f}" for k in STEP_TERMS)
            lines.append(
                f"| {head} | {s['image_size']} | {s['batch']} | {cells} | {sum(s[k] for k in STEP_TERMS):.0f} |"
            )
    return lines


def tables(doc: dict, model: dict) -> list[str]:
    """docs/scaling.md's three tables of `model` (model_rows)."""
    return [
        "Calibration (fitted, not predicted): the model on the published Alibaba runs, GPU "
        f"{doc['calibration']['software']['gpu']}.",
        "",
        *calibration_lines(model["calibration"]),
        "",
        "Out of sample (not fitted): published entries on other V100 clusters, each with the software it ran.",
        "",
        *out_of_sample_lines(model["out_of_sample"]),
        "",
        "Out of sample, the model's step by term:",
        "",
        *out_of_sample_step_lines(model["out_of_sample"], doc),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--evidence", default=str(EVIDENCE), help="the published numbers and software (JSON)")
    ap.add_argument("--write", action="store_true", help="keep the model's rows in the --evidence file")
    args = ap.parse_args(argv)
    try:
        doc = load(args.evidence)
        model = model_rows(doc)
        if args.write:
            write_output(args.evidence, to_json({**doc, "model": model}), "--evidence")
    except (ConfigError, RunDirError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(tables(doc, model)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
