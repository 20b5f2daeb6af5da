"""The calibration's residuals that scripts/predict.py prints on every run: the model on the two published Alibaba
runs it is fitted on (ResNet-50), as lab/timemodel_evidence.py computed them into
docs/data/timemodel-evidence.json. Read when asked, never at import; the evidence itself is research (that script and
docs/scaling.md), not part of a prediction.
"""

from __future__ import annotations

from pathlib import Path

from base import reader
from recipes.timemodel.rates import DATA

EVIDENCE = DATA / "timemodel-evidence.json"
HEADER = (
    "| published run (fitted, training clock) | phase | px | published s | model s | residual |",
    "|---|---:|---:|---:|---:|---:|",
)


def calibration_rows(path: str | Path = EVIDENCE) -> list[dict]:
    """Per published run: its name and, per phase, the image size, the published and the model's seconds."""
    return reader.read_json_object(path, what="time-model evidence")["model"]["calibration"]


def calibration_lines(rows: list[dict] | None = None) -> list[str]:
    """The fit's residuals per phase (training clock), as a Markdown table (`rows`: calibration_rows())."""
    lines = list(HEADER)
    for run in calibration_rows() if rows is None else rows:
        for i, p in enumerate(run["phases"]):
            pub, m = p["published_s"], p["model_s"]
            lines.append(
                f"| {run['name'] if i == 0 else ''} | {i + 1} | {p['image_size']} | {pub:.1f} | {m:.1f} | "
                f"{m / pub - 1:+.1%} |"
            )
        tot, m = run["published_s"], run["model_s"]
        lines.append(f"| | total | | {tot:.1f} | {m:.1f} | {m / tot - 1:+.1%} |")
    return lines
