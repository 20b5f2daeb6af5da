"""compare_runs.py against run directories whose files are not what train.py writes: one `compare_runs: error:` line
naming the file, exit 2, nothing written; and its plot lands beside the runs, never in the current directory."""

from __future__ import annotations

import json
import os

import pytest
from support import fake_run_dir

from scripts import compare_runs

BAD_SUMMARY = [
    ("summary.json", "{oops", "not valid JSON"),
    ("summary.json", '{"epochs": NaN}', "NaN"),
    ("summary.json", "[1, 2]", "expected an object"),
    ("summary.json", json.dumps({"world_size": "two"}), "'world_size'"),
    ("summary.json", json.dumps({"world_size": 0}), "'world_size': expected an integer >= 1"),
    ("summary.json", json.dumps({"world_size": 1, "train_seconds": -5}), "'train_seconds'"),
    ("summary.json", json.dumps({"world_size": 1, "history": "x"}), "'history' must be a list"),
    ("summary.json", json.dumps({"world_size": 1, "history": [{"epoch": "1"}]}), "history[0].epoch"),
    ("summary.json", json.dumps({"world_size": 1, "comm": {"steps": "many"}}), "'comm'"),
    ("config.yaml", "a: [1\n", "not valid YAML"),
    ("config.yaml", "- 1\n", "expected a mapping"),
    ("config.yaml", "comm: 5\n", "section 'comm': expected a mapping, got 5"),
    ("config.yaml", "phases: [1]\n", "'phases': expected a list of mappings"),
    ("config.yaml", "a: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),  # the config parser's depth bound
    ("config.yaml", "run:\n  seed: " + "9" * 5000 + "\n", "line 2: a number of 5,000 characters: expected at most 40"),
    ("config.yaml", "run: {}\n" + "#" * (1 << 20), "expected at most 1,048,576"),
    ("summary.json", json.dumps({"world_size": 1, "comm_backend": [1]}), "'comm_backend': expected a backend name"),
]


@pytest.mark.parametrize("name, text, words", BAD_SUMMARY, ids=[w for *_, w in BAD_SUMMARY])
def test_a_malformed_run_file_is_one_line(tmp_path, capsys, name, text, words, monkeypatch):
    run = fake_run_dir(tmp_path / "a", "ddp")
    (run / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    assert compare_runs.main([str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("compare_runs: error: ") and str(run / name) in err, err
    assert words in err, err
    assert sorted(os.listdir(tmp_path)) == ["a"]  # no compare.png written anywhere


def test_an_interrupted_runs_table_with_a_bad_line_is_one_line(tmp_path, capsys):
    run = fake_run_dir(tmp_path / "a", "ddp", finished=False)
    (run / "dawnbench.tsv").write_text("epoch\thours\ttop1\ttop5\n1\tsoon\t1\t2\n")
    assert compare_runs.main([str(run)]) == 2
    assert "dawnbench.tsv: line 2 is not 'epoch hours top1 top5'" in capsys.readouterr().err


def test_the_plot_goes_beside_the_runs_and_never_through_a_link(tmp_path, capsys, monkeypatch):
    a, b = fake_run_dir(tmp_path / "runs" / "a", "ddp"), fake_run_dir(tmp_path / "runs" / "b", "multistream")
    monkeypatch.chdir(tmp_path)
    assert compare_runs.main([str(a), str(b)]) == 0
    assert (tmp_path / "runs" / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "compare.png").exists()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "runs" / "compare.png").unlink()
    (tmp_path / "runs" / "compare.png").symlink_to(victim)
    capsys.readouterr()
    assert compare_runs.main([str(a), str(b)]) == 2
    assert "--plot: " in capsys.readouterr().err and victim.read_text() == "precious"


@pytest.mark.parametrize("value", ["x", [1], True, 2.5, 0, 10**300])
def test_an_interrupted_runs_meta_json_holds_a_process_count(tmp_path, capsys, value):
    run = fake_run_dir(tmp_path / "a", "ddp", finished=False)
    (run / "meta.json").write_text(json.dumps({"world_size": value}))
    assert compare_runs.main([str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{run / 'meta.json'}: 'world_size': expected an integer in [1," in err, err


def test_a_restarted_run_says_what_its_total_time_leaves_out(tmp_path, capsys):
    a, b = fake_run_dir(tmp_path / "a", "ddp"), fake_run_dir(tmp_path / "b", "multistream")
    args = [str(a), str(b), "--plot", str(tmp_path / "c.png"), "--markdown", str(tmp_path / "t.md")]
    assert compare_runs.main(args) == 0
    assert "restarted 1x" not in capsys.readouterr().out
    assert compare_runs.RESTARTED not in (tmp_path / "t.md").read_text()
    summary = json.loads((b / "summary.json").read_text())
    (b / "summary.json").write_text(json.dumps({**summary, "restarts": 1, "redone_steps": 5, "lost_seconds": 12.25}))
    assert compare_runs.main(args) == 0
    out = capsys.readouterr().out
    assert "| finished, restarted 1x: 5 step(s) redone, 12.2 s of work lost (not in its total time) |" in out
    assert compare_runs.RESTARTED in out
