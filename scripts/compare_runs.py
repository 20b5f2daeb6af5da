#!/usr/bin/env python
"""Side-by-side report of training runs: time to accuracy, throughput, communication time, scaling efficiency.

    python scripts/compare_runs.py runs/dawnbench_158s-multistream runs/dawnbench_158s-horovod
    python scripts/compare_runs.py runs/dawnbench_158s-{multistream,ddp-flows,horovod}   # multi-flow DDP as a third
    python scripts/compare_runs.py RUN_1GPU RUN_8GPU RUN_128GPU --target top5=93 --plot scaling.png

Reads what train.py leaves in each run directory (summary.json with the per-epoch history, config.yaml; the
DAWNBench TSV when the history is missing), prints two Markdown tables and writes a PNG with the target's accuracy
against wall-clock time and images/s per phase.

Only what is comparable is compared. The report starts with what sets the runs apart: every config value that
differs (beyond the allreduce backend and its comm.* settings), the data root, the validation images counted, the
network (the launcher's link probe, comm.network) and the autotune setting. Runs whose recipes differ beyond the
backend (another schedule, model, optimizer, ...: any key that changes what is trained) are refused with one line;
--force compares them anyway, the differences printed above the table, the table and the plot saying that the
comparison was forced, and scaling efficiency n/a. A run without summary.json (interrupted) is compared up to its
last finished epoch (dawnbench.tsv), marked "interrupted" in the table and the plot; a run stopped before the end of
its plan (summary.json's planned_epochs; --stop-after-epochs) is marked "partial: N of M epochs".

- time to target: training time (DAWNBench's clock: no validation, no checkpoints) until the first epoch at the
  target. The target is --target for every run, else each run's own run.target_top1/top5, else top-5 >= 93%.
- images/s: training images per second over the whole run, in total and per process (GPU).
- communication per step and its share of the step: the allreduce backend's `CommStats` in summary.json's `comm`
  (recipes/comm/stats.py: comm_seconds over steps); "n/a" for a single process (nothing to reduce) or a run
  directory older than the record. Each backend times its own window (docs/allreduce.md), so the table's "comm
  window" column and the plot's legend name it: multistream's window includes backward, DDP's starts at the first
  bucket, and a larger share there does not mean slower communication.
- scaling efficiency: images/s / (processes x images/s of the single-process run), when a single-process run is
  among the arguments, both ran their whole plan and the recipes are alike (not under --force).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from base import registry  # noqa: E402
from base.errors import RunDirError  # noqa: E402
from base.writer import check_target, write_output  # noqa: E402
from recipes.config import to_yaml  # noqa: E402
from recipes.config.schema import Config, not_training_keys  # noqa: E402
from recipes.rundir.writer import figure_bytes  # noqa: E402
from scripts.compare_runs_read import CompareError, Run, load_run  # noqa: E402

DEFAULT_TARGET = {"top5": 93.0}
# Keys that name a run rather than its recipe: never listed as a difference.
_IDENTITY = ("run.name", "run.out_dir")


def flatten(config: dict, prefix: str = "") -> dict[str, object]:
    """{'optim.lr': 2.0, 'phases[0].epochs': 9, ...} of a config.yaml."""
    out: dict[str, object] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            out[f"{name}.count"] = len(value)
            for i, v in enumerate(value):
                out.update(flatten(v, f"{name}[{i}]."))
        else:
            out[name] = value
    return out


def _trains(key: str, inert: tuple[str, ...]) -> bool:
    plain = key.split("[")[0] if key.startswith("phases[") else key
    return not any(plain == k or (k.endswith(".") and plain.startswith(k)) for k in inert)


def differences(runs: list[Run]) -> tuple[list[tuple], list[tuple]]:
    """([(key, values)] that change what is trained, [(key, values)] that do not), comm.* and run names left out."""
    # A key missing from a run's config.yaml (a run older than the key) holds the schema's default.
    defaults = flatten(yaml.safe_load(to_yaml(Config())))
    flat = [{**{k: v for k, v in defaults.items() if not k.startswith("phases")}, **flatten(r.config)} for r in runs]
    inert = not_training_keys()
    recipe, other = [], []
    for key in sorted(set().union(*flat)):
        if key.startswith("comm.") or key in _IDENTITY:
            continue
        values = tuple(f.get(key, "-") for f in flat)
        if len({json.dumps(v, sort_keys=True, default=str) for v in values}) > 1:
            (recipe if _trains(key, inert) else other).append((key, values))
    return recipe, other


def comm_window(run: Run) -> str:
    name = run.summary.get("comm_backend") or run.config.get("comm", {}).get("backend", "?")
    record = registry.ALLREDUCE_BACKENDS.get(name)
    if comm_per_step(run) is None or run.world == 1:  # no comm figures to read a window into
        return "-"
    return record.comm_window if record is not None else "the backend's own (docs/allreduce.md)"


def _network(run: Run) -> str:
    named = run.config.get("comm", {}).get("network") or "auto"
    if not run.network:
        return f"comm.network={named}; no link probe"
    units = {"link_gbit": " Gbit/s link", "flow_gbit": " Gbit/s per flow", "latency_us": " us latency"}
    shown = [
        f"{v:g}{unit}"
        for k, unit in units.items()
        if isinstance(v := run.network.get(k), (int, float)) and not isinstance(v, bool)
    ]
    return f"comm.network={named}; probe: {', '.join(shown) or 'no link figures'}"


def _autotune(run: Run) -> str:
    comm = run.config.get("comm", {})
    if not comm.get("autotune"):
        return "off"
    stats = run.comm
    settings = stats.settings if stats else {}
    chosen = {k: v for k, v in settings.items() if k in ("bucket_mb", "streams", "slices")}
    if settings.get("tune_finished") is False:  # stopped mid-search: the settings are a candidate, not a choice
        measured, total = settings.get("tune_measured", "?"), settings.get("tune_candidates", "?")
        return f"on (tuning unfinished ({measured} of {total} measured); its comm and img/s mix the candidates)"
    return "on" + (f" (kept {', '.join(f'{k}={v}' for k, v in chosen.items())})" if chosen else "")


def _val_count(run: Run) -> str:
    n = run.summary.get("val_count")
    if n is None and run.history:
        n = run.history[-1].get("val_count")
    excluded = run.summary.get("val_excluded")
    return "n/a" if n is None else f"{n}" + (f" ({excluded} blacklisted left out)" if excluded else "")


def _restarted(s: dict) -> str:
    """'restarted 1x: 5 steps redone, 12.3 s of work lost (not in its total time)'."""
    lost = s.get("lost_seconds") or 0.0
    return f"restarted {s['restarts']}x: {s.get('redone_steps', 0)} step(s) redone" + (
        f", {lost:.1f} s of work lost (not in its total time)" if lost else ""
    )


def context(runs: list[Run], recipe: list[tuple], other: list[tuple]) -> str:
    """What sets the runs apart, as Markdown: status, data, validation, network and autotune per run, then every
    config difference."""
    lines = [
        "| run | status | epochs (steps) | data root | validation images | network | autotune |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        planned = f" of {r.planned_epochs}" if r.planned_epochs is not None else ""
        status = "finished"
        if r.interrupted:
            status = f"interrupted (up to epoch {r.summary['epochs']}{planned})"
        elif r.partial:
            status = f"partial ({r.summary['epochs']}{planned} epochs)"
        if r.summary.get("restarts"):
            status += f", {_restarted(r.summary)}"
        steps = r.summary.get("steps")
        root = r.config.get("data", {}).get("root", "?")
        lines.append(
            f"| {r.name} | {status} | {r.summary['epochs']} ({steps if steps is not None else 'n/a'}) | {root} "
            f"| {_val_count(r)} | {_network(r)} | {_autotune(r)} |"
        )
    names = " / ".join(r.name for r in runs)
    for title, diffs in (("recipe (changes what is trained)", recipe), ("settings (do not change training)", other)):
        if diffs:
            lines += ["", f"Config differences, {title}: {names}"]
            lines += [f"- {k}: " + " / ".join(json.dumps(v, default=str) for v in values) for k, values in diffs]
    if not recipe and not other:
        lines += ["", "Config differences: none beyond the allreduce backend (comm.*)"]
    return "\n".join(lines)


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


def phase_spread(run: Run) -> list[tuple[float, float, int] | None]:
    """Per phase of the config: (lowest, highest images/s, epochs) over its epochs, the rounds of the same work;
    None where fewer than two epochs have a rate."""
    out, first = [], 0
    by_epoch = {r["epoch"]: r for r in run.history}
    for p in run.config.get("phases") or []:
        rates = [
            by_epoch[e]["images_per_s"]
            for e in range(first + 1, first + p["epochs"] + 1)
            if by_epoch.get(e, {}).get("images_per_s") is not None
        ]
        out.append((min(rates), max(rates), len(rates)) if len(rates) > 1 else None)
        first += p["epochs"]
    return out


def _fmt_target(t: dict[str, float]) -> str:
    return " and ".join(f"{k} >= {v:g}%" for k, v in t.items())


def _cell(value: float | None, fmt: str, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{fmt}}{unit}"


def backend_label(run: Run) -> str:
    """The backend's label (base/registry.py), with the TCP flows per peer when a run asked for several
    (ddp: comm.gloo_devices or NCCL's multi-flow settings): the strongest plain-DDP baseline reads "ddp (16 flows)"
    beside "ddp", as in the time model's rows."""
    name = run.summary.get("comm_backend") or run.config.get("comm", {}).get("backend", "?")
    stats = run.comm
    flows = stats.settings.get("flows") if stats is not None else None
    record = registry.ALLREDUCE_BACKENDS.get(name)
    if record is None:  # a run of a backend this checkout does not know
        return name
    return record.row_label(flows if isinstance(flows, int) else 1)


def _efficiency(run: Run, ips: float | None, single: Run | None, forced: bool) -> float | None:
    """images/s against the single-process run's, per process; None unless both ran the same whole recipe."""
    if forced or single is None or not (run.whole and single.whole):
        return None
    base = single.summary.get("images_per_s")
    return ips / (run.world * float(base)) if ips is not None and base else None


def compare(runs: list[Run], target: dict[str, float] | None = None, *, forced: bool = False) -> list[dict]:
    """One row of numbers per run (None where not available); `forced`: the recipes differ (--force), so the
    columns that need like recipes (scaling efficiency) are None."""
    single = next((r for r in runs if r.world == 1), None)
    rows = []
    for run in runs:
        s = run.summary
        t = run_target(run, target)
        hit = time_to_target(run, t)
        ips = float(s["images_per_s"]) if s.get("images_per_s") is not None else None
        step_s = s["train_seconds"] / s["steps"] if s.get("steps") else None
        comm = comm_per_step(run)
        rows.append(
            {
                "run": run.name + run.mark(),
                "backend": backend_label(run),
                "comm_window": comm_window(run),
                "processes": run.world,
                "target": _fmt_target(t),
                "target_values": t,
                "time_to_target_s": hit["train_seconds"] if hit else None,
                "epoch_at_target": hit["epoch"] if hit else None,
                "wall_s": float(s["wall_seconds"]) if s.get("wall_seconds") is not None else None,
                "train_s": float(s["train_seconds"]),
                "images_per_s": ips,
                "images_per_s_per_process": ips / run.world if ips is not None else None,
                "comm_ms_per_step": comm * 1000 if comm is not None else None,
                "comm_share": comm / step_s if comm is not None and step_s else None,
                "scaling_efficiency": _efficiency(run, ips, single, forced),
                "final_top1": s["final_top1"],
                "final_top5": s["final_top5"],
            }
        )
    return rows


FORCED = (
    "Forced comparison (--force): the recipes differ (the config differences above), so time, accuracy and images/s "
    "are of different recipes, and scaling efficiency is n/a."
)
PARTIAL = (
    "A partial or interrupted run stopped before the end of its plan: its time and images/s cover only the epochs it "
    "ran (its first phases), not its recipe; its scaling efficiency is n/a."
)


RESTARTED = (
    "A restarted run resumed from a checkpoint after a failure: its total time counts the steps it redid once, not "
    "their first run that the failure threw away (the status column gives that work); a clean run is not slower by it."
)


def markdown(runs: list[Run], rows: list[dict], *, forced: bool = False) -> str:
    head = (
        "| run | backend | processes | target | time to target | total time | images/s | images/s per process "
        "| comm per step | comm window | comm share | scaling efficiency | final top-1 / top-5 |"
    )
    lines = [FORCED, ""] if forced else []
    lines += [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        ttt = "not reached"
        if r["time_to_target_s"] is not None:
            ttt = f"{r['time_to_target_s']:.1f} s (epoch {r['epoch_at_target']})"
        lines.append(
            f"| {r['run']} | {r['backend']} | {r['processes']} | {r['target']} | {ttt} "
            f"| {_cell(r['wall_s'], '.1f', ' s')} "
            f"| {_cell(r['images_per_s'], '.1f')} | {_cell(r['images_per_s_per_process'], '.1f')} "
            f"| {_cell(r['comm_ms_per_step'], '.1f', ' ms')} | {r['comm_window']} "
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
        spread = False
        for run, p in zip(runs, phases, strict=True):
            cells = []
            for (_, v), s in zip(p, phase_spread(run) + [None] * len(p), strict=False):
                cells.append(_cell(v, ".1f") + (f" ({s[0]:.1f}-{s[1]:.1f}, {s[2]} epochs)" if s and v else ""))
                spread = spread or bool(s and v)
            cells += ["-"] * (width - len(p))
            lines.append(f"| {run.name} | " + " | ".join(cells) + " |")
        if spread:
            lines += [
                "",
                "In parentheses: the lowest and highest images/s of the phase's epochs (each epoch repeats the same "
                "work): a difference between runs within that spread is noise, not a faster backend.",
            ]
    if not all(run.whole for run in runs):
        lines += ["", PARTIAL]
    if any(run.summary.get("restarts") for run in runs):
        lines += ["", RESTARTED]
    windows = {r["comm_window"] for r in rows if r["comm_window"] != "-"}
    if len(windows) > 1:
        lines += [
            "",
            "The comm columns time a different window per backend (comm window; docs/allreduce.md): compare the "
            "images/s and time to target across backends, the comm share only within one.",
        ]
    return "\n".join(lines)


def plotted_metric(rows: list[dict]) -> str:
    """The accuracy the plot draws: top-1 when every run's target is top-1 only, else top-5."""
    targets = [r["target_values"] for r in rows]
    return "top1" if targets and all(set(t) == {"top1"} for t in targets) else "top5"


def figure(runs: list[Run], rows: list[dict], *, forced: bool = False):
    """The plot as a matplotlib Figure: the targets' accuracy against wall-clock time (left, the target as a dashed
    line) and images/s per phase (right), one colour per run, legends below the axes (never over a curve)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.6))
    metric = plotted_metric(rows)
    name = {"top1": "top-1", "top5": "top-5"}[metric]
    wall = all("wall_seconds" in r for run in runs for r in run.history)
    for run in runs:
        xs = [r["wall_seconds"] if wall else r["train_seconds"] for r in run.history]
        label = f"{run.name} ({run.world} proc."
        label += f", comm window: {comm_window(run)})" if comm_window(run) != "-" else ")"
        label += run.mark()
        ax1.plot(xs, [r[metric] for r in run.history], marker="o", ms=3, label=label)
    for t in sorted({r["target_values"][metric] for r in rows if metric in r["target_values"]}):
        ax1.axhline(t, ls="--", c="gray", lw=0.8, label=f"target: {name} >= {t:g}%")
    ax1.set_xlabel("wall-clock time (s)" if wall else "training time (s)")
    ax1.set_ylabel(f"{name} accuracy (%)")
    ax1.set_title(f"{name} against time")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1)
    per_phase = [phase_throughput(run) for run in runs]
    width = 0.8 / max(1, len(runs))
    for k, (run, p) in enumerate(zip(runs, per_phase, strict=True)):
        xs = [i + k * width for i in range(len(p))]
        ax2.bar(xs, [v or 0.0 for _, v in p], width=width, label=run.name + run.mark())
    longest = max(per_phase, key=len) if per_phase else []
    ax2.set_xticks([i + 0.4 - width / 2 for i in range(len(longest))], [lbl for lbl, _ in longest], fontsize=8)
    ax2.set_ylabel("images/s (all processes)")
    ax2.set_title("throughput per phase")
    ax2.grid(alpha=0.3, axis="y")
    ax2.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1)
    if forced:
        fig.suptitle("forced comparison (--force): the recipes differ", color="darkred")
    fig.tight_layout()
    return fig


def plot(runs: list[Run], rows: list[dict], *, forced: bool = False) -> bytes:
    """The figure() as PNG bytes."""
    import matplotlib.pyplot as plt

    fig = figure(runs, rows, forced=forced)
    data = figure_bytes(fig, dpi=110)
    plt.close(fig)
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="See the module docstring.")
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (train.py --run-dir)")
    ap.add_argument("--target", help="top1=N and/or top5=N for every run (default: each run's config, else top5=93)")
    ap.add_argument("--plot", help="PNG to write (default: compare.png beside the first run directory)")
    ap.add_argument("--markdown", help="also write the tables to this file")
    ap.add_argument("--force", action="store_true", help="compare runs whose recipes differ beyond the backend")
    args = ap.parse_args(argv)
    args.plot = args.plot or str(Path(args.runs[0]).parent / "compare.png")
    try:
        target = parse_target(args.target)
        runs = [load_run(p) for p in args.runs]
        for flag, out in (("--plot", args.plot), ("--markdown", args.markdown)):
            if out:
                check_target(out, flag)
    except (CompareError, RunDirError) as e:
        print(f"compare_runs: error: {e}", file=sys.stderr)
        return 2
    recipe, other = differences(runs)
    if recipe and not args.force:
        shown = "; ".join(f"{k}: " + " vs ".join(json.dumps(v, default=str) for v in vals) for k, vals in recipe[:3])
        more = f" and {len(recipe) - 3} more" if len(recipe) > 3 else ""
        print(
            f"compare_runs: error: the runs' recipes differ beyond the backend ({shown}{more}); "
            "rerun with --force to compare them anyway",
            file=sys.stderr,
        )
        return 2
    forced = bool(recipe)
    rows = compare(runs, target, forced=forced)
    text = context(runs, recipe, other) + "\n\n" + markdown(runs, rows, forced=forced)
    print(text)
    try:
        if args.markdown:
            write_output(args.markdown, text + "\n", "--markdown")
        write_output(args.plot, plot(runs, rows, forced=forced), "--plot")
    except RunDirError as e:
        print(f"compare_runs: error: {e}", file=sys.stderr)
        return 2
    print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
