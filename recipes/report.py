"""The end-of-run summary (`summary.json`, read by scripts/compare_runs.py) and the table the log ends with."""

from __future__ import annotations

from recipes import metrics
from recipes.config import Config
from recipes.dawnbench import DAWNBENCH_TOP5, qualification
from recipes.metrics import format_seconds


def targets_reached(cfg: Config, row: dict) -> bool:
    """Whether an epoch's accuracies (`top1`, `top5`) meet every target set (run.target_top1/top5)."""
    t1, t5 = cfg.run.target_top1, cfg.run.target_top5
    if t1 is None and t5 is None:
        return False
    return (t1 is None or row["top1"] >= t1) and (t5 is None or row["top5"] >= t5)


def summarize(
    cfg: Config,
    st,
    *,
    world_size: int,
    run_id: str,
    run_dir,
    val_excluded: int,
    comm_stats,
    planned_epochs: int,
    planned_steps: int,
    num_classes=None,
    val_skipped: int = 0,
    train_skipped: int = 0,
) -> dict:
    """The summary of a run from its State `st`; `comm_stats` is the backend's recipes.comm.stats.CommStats;
    `planned_epochs` and `planned_steps` are the plan's whole length (the run may have stopped before)."""
    hit = next((r for r in st.history if targets_reached(cfg, r)), None)
    totals = metrics.run_totals(st, hit)
    s = {
        "epochs": st.epoch,
        "steps": st.step,
        "planned_epochs": planned_epochs,
        "planned_steps": planned_steps,
        # Stopped before the end of its plan (--stop-after-epochs), other than at its target under run.stop_at_target:
        # its time and images/s cover only the epochs it ran, so compare_runs marks it.
        "partial": st.epoch < planned_epochs and not (cfg.run.stop_at_target and hit is not None),
        "world_size": world_size,
        "target_top1": cfg.run.target_top1,
        "target_top5": cfg.run.target_top5,
        **totals,  # the metrics' values for the run, each aggregated as recipes/metrics.py SUMMARY declares
        "val_excluded": val_excluded,  # blacklisted and undecodable (skipped) validation images, not counted
        "val_skipped": val_skipped,
        "train_skipped": train_skipped,
        "val_blacklist": cfg.data.get("val_blacklist", ""),  # synthetic input reads no folders
        "num_classes": num_classes,
        "run_id": run_id,
        "resume_forced": st.forced,
        "run_dir": str(run_dir),
        "comm_backend": cfg.comm.backend,
        "comm": comm_stats.to_dict(),
        "history": st.history,
    }
    # Whether this run is a DAWNBench ImageNet result (the entry's `qualifies`), and why not.
    s["not_qualifying_because"] = qualification(cfg, s)
    s["qualifies"] = not s["not_qualifying_because"]
    return s


def summary_table(s: dict) -> str:
    target = []
    if s["target_top1"] is not None:
        target.append(f"top-1 >= {s['target_top1']:g}%")
    if s["target_top5"] is not None:
        target.append(f"top-5 >= {s['target_top5']:g}%")
    if not target:
        ttt = "no target set"
    elif s["time_to_target_seconds"] is None:
        ttt = "not reached"
    else:
        ttt = f"{format_seconds(s['time_to_target_seconds'])} (epoch {s['epoch_at_target']})"
    rows = [
        ("epochs", _epochs(s)),
        *([("restarts", _restarts(s))] if s.get("restarts") else []),
        ("wall time", format_seconds(s["wall_seconds"])),
        ("training time", f"{format_seconds(s['train_seconds'])} (excl. validation and checkpoints)"),
        (f"time to target ({' and '.join(target) or '-'})", ttt),
        ("final top-1 / top-5", _accuracy(s)),
        *(
            [("final EMA top-1 / top-5", f"{s['final_ema_top1']:.2f}% / {s['final_ema_top5']:.2f}%")]
            if s.get("final_ema_top1") is not None
            else []
        ),
        ("validation images counted", _counted(s)),
        *((t.label, t.show(s.get(t.key))) for t in metrics.SUMMARY if t.label),  # a metric's own row, as it declares
        ("DAWNBench result", _qualifies(s)),
    ]
    width = max(len(k) for k, _ in rows)
    lines = ["", "| " + "summary".ljust(width) + " | value |", "|" + "-" * (width + 2) + "|-------|"]
    lines += [f"| {k.ljust(width)} | {v} |" for k, v in rows]
    return "\n".join(lines)


def _epochs(s: dict) -> str:
    planned, planned_steps = s.get("planned_epochs"), s.get("planned_steps")
    if planned is None:  # a summary.json written before the plan was recorded
        return f"{s['epochs']} ({s['steps']} steps, {s['world_size']} process(es))"
    text = f"{s['epochs']} of {planned} ({s['steps']} of {planned_steps} steps, {s['world_size']} process(es))"
    if s.get("partial"):
        text += "; stopped before the end of the plan: a partial run"
    elif s["epochs"] < planned:
        text += "; stopped at its target (run.stop_at_target)"
    return text


def _restarts(s: dict) -> str:
    lost = s.get("lost_seconds") or 0.0
    return (
        f"{s['restarts']} (resumed from a checkpoint after a failure; {s.get('redone_steps', 0)} step(s) redone"
        + (f"; {format_seconds(lost)} of work lost, not in the wall time" if lost else "")
        + ")"
    )


def _accuracy(s: dict) -> str:
    if s["final_top1"] is None or s["final_top5"] is None:
        return "- (no epoch validated)"
    return f"{s['final_top1']:.2f}% / {s['final_top5']:.2f}%"


def _counted(s: dict) -> str:
    if s.get("val_count") is None:
        return "-"
    skipped = s.get("val_skipped") or 0
    blacklisted = (s.get("val_excluded") or 0) - skipped
    left = [f"{blacklisted} blacklisted: {s['val_blacklist']}"] if blacklisted else []
    left += [f"{skipped} undecodable, skipped (data.skip_corrupt)"] if skipped else []
    if left:
        return f"{s['val_count']} (not counted: {'; '.join(left)})"
    return f"{s['val_count']} (every image)"


def _qualifies(s: dict) -> str:
    if "qualifies" not in s:  # a summary.json written before the field existed
        return "-"
    if s["qualifies"]:
        return f"yes (top-5 >= {DAWNBENCH_TOP5:g}% reached, every validation image counted)"
    return "no: " + "; ".join(s["not_qualifying_because"])
