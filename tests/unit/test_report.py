"""The end-of-run summary and the table the log ends with."""

from __future__ import annotations

from recipes import metrics
from recipes.comm.stats import CommStats
from recipes.config import load_config
from recipes.report import summarize, summary_table
from recipes.rundir.payload import State


def _summary(*overrides, history=None, excluded=0, classes=1000, skipped=0, planned=(2, 40), **state):
    cfg = load_config(None, list(overrides))
    st = State(epoch=2, step=40, train_seconds=3725.0, wall_seconds=3800.0, images=7450, history=history or [])
    for k, v in state.items():
        setattr(st, k, v)
    return summarize(
        cfg,
        st,
        world_size=2,
        run_id="abc",
        run_dir="runs/x",
        val_excluded=excluded,
        comm_stats=CommStats("ddp"),
        planned_epochs=planned[0],
        planned_steps=planned[1],
        num_classes=classes,
        val_skipped=skipped,
    )


def _rows(table: str) -> dict[str, str]:
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines() if line.startswith("| ")]
    return dict(cells[1:])  # the first row is the header


def test_the_summary_finds_the_first_epoch_at_target():
    rows = [
        {"epoch": 1, "train_seconds": 1800.0, "top1": 50.0, "top5": 80.0, "val_count": 100},
        {"epoch": 2, "train_seconds": 3725.0, "top1": 76.0, "top5": 93.5, "val_count": 100},
    ]
    s = _summary("run.target_top5=93", history=rows)
    assert (s["time_to_target_seconds"], s["epoch_at_target"], s["final_top5"]) == (3725.0, 2, 93.5)
    assert s["images_per_s"] == 2.0 and s["comm_backend"] == "ddp" and s["run_id"] == "abc"
    rows = _rows(summary_table(s))
    assert rows["time to target (top-5 >= 93%)"] == "1:02:05 (epoch 2)"
    assert rows["final top-1 / top-5"] == "76.00% / 93.50%"
    assert rows["epochs"] == "2 of 2 (40 of 40 steps, 2 process(es))" and not s["partial"]
    assert rows["validation images counted"] == "100 (every image)"
    assert rows["training time"] == "1:02:05 (excl. validation and checkpoints)"


def test_the_table_says_when_no_target_is_set_or_reached_and_what_was_not_counted():
    rows = [{"epoch": 2, "train_seconds": 10.0, "top1": 1.0, "top5": 2.0, "val_count": 97}]
    assert _rows(summary_table(_summary(history=rows)))["time to target (-)"] == "no target set"
    s = _summary("run.target_top1=75", "data.val_blacklist=bl.txt", history=rows, excluded=3)
    got = _rows(summary_table(s))
    assert got["time to target (top-1 >= 75%)"] == "not reached"
    assert got["validation images counted"] == "97 (not counted: 3 blacklisted: bl.txt)"
    # an undecodable file skipped under data.skip_corrupt is not "every image", and no DAWNBench result
    s = _summary("run.target_top5=93", "data.val_blacklist=bl.txt", history=rows, excluded=5, skipped=2)
    assert _rows(summary_table(s))["validation images counted"] == (
        "97 (not counted: 3 blacklisted: bl.txt; 2 undecodable, skipped (data.skip_corrupt))"
    )
    s = _summary("run.target_top5=93", history=[{**rows[0], "val_count": 49_999}], excluded=1, skipped=1)
    assert "it skipped 1 undecodable validation images (data.skip_corrupt)" in s["not_qualifying_because"]
    empty = _summary()  # no epoch finished: no accuracy to report, and no NaN (which JSON has not)
    assert (empty["final_top1"], empty["final_top5"]) == (None, None)
    got = _rows(summary_table(empty))
    assert (got["final top-1 / top-5"], got["validation images counted"]) == ("- (no epoch validated)", "-")


def test_the_summary_says_whether_the_run_is_a_dawnbench_result_and_why_not():
    full = [{"epoch": 2, "train_seconds": 158.0, "top1": 76.0, "top5": 93.1, "val_count": 48_238}]
    s = _summary("run.target_top5=93", "data.val_blacklist=bl.txt", history=full, excluded=1_762)
    assert s["qualifies"] and s["not_qualifying_because"] == []
    assert _rows(summary_table(s))["DAWNBench result"] == "yes (top-5 >= 93% reached, every validation image counted)"
    short = [{**full[0], "top5": 92.0, "val_count": 1_000}]
    s = _summary("run.target_top5=93", history=short)
    assert not s["qualifies"]
    assert s["not_qualifying_because"] == [
        "it did not reach its target (top-5 92.00% at the end, target 93%)",
        "it evaluated 1,000 validation images, not ImageNet's 50,000",
    ]
    assert _rows(summary_table(s))["DAWNBench result"] == "no: " + "; ".join(s["not_qualifying_because"])
    s = _summary("run.target_top5=80", history=full, excluded=1_762)
    assert _rows(summary_table(s))["DAWNBench result"].startswith("no: its target is not DAWNBench's top-5 >= 93%")


def test_a_run_stopped_before_the_end_of_its_plan_says_so():
    rows = [{"epoch": 2, "train_seconds": 17.0, "top1": 1.0, "top5": 5.0, "val_count": 100}]
    s = _summary(history=rows, planned=(9, 180))
    assert (s["planned_epochs"], s["planned_steps"], s["partial"]) == (9, 180, True)
    assert _rows(summary_table(s))["epochs"] == (
        "2 of 9 (40 of 180 steps, 2 process(es)); stopped before the end of the plan: a partial run"
    )
    # Stopped at its target (run.stop_at_target): done by its own rule, not partial.
    hit = [{**rows[0], "top5": 95.0}]
    s = _summary("run.target_top5=93", "run.stop_at_target=true", history=hit, planned=(9, 180))
    assert not s["partial"]
    assert _rows(summary_table(s))["epochs"].endswith("; stopped at its target (run.stop_at_target)")
    # A summary.json from before the plan was recorded still reads.
    old = {k: v for k, v in s.items() if k not in ("planned_epochs", "planned_steps", "partial")}
    assert _rows(summary_table(old))["epochs"] == "2 (40 steps, 2 process(es))"


def test_a_resumed_runs_table_shows_the_restart():
    assert "restarts" not in _rows(summary_table(_summary()))
    s = _summary(restarts=1, redone_steps=7)
    assert _rows(summary_table(s))["restarts"] == "1 (resumed from a checkpoint after a failure; 7 step(s) redone)"
    s = _summary(restarts=1, redone_steps=7, lost_seconds=12.5)
    assert _rows(summary_table(s))["restarts"] == (
        "1 (resumed from a checkpoint after a failure; 7 step(s) redone; 0:00:12 of work lost, not in the wall time)"
    )


def test_a_metric_declared_for_the_summary_gets_its_key_and_row(monkeypatch):
    """A host-measured epoch metric (the input pipeline's wait) gets its summary.json key and its row in the table
    by declaring how it aggregates, here the sum over the epochs, with no code in the report."""
    wait = metrics.Total("data_wait_seconds", "data_wait", "sum", "data wait (s)", "{:.1f}")
    worst = metrics.Total("data_wait_worst", "data_wait", "max")
    monkeypatch.setattr(metrics, "SUMMARY", (*metrics.SUMMARY, wait, worst))
    rows = [
        {"epoch": 1, "train_seconds": 1800.0, "top1": 50.0, "top5": 80.0, "val_count": 100, "data_wait": 3.5},
        {"epoch": 2, "train_seconds": 3725.0, "top1": 76.0, "top5": 93.5, "val_count": 100, "data_wait": 4.25},
    ]
    s = _summary(history=rows)
    assert (s["data_wait_seconds"], s["data_wait_worst"]) == (7.75, 4.25)
    table = _rows(summary_table(s))
    assert table["data wait (s)"] == "7.8" and "data_wait_worst" not in table
    assert list(table)[-2:] == ["data wait (s)", "DAWNBench result"]
    assert _summary()["data_wait_seconds"] is None  # no epoch: nothing to sum


def test_every_summary_value_declares_a_known_kind_and_metric():
    epoch = {m.name for m in metrics.EPOCH}
    for t in metrics.SUMMARY:
        assert t.how in metrics.SUMMARY_HOW, t
        assert t.metric in epoch or t.how in ("run", "rate"), t  # a State attribute only for the run's own kinds
