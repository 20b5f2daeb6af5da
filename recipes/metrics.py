"""The training metrics, declared once: each one's name, unit, how a log window or an epoch aggregates it, where it
comes from and how the console shows it. Every sink takes the name from here:

    every log window (`log.every_steps`)  the console's step line, TensorBoard `train/<name>`, progress.json
    every epoch                           history rows (the checkpoint's, summary.json's `history`), TensorBoard
                                          `epoch/<name>` (training) and `val/<what evaluate() calls it>` (validation)
    end of the run                        summary.json (each of SUMMARY, aggregated from a metric as it declares,
                                          and the history rows) and the table the log ends with

The step hands the window its device values by name (`StepRunner.__call__` returns `{"loss": ..., "grad_norm": ...}`);
`recipes.epoch_clock.EpochClock` sums them on the device and reads them once per window, so a metric added here
with `how="mean"` or `"finite_mean"` needs only its value in that dict.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# How a log window (or an epoch: the same over its windows) turns its steps' values into one number.
HOW = {
    "mean": "the steps' device values summed, read once per window, divided by the steps",
    "finite_mean": "the mean over the steps where the value is finite: a skipped step (inf/NaN gradients, counted "
    "in `skipped_steps`) is left out, not averaged in; none (`-`, null) if no step was finite",
    "rate": "training images of all ranks / training seconds, on the host",
    "last": "the host's value at the window's last step",
    "host_mean": "the host's seconds per step, summed over the steps on the host, divided by the steps",
    "host_share": "the host's seconds over the training seconds (checkpoints not counted): a share of the step",
    "estimate": "the epoch's seconds per step so far x the plan's steps left",
    "epoch": "one value per epoch",
}


@dataclass(frozen=True)
class Metric:
    """One metric: `name` is its key in every file and in its TensorBoard tag."""

    name: str
    unit: str
    how: str  # a key of HOW
    source: str  # where its value comes from
    console: str = ""  # the step line's format of its value ({} is the value); "" = not on the step line
    reads: str = ""  # validation: its key in evaluate()'s dict (its tag is `val/<reads>`, as TensorBoard had it)
    tensorboard: bool = True

    def show(self, value: float | None) -> str:
        """The value as the step line shows it (`-` when the window had none)."""
        if value is None:  # the format's field is for a number: keep its text, show "-" in its place
            return re.sub(r"\{[^}]*\}", "-", self.console)
        return self.console.format(format_seconds(value) if self.unit == "s" else value)


LOSS = Metric(
    "loss",
    "nats",
    "mean",
    "the training criterion (label-smoothed cross-entropy) of each step's batch, before the optimizer step",
    console="loss {:.4f}",
)
GRAD_NORM = Metric(
    "grad_norm",
    "",
    "finite_mean",
    "the L2 norm of all gradients after the allreduce (averaged over ranks and micro-batches) and after fp16 "
    "unscaling, before optim.clip_grad_norm clips them (the applied gradients' norm is then min(grad_norm, clip))",
    console="grad_norm {:.3g}",
)
IMAGES_PER_S = Metric(
    "images_per_s", "images/s", "rate", "training images (all ranks; AugMix views not counted twice)", "{:8.1f} img/s"
)
LR = Metric("lr", "", "last", "the schedule's learning rate (recipes/schedule.py)", console="lr {:.4g}")
MOMENTUM = Metric(
    "momentum",
    "",
    "last",
    "the schedule's momentum (recipes/schedule.py); none for an optimizer that reads none (its record: Lamb, AdamW)",
)
ETA = Metric("eta_seconds", "s", "estimate", "recipes/epoch_clock.py: the time left to the plan's end", "eta {}")

# Measured on the host around each step's `next()` of the input pipeline's batches (recipes/epoch_clock.py `timed`):
# the time the training loop waited for its input. A share near 0: the input keeps up; near 1: the run is input-bound.
_WAIT = "the host's wait for the input pipeline's next batch (around `next()` of its batches), per step"
DATA_WAIT = Metric("data_wait_ms", "ms", "host_mean", _WAIT, console="data wait {:.1f} ms")
DATA_WAIT_SHARE = Metric(
    "data_wait_share", "", "host_share", "the data wait's share of the step: is the run input-bound?", "({:.0%})"
)

# Every log window, in the step line's order.
WINDOW = (IMAGES_PER_S, LOSS, GRAD_NORM, LR, ETA, MOMENTUM, DATA_WAIT, DATA_WAIT_SHARE)
DEVICE_SUMS = tuple(m for m in WINDOW if m.how in ("mean", "finite_mean"))  # the step's named device values

# Every epoch: a history row. The training ones are the epoch's windows together (EpochClock.epoch(): the steps
# since the epoch's start, or since its resume); validation's come from recipes.evaluation.accuracy.evaluate().
EPOCH = (
    Metric("epoch", "", "epoch", "epochs done (1-based)", tensorboard=False),
    Metric("step", "", "epoch", "optimizer steps done", tensorboard=False),
    Metric(
        "train_seconds",
        "s",
        "epoch",
        "training time so far (DAWNBench's: no validation, no checkpoints)",
        tensorboard=False,
    ),
    Metric(
        "wall_seconds", "s", "epoch", "wall-clock time since the run started, validation included", tensorboard=False
    ),
    Metric("images_per_s", "images/s", "rate", IMAGES_PER_S.source),
    Metric("loss", "nats", "mean", LOSS.source),
    Metric("grad_norm", "", "finite_mean", GRAD_NORM.source),
    Metric(DATA_WAIT.name, DATA_WAIT.unit, DATA_WAIT.how, DATA_WAIT.source),
    Metric(DATA_WAIT_SHARE.name, DATA_WAIT_SHARE.unit, DATA_WAIT_SHARE.how, DATA_WAIT_SHARE.source),
    Metric("top1", "%", "epoch", "validation top-1 accuracy, every validation image counted once", reads="top1"),
    Metric("top5", "%", "epoch", "validation top-5 accuracy", reads="top5"),
    Metric("val_loss", "nats", "epoch", "validation cross-entropy (no label smoothing)", reads="loss"),
    Metric("val_count", "images", "epoch", "validation images counted", reads="count", tensorboard=False),
    Metric("ema_top1", "%", "epoch", "run.ema: the EMA weights' top-1", reads="ema_top1"),
    Metric("ema_top5", "%", "epoch", "run.ema: the EMA weights' top-5", reads="ema_top5"),
    Metric("ema_loss", "nats", "epoch", "run.ema: the EMA weights' validation loss", reads="ema_loss"),
)


# How the end-of-run summary turns a run into one value (summary.json; the table the log ends with): from the history
# rows (each epoch's EPOCH metrics), or from the run's own State (the whole run, across resumes).
SUMMARY_HOW = {
    "last": "the last epoch's value (history's last row); none if it has none",
    "at_target": "its value in the first epoch whose validation met every target set (run.target_top1/top5)",
    "mean": "the mean over the epochs that have a value",
    "sum": "the sum over the epochs that have a value",
    "max": "the largest value of an epoch",
    "run": "the run's own count or clock (its State: every epoch, every resume)",
    "rate": "training images of all ranks / training seconds, over the whole run",
}


def _rows_with(rows: list[dict], name: str) -> list:
    return [r[name] for r in rows if r.get(name) is not None]


# SUMMARY_HOW's kind -> (the run's State, its history, the epoch at target or None, the metric's name) -> the value
_AGGREGATE = {
    "last": lambda st, rows, hit, name: rows[-1].get(name) if rows else None,
    "at_target": lambda st, rows, hit, name: hit.get(name) if hit else None,
    "mean": lambda st, rows, hit, name: sum(v) / len(v) if (v := _rows_with(rows, name)) else None,
    "sum": lambda st, rows, hit, name: sum(v) if (v := _rows_with(rows, name)) else None,
    "max": lambda st, rows, hit, name: max(v) if (v := _rows_with(rows, name)) else None,
    "run": lambda st, rows, hit, name: getattr(st, name),
    "rate": lambda st, rows, hit, name: st.images / max(st.train_seconds, 1e-9),
}


@dataclass(frozen=True)
class Total:
    """One value of the run's summary, aggregated from a metric: a new epoch metric gets its summary.json key (and
    its row in the table, with a label) by declaring one here."""

    key: str  # its key in summary.json (compare_runs reads it)
    metric: str  # the EPOCH metric it aggregates (a history row's key), or the State's attribute for "run"
    how: str  # a key of SUMMARY_HOW
    label: str = ""  # its own row in the table the log ends with; "" = shown in a combined row, or summary.json only
    fmt: str = "{}"  # the row's format of its value (a metric in seconds shows h:mm:ss)

    def value(self, st, hit: dict | None):
        """Its value for the run's State `st`; `hit`: the history row where the targets were first met, or None."""
        return _AGGREGATE[self.how](st, st.history, hit, self.metric)

    def show(self, value) -> str:
        if value is None:
            return "-"
        unit = next((m.unit for m in EPOCH if m.name == self.metric), "")
        return format_seconds(value) if unit == "s" else self.fmt.format(value)


# The run's summary, in summary.json's order (recipes/report.py adds the run's settings and identity around them).
SUMMARY = (
    Total("wall_seconds", "wall_seconds", "run"),
    Total("train_seconds", "train_seconds", "run"),
    Total("time_to_target_seconds", "train_seconds", "at_target"),
    Total("epoch_at_target", "epoch", "at_target"),
    Total("final_top1", "top1", "last"),
    Total("final_top5", "top5", "last"),
    Total("final_ema_top1", "ema_top1", "last"),  # run.ema: the EMA weights' accuracy (None without it)
    Total("final_ema_top5", "ema_top5", "last"),
    Total("val_count", "val_count", "last"),  # validation images counted (data.val_blacklist excluded)
    Total(IMAGES_PER_S.name, IMAGES_PER_S.name, "rate", "images/s (training)", "{:.1f}"),
    Total(DATA_WAIT.name, DATA_WAIT.name, "mean", "data wait per step (ms)", "{:.1f}"),
    Total(DATA_WAIT_SHARE.name, DATA_WAIT_SHARE.name, "mean", "data wait, share of the step", "{:.1%}"),
    Total("skipped_steps", "skipped_steps", "run", "skipped steps (inf/nan gradients)"),
    Total("restarts", "restarts", "run"),
    Total("redone_steps", "redone_steps", "run"),
    Total("lost_seconds", "lost_seconds", "run"),  # not in wall_seconds: the redone steps' first run
)


def run_totals(st, hit: dict | None) -> dict:
    """summary.json's values of SUMMARY for the run's State `st` (`hit`: the first history row at target, or None)."""
    return {t.key: t.value(st, hit) for t in SUMMARY}


def window_tag(m: Metric) -> str:
    return f"train/{m.name}"


def epoch_tag(m: Metric) -> str | None:
    """The metric's TensorBoard tag per epoch; None: history rows only (counters and clocks)."""
    if not m.tensorboard:
        return None
    return f"val/{m.reads}" if m.reads else f"epoch/{m.name}"


def step_line(epoch: int, epochs: int, step: int, steps: int, window: dict) -> str:
    """The console line of a log window: where it is, then each window metric that has a console format."""
    shown = [m.show(window.get(m.name)) for m in WINDOW if m.console]
    return f"epoch {epoch + 1}/{epochs}  step {step}/{steps}  " + "  ".join(shown)


def window_scalars(window: dict) -> dict[str, float]:
    """TensorBoard scalars of a log window (a metric the window had no value of is left out)."""
    return {window_tag(m): window[m.name] for m in WINDOW if window.get(m.name) is not None}


def epoch_row(*, epoch: int, step: int, train_seconds: float, train: dict, val: dict) -> dict:
    """A history row: the epoch's counters, its training metrics (`train`: EpochClock.epoch()) and validation
    (`val`: evaluate()'s dict, with ema_* under run.ema)."""
    row = {"epoch": epoch, "step": step, "train_seconds": train_seconds}
    row.update({m.name: train[m.name] for m in EPOCH if not m.reads and m.name in train})
    row.update({m.name: val[m.reads] for m in EPOCH if m.reads and m.reads in val})
    return row


def ema_values(ev: dict) -> dict:
    """evaluate()'s dict of the EMA weights, under the keys the record's ema_* metrics read."""
    return {m.reads: ev[m.reads.removeprefix("ema_")] for m in EPOCH if m.reads.startswith("ema_")}


def epoch_scalars(row: dict) -> dict[str, float]:
    """TensorBoard scalars of a history row."""
    return {epoch_tag(m): row[m.name] for m in EPOCH if epoch_tag(m) and row.get(m.name) is not None}


def format_seconds(s: float) -> str:
    s = max(0, int(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def reference_table() -> str:
    """The Markdown table of the metrics (docs/metrics.md is written from it: scripts/gen_config_reference.py)."""
    lines = ["| name | when | unit | aggregated as | TensorBoard | from |", "|---|---|---|---|---|---|"]
    for when, ms, tag in (("log window", WINDOW, window_tag), ("epoch", EPOCH, epoch_tag)):
        for m in ms:
            tb = f"`{tag(m)}`" if tag(m) else "-"
            lines.append(f"| `{m.name}` | {when} | {m.unit or '-'} | {HOW[m.how]} | {tb} | {m.source} |")
    units = {m.name: m.unit for m in EPOCH}
    for t in SUMMARY:
        source = f"the run's `{t.metric}`" if t.how in ("run", "rate") else f"`{t.metric}` of the epochs"
        how = SUMMARY_HOW[t.how]
        lines.append(f"| `{t.key}` | end of run | {units.get(t.metric) or '-'} | {how} | - | {source} |")
    return "\n".join(lines)
