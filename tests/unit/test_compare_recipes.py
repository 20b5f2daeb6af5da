"""scripts/compare_runs.py compares only what is comparable: recipe differences refused without --force, the
context (data root, validation images, network, autotune) printed, comm windows named per backend, and an
interrupted run compared up to its last epoch. Run directories written by hand, as train.py leaves them."""

from __future__ import annotations

import json

import pytest
import yaml
from support import fake_run_dir

from scripts import compare_runs


def _rows(text: str) -> dict[str, dict[str, str]]:
    out, header = {}, None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if header is None:
            header = cells
        elif not set(line) <= set("|-: "):
            out.setdefault(cells[0], {}).update(zip(header[1:], cells[1:], strict=True))
    return out


def test_two_backends_of_one_recipe_compare_with_each_comm_window_named(tmp_path, capsys):
    ddp = fake_run_dir(tmp_path / "ddp", "ddp")
    ms = fake_run_dir(tmp_path / "multistream", "multistream", data__workers=8)
    (ms / "network.json").write_text(json.dumps({"link_gbit": 9.4, "flow_gbit": 4.7, "latency_us": 61.0, "pairs": []}))
    png = tmp_path / "c.png"
    assert compare_runs.main([str(ddp), str(ms), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    assert rows["ddp"]["comm window"] == "first bucket -> last bucket reduced"
    assert rows["multistream"]["comm window"] == "backward + sync"
    assert rows["ddp"]["comm per step"] == rows["multistream"]["comm per step"] == "20.0 ms"
    assert "time a different window per backend" in out
    assert (
        rows["ddp"]["data root"] == "/data/imagenet"
        and rows["ddp"]["validation images"] == "48 (2 blacklisted left out)"
    )
    assert rows["multistream"]["autotune"] == "on (kept bucket_mb=8, streams=2, slices=1)"
    assert rows["ddp"]["autotune"] == "off" and rows["ddp"]["network"] == "comm.network=10gbit; no link probe"
    probe = "comm.network=10gbit; probe: 9.4 Gbit/s link, 4.7 Gbit/s per flow, 61 us latency"
    assert rows["multistream"]["network"] == probe
    # data.workers does not change what is trained: listed, not refused; comm.* and run.name are not differences.
    assert "- data.workers: 4 / 8" in out and "comm.backend" not in out and "run.name" not in out
    assert png.read_bytes()[:4] == b"\x89PNG"
    # A run older than a key: its config.yaml lacks the key, which then holds the default (no difference).
    cfg = yaml.safe_load((ms / "config.yaml").read_text())
    cfg["run"]["stop_at_target"] = False
    cfg["optim"]["nesterov"] = True
    (ms / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert compare_runs.main([str(ddp), str(ms), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "nesterov" not in out and "stop_at_target" not in out


def test_runs_with_other_epochs_are_refused_in_one_line_unless_forced(tmp_path, capsys):
    nine = fake_run_dir(tmp_path / "nine", "ddp", epochs=9)
    three = fake_run_dir(tmp_path / "three", "multistream", epochs=3, optim__lr=0.8)
    args = [str(nine), str(three), "--plot", str(tmp_path / "c.png")]
    assert compare_runs.main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "recipes differ beyond the backend (optim.lr: 0.4 vs 0.8; phases[0].epochs: 9 vs 3)" in captured.err
    assert "--force" in captured.err
    assert compare_runs.main([*args, "--force"]) == 0
    out = capsys.readouterr().out
    assert "Config differences, recipe (changes what is trained): nine / three" in out
    assert "- phases[0].epochs: 9 / 3" in out
    assert _rows(out)["nine"]["epochs (steps)"] == "9 (20)"


def test_an_interrupted_run_is_compared_up_to_its_last_epoch(tmp_path, capsys):
    done = fake_run_dir(tmp_path / "done", "ddp", epochs=3)
    cut = fake_run_dir(tmp_path / "cut", "ddp", epochs=3, finished=False)
    (cut / "dawnbench.tsv").write_text("\n".join((cut / "dawnbench.tsv").read_text().splitlines()[:3]) + "\n")
    assert compare_runs.main([str(done), str(cut), "--plot", str(tmp_path / "c.png")]) == 0
    rows = _rows(capsys.readouterr().out)
    assert rows["cut"]["status"] == "interrupted (up to epoch 2 of 3)" and rows["done"]["status"] == "finished"
    row = rows["cut (interrupted at epoch 2 of 3)"]
    assert row["final top-1 / top-5"] == "40.00% / 80.00%" and row["processes"] == "2"
    assert row["images/s"] == row["comm per step"] == row["total time"] == "n/a"
    assert row["time to target"] == "not reached"  # top-5 93 is never reached in 2 epochs (80%)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert compare_runs.main([str(empty)]) == 2
    assert "no summary.json" in capsys.readouterr().err


def _summary(run_dir, **changes):
    s = json.loads((run_dir / "summary.json").read_text())
    s.update(changes)
    (run_dir / "summary.json").write_text(json.dumps(s))


def test_a_run_stopped_before_the_end_of_its_plan_is_marked_partial(tmp_path, capsys):
    full = fake_run_dir(tmp_path / "full", "ddp", epochs=9)
    cut = fake_run_dir(tmp_path / "cut", "multistream", epochs=9)
    _summary(cut, epochs=3, planned_epochs=9, planned_steps=20, partial=True, images_per_s=300.0)
    png = tmp_path / "c.png"
    assert compare_runs.main([str(full), str(cut), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    assert rows["cut"]["status"] == "partial (3 of 9 epochs)" and rows["full"]["status"] == "finished"
    assert rows["cut (partial: 3 of 9 epochs)"]["images/s"] == "300.0"
    assert "its time and images/s cover only the epochs it ran" in out
    # A summary.json from before the plan was recorded: the config's phases give the plan.
    s = json.loads((cut / "summary.json").read_text())
    del s["planned_epochs"], s["partial"]
    (cut / "summary.json").write_text(json.dumps(s))
    assert compare_runs.main([str(full), str(cut), "--plot", str(png)]) == 0
    assert _rows(capsys.readouterr().out)["cut"]["status"] == "partial (3 of 9 epochs)"
    runs = [compare_runs.load_run(full), compare_runs.load_run(cut)]
    labels = [t.get_text() for t in compare_runs.figure(runs, compare_runs.compare(runs)).axes[0].get_legend().texts]
    assert labels[1] == "cut (2 proc., comm window: backward + sync) (partial: 3 of 9 epochs)"


def test_a_forced_comparison_says_so_and_leaves_scaling_efficiency_out(tmp_path, capsys):
    one = fake_run_dir(tmp_path / "one", "ddp", epochs=2)
    _summary(one, world_size=1, images_per_s=50.0)
    other = fake_run_dir(tmp_path / "other", "ddp", epochs=2, optim__lr=0.8)
    _summary(other, images_per_s=170.0)
    png = tmp_path / "c.png"
    assert compare_runs.main([str(one), str(other), "--plot", str(png), "--force"]) == 0
    out = capsys.readouterr().out
    assert out.count(compare_runs.FORCED) == 1
    assert _rows(out)["other"]["scaling efficiency"] == "n/a"  # 170 / (2 x 50) would read 170%
    runs = [compare_runs.load_run(one), compare_runs.load_run(other)]
    fig = compare_runs.figure(runs, compare_runs.compare(runs, forced=True), forced=True)
    assert fig._suptitle.get_text() == "forced comparison (--force): the recipes differ"
    # Like recipes: the efficiency is there, and nothing says forced.
    _summary(other, images_per_s=90.0)
    cfg = yaml.safe_load((other / "config.yaml").read_text())
    cfg["optim"]["lr"] = 0.4
    (other / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert compare_runs.main([str(one), str(other), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert _rows(out)["other"]["scaling efficiency"] == "90.0%" and "Forced" not in out
    assert _rows(out)["one"]["comm window"] == "-"  # one process: no comm figures, no window named


@pytest.mark.parametrize(
    "key, value",
    [("log.every_steps", 7), ("dawnbench.author", "someone else"), ("checkpoint.keep", 9), ("dist.timeout_s", 9.0)],
)
def test_runs_that_differ_only_in_what_does_not_change_the_result_are_compared(tmp_path, capsys, key, value):
    section, name = key.split(".")
    a = fake_run_dir(tmp_path / "a", "ddp")
    b = fake_run_dir(tmp_path / "b", "multistream")
    cfg = yaml.safe_load((b / "config.yaml").read_text())
    cfg.setdefault(section, {})[name] = value
    (b / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert compare_runs.main([str(a), str(b), "--plot", str(tmp_path / "c.png")]) == 0
    out = capsys.readouterr().out
    assert "Forced" not in out and "recipe (changes what is trained)" not in out
    assert f"- {key}: " in out  # listed as a setting that differs


def test_the_plot_draws_the_targets_metric_and_its_line_and_keeps_the_legend_off_the_curves(tmp_path):
    a = fake_run_dir(tmp_path / "a", "ddp", epochs=3)
    runs = [compare_runs.load_run(a)]
    fig = compare_runs.figure(runs, compare_runs.compare(runs, {"top1": 50.0}))
    ax = fig.axes[0]
    assert ax.get_ylabel() == "top-1 accuracy (%)"
    assert [tuple(line.get_ydata()) for line in ax.get_lines()] == [(20.0, 40.0, 60.0), (50.0, 50.0)]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for axes in fig.axes:
        assert not axes.get_legend().get_window_extent(renderer).overlaps(axes.get_window_extent(renderer))


def test_the_per_phase_table_shows_the_spread_of_its_epochs(tmp_path, capsys):
    a = fake_run_dir(tmp_path / "a", "ddp", epochs=3)
    s = json.loads((a / "summary.json").read_text())
    for row, ips in zip(s["history"], (90.0, 110.0, 100.0), strict=True):
        row["images_per_s"] = ips
    (a / "summary.json").write_text(json.dumps(s))
    one = fake_run_dir(tmp_path / "one", "multistream", epochs=1)  # one epoch: no rounds, no spread
    cfg = yaml.safe_load((one / "config.yaml").read_text())
    cfg["phases"][0]["epochs"] = 3
    (one / "config.yaml").write_text(yaml.safe_dump(cfg))
    _summary(one, epochs=3, planned_epochs=3, partial=False)
    assert compare_runs.main([str(a), str(one), "--plot", str(tmp_path / "c.png")]) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    assert rows["a"]["phase 0 (32 px)"] == "100.0 (90.0-110.0, 3 epochs)"
    assert rows["one"]["phase 0 (32 px)"] == "100.0"
    assert "a difference between runs within that spread is noise" in out


def test_scaling_efficiency_is_left_out_against_a_partial_single_process_run(tmp_path, capsys):
    """CR2: a 1-process run stopped at epoch 1 of 2 ran only its fastest or slowest phase: efficiency against it
    means nothing, so it is n/a; against the whole run it is 170 / (2 x 100)."""
    one = fake_run_dir(tmp_path / "one", "ddp", epochs=2)
    _summary(one, world_size=1, images_per_s=100.0, epochs=1, planned_epochs=2, partial=True)
    other = fake_run_dir(tmp_path / "other", "ddp", epochs=2)
    _summary(other, images_per_s=170.0)
    png = tmp_path / "c.png"
    assert compare_runs.main([str(one), str(other), "--plot", str(png)]) == 0
    assert _rows(capsys.readouterr().out)["other"]["scaling efficiency"] == "n/a"
    _summary(one, epochs=2, planned_epochs=2, partial=False)
    assert compare_runs.main([str(one), str(other), "--plot", str(png)]) == 0
    assert _rows(capsys.readouterr().out)["other"]["scaling efficiency"] == "85.0%"


def test_a_run_stopped_mid_tuning_says_tuning_unfinished_not_kept(tmp_path, capsys):
    """A run that ended with 5 of 10 candidates measured once showed the candidate under measurement as 'kept'."""
    ddp = fake_run_dir(tmp_path / "ddp", "ddp")
    ms = fake_run_dir(tmp_path / "multistream", "multistream")
    summary = json.loads((ms / "summary.json").read_text())
    tuner = {"tune_finished": False, "tune_measured": 5, "tune_candidates": 10}
    summary["comm"]["settings"].update(tuner)
    (ms / "summary.json").write_text(json.dumps(summary))
    assert compare_runs.main([str(ddp), str(ms), "--plot", str(tmp_path / "c.png")]) == 0
    rows = _rows(capsys.readouterr().out)
    unfinished = "on (tuning unfinished (5 of 10 measured); its comm and img/s mix the candidates)"
    assert rows["multistream"]["autotune"] == unfinished
    summary["comm"]["settings"].update(tune_finished=True, tune_measured=10)
    (ms / "summary.json").write_text(json.dumps(summary))
    assert compare_runs.main([str(ddp), str(ms), "--plot", str(tmp_path / "c.png")]) == 0
    assert _rows(capsys.readouterr().out)["multistream"]["autotune"] == "on (kept bucket_mb=8, streams=2, slices=1)"
