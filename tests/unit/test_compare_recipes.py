"""scripts/compare_runs.py compares only what is comparable: recipe differences refused without --force, the
context (data root, validation images, network, autotune) printed, comm windows named per backend, and an
interrupted run compared up to its last epoch. Run directories written by hand, as train.py leaves them."""

from __future__ import annotations

import json

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
    assert rows["cut"]["status"] == "interrupted (up to epoch 2)" and rows["done"]["status"] == "finished"
    row = rows["cut (interrupted)"]
    assert row["final top-1 / top-5"] == "40.00% / 80.00%" and row["processes"] == "2"
    assert row["images/s"] == row["comm per step"] == row["total time"] == "n/a"
    assert row["time to target"] == "not reached"  # top-5 93 is never reached in 2 epochs (80%)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert compare_runs.main([str(empty)]) == 2
    assert "no summary.json" in capsys.readouterr().err
