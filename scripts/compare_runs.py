#!/usr/bin/env python
"""Side-by-side report of training runs: time to accuracy, throughput, communication time, scaling efficiency.

    python scripts/compare_runs.py runs/dawnbench_158s-multistream runs/dawnbench_158s-horovod
    python scripts/compare_runs.py runs/dawnbench_158s-{multistream,ddp-flows,horovod}   # multi-flow DDP as a third
    python scripts/compare_runs.py RUN_1GPU RUN_8GPU RUN_128GPU --target top5=93 --plot scaling.png

Reads what train.py leaves in each run directory (summary.json with the per-epoch history, config.yaml; the
DAWNBench TSV when the history is missing), prints two Markdown tables and writes a PNG with top-5 against wall-clock
time and images/s per phase.

- time to target: training time (DAWNBench's clock: no validation, no checkpoints) until the first epoch at the
  target. The target is --target for every run, else each run's own run.target_top1/top5, else top-5 >= 93%.
- images/s: training images per second over the whole run, in total and per process (GPU).
- communication per step and its share of the step: the allreduce backend's `CommStats` in summary.json's `comm`
  (recipes/comm/stats.py: comm_seconds over steps, each backend timing its own communication window); "n/a" for
  a single process (nothing to reduce) or a run directory older than the record.
- scaling efficiency: images/s / (processes x images/s of the single-process run), when a single-process run is
  among the arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from recipes import registry  # noqa: E402
from recipes.comm.stats import CommStats  # noqa: E402
from recipes.run import files as run_files  # noqa: E402

DEFAULT_TARGET = {"top5": 93.0}


class CompareError(ValueError):
    """A run directory that cannot be read; the message names it."""


@dataclass
class Run:
    path: Path
    summary: dict
    config: dict
    history: list[dict]  # one row per epoch: epoch, train_seconds, top1, top5 (+ wall_seconds, images_per_s)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def world(self) -> int:
        return int(self.summary["world_size"])

    @property
    def comm(self) -> CommStats | None:
        return CommStats.from_dict(self.summary.get("comm"))


def _read_tsv(path: Path) -> list[dict]:
    rows = []
    lines = path.read_text().splitlines()
    for line in lines[1:]:
        epoch, hours, top1, top5 = line.split("\t")
        rows.append(
            {"epoch": int(epoch), "train_seconds": float(hours) * 3600, "top1": float(top1), "top5": float(top5)}
        )
    return rows


def load_run(path: str | Path) -> Run:
    path = Path(path)
    if not path.is_dir():
        raise CompareError(f"{path}: not a directory")
    summary_path = path / run_files.SUMMARY
    if not summary_path.is_file():
        raise CompareError(f"{path}: no summary.json (not a run directory, or the run has not finished)")
    try:
        summary = json.loads(summary_path.read_text())
    except json.JSONDecodeError as e:
        raise CompareError(f"{summary_path}: not valid JSON ({e})") from None
    config_path, tsv = path / run_files.CONFIG, path / run_files.TSV
    config = yaml.safe_load(config_path.read_text()) if config_path.is_file() else {}
    history = summary.get("history")
    if history is None and tsv.is_file():
        history = _read_tsv(tsv)
    return Run(path, summary, config or {}, history or [])


def parse_target(text: str | None) -> dict[str, float] | None:
    """'top5=93' or 'top1=75,top5=93' -> {'top5': 93.0}."""
    if text is None:
        return None
    out = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if key.strip() not in ("top1", "top5") or not sep:
            raise CompareError(f"--target '{text}': expected top1=N and/or top5=N")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            raise CompareError(f"--target '{text}': '{value}' is not a number") from None
    return out


def run_target(run: Run, target: dict[str, float] | None) -> dict[str, float]:
    if target:
        return target
    cfg_run = run.config.get("run", {})
    own = {k: cfg_run[f"target_{k}"] for k in ("top1", "top5") if cfg_run.get(f"target_{k}") is not None}
    return own or dict(DEFAULT_TARGET)


def time_to_target(run: Run, target: dict[str, float]) -> dict | None:
    """The first history row where every metric of `target` is reached (None: never)."""
    return next((r for r in run.history if all(r[k] >= v for k, v in target.items())), None)


def comm_per_step(run: Run) -> float | None:
    """Seconds of gradient communication per step (None: not measured, or nothing was reduced)."""
    stats = run.comm
    return stats.comm_seconds_per_step if stats is not None else None


def phase_throughput(run: Run) -> list[tuple[str, float | None]]:
    """(label, images/s) per phase of the config, from the per-epoch history."""
    phases = run.config.get("phases") or []
    out, first = [], 0
    by_epoch = {r["epoch"]: r for r in run.history}
    for i, p in enumerate(phases):
        images = seconds = 0.0
        for e in range(first + 1, first + p["epochs"] + 1):
            row = by_epoch.get(e)
            if row is None or row.get("images_per_s") is None:
                continue
            before = by_epoch.get(e - 1, {}).get("train_seconds", 0.0) if e > 1 else 0.0
            s = row["train_seconds"] - before
            seconds += s
            images += row["images_per_s"] * s
        out.append((f"phase {i} ({p['image_size']} px)", images / seconds if seconds > 0 else None))
        first += p["epochs"]
    return out


def _fmt_target(t: dict[str, float]) -> str:
    return " and ".join(f"{k} >= {v:g}%" for k, v in t.items())


def _cell(value: float | None, fmt: str, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{fmt}}{unit}"


def backend_label(run: Run) -> str:
    """The backend's label (recipes/registry.py), with the TCP flows per peer when a run asked for several
    (ddp: comm.gloo_devices or NCCL's multi-flow settings): the strongest plain-DDP baseline reads "ddp (16 flows)"
    beside "ddp", as in the time model's rows."""
    name = run.summary.get("comm_backend") or run.config.get("comm", {}).get("backend", "?")
    stats = run.comm
    flows = stats.settings.get("flows") if stats is not None else None
    record = registry.ALLREDUCE_BACKENDS.get(name)
    if record is None:  # a run of a backend this checkout does not know
        return name
    return record.row_label(flows if isinstance(flows, int) else 1)


def compare(runs: list[Run], target: dict[str, float] | None = None) -> list[dict]:
    """One row of numbers per run (None where not available)."""
    single = next((r for r in runs if r.world == 1), None)
    rows = []
    for run in runs:
        s = run.summary
        t = run_target(run, target)
        hit = time_to_target(run, t)
        ips = float(s["images_per_s"])
        step_s = s["train_seconds"] / s["steps"] if s.get("steps") else None
        comm = comm_per_step(run)
        rows.append(
            {
                "run": run.name,
                "backend": backend_label(run),
                "processes": run.world,
                "target": _fmt_target(t),
                "time_to_target_s": hit["train_seconds"] if hit else None,
                "epoch_at_target": hit["epoch"] if hit else None,
                "wall_s": float(s["wall_seconds"]),
                "train_s": float(s["train_seconds"]),
                "images_per_s": ips,
                "images_per_s_per_process": ips / run.world,
                "comm_ms_per_step": comm * 1000 if comm is not None else None,
                "comm_share": comm / step_s if comm is not None and step_s else None,
                "scaling_efficiency": ips / (run.world * float(single.summary["images_per_s"])) if single else None,
                "final_top1": s["final_top1"],
                "final_top5": s["final_top5"],
            }
        )
    return rows


def markdown(runs: list[Run], rows: list[dict]) -> str:
    head = (
        "| run | backend | processes | target | time to target | total time | images/s | images/s per process "
        "| comm per step | comm share | scaling efficiency | final top-1 / top-5 |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        ttt = "not reached"
        if r["time_to_target_s"] is not None:
            ttt = f"{r['time_to_target_s']:.1f} s (epoch {r['epoch_at_target']})"
        lines.append(
            f"| {r['run']} | {r['backend']} | {r['processes']} | {r['target']} | {ttt} | {r['wall_s']:.1f} s "
            f"| {r['images_per_s']:.1f} | {r['images_per_s_per_process']:.1f} "
            f"| {_cell(r['comm_ms_per_step'], '.1f', ' ms')} "
            f"| {_cell(None if r['comm_share'] is None else 100 * r['comm_share'], '.1f', '%')} "
            f"| {_cell(None if r['scaling_efficiency'] is None else 100 * r['scaling_efficiency'], '.1f', '%')} "
            f"| {_cell(r['final_top1'], '.2f', '%')} / {_cell(r['final_top5'], '.2f', '%')} |"
        )
    phases = [phase_throughput(run) for run in runs]
    width = max(len(p) for p in phases)
    if width:
        labels = next(p for p in phases if len(p) == width)
        lines += [
            "",
            "| run (images/s per phase) | " + " | ".join(lbl for lbl, _ in labels) + " |",
            "|---|" + "---:|" * width,
        ]
        for run, p in zip(runs, phases, strict=True):
            cells = [_cell(v, ".1f") for _, v in p] + ["-"] * (width - len(p))
            lines.append(f"| {run.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(runs: list[Run], rows: list[dict], path: Path) -> None:
    """Top-5 against wall-clock time (left) and images/s per phase (right), one colour per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    wall = all("wall_seconds" in r for run in runs for r in run.history)
    for run in runs:
        xs = [r["wall_seconds"] if wall else r["train_seconds"] for r in run.history]
        ax1.plot(xs, [r["top5"] for r in run.history], marker="o", ms=3, label=f"{run.name} ({run.world} proc.)")
    for t in {r["target"] for r in rows}:
        if "top5 >= " in t:
            ax1.axhline(float(t.split("top5 >= ")[1].rstrip("%")), ls="--", c="gray", lw=0.8)
    ax1.set_xlabel("wall-clock time (s)" if wall else "training time (s)")
    ax1.set_ylabel("top-5 accuracy (%)")
    ax1.set_title("top-5 against time")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    per_phase = [phase_throughput(run) for run in runs]
    width = 0.8 / max(1, len(runs))
    for k, (run, p) in enumerate(zip(runs, per_phase, strict=True)):
        xs = [i + k * width for i in range(len(p))]
        ax2.bar(xs, [v or 0.0 for _, v in p], width=width, label=run.name)
    longest = max(per_phase, key=len) if per_phase else []
    ax2.set_xticks([i + 0.4 - width / 2 for i in range(len(longest))], [lbl for lbl, _ in longest], fontsize=8)
    ax2.set_ylabel("images/s (all processes)")
    ax2.set_title("throughput per phase")
    ax2.grid(alpha=0.3, axis="y")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="See the module docstring.")
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (train.py --run-dir)")
    ap.add_argument("--target", help="top1=N and/or top5=N for every run (default: each run's config, else top5=93)")
    ap.add_argument("--plot", default="compare.png", help="PNG to write (default: %(default)s)")
    ap.add_argument("--markdown", help="also write the tables to this file")
    args = ap.parse_args(argv)
    try:
        target = parse_target(args.target)
        runs = [load_run(p) for p in args.runs]
    except CompareError as e:
        print(f"compare_runs: error: {e}", file=sys.stderr)
        return 2
    rows = compare(runs, target)
    text = markdown(runs, rows)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    plot(runs, rows, Path(args.plot))
    print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
