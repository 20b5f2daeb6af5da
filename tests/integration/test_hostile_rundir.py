"""Run directories with files that are not the run's, generated: a symbolic link under every name a run writes, foreign
files, another run's checkpoints, temp files of a killed writer, a `.lock` that is a folder; and the results a run
writes are strict JSON, written even when the disk refuses the epoch's table."""

from __future__ import annotations

import errno
import json
import os
import shutil

import pytest
import torch
from support import tiny_config

from base.errors import DataError, RunDirError
from base.writer import write_atomic, write_json
from recipes.rundir import checkpoint_files as ckpt
from recipes.rundir import directory, files, outputs
from recipes.trainer import train

DET = ("run.deterministic=true",)
# Every name a run writes in its directory (files.py declares them), with examples of the patterned ones.
WRITTEN = sorted(files._NAMES) + ["ckpt-00000004.pt", "ckpt-00000004.pt.sha256", "checkpoint.pt.sha256"]
WRITTEN += ["me_resnet10t_1x1-cpu_pytorch.not-qualifying.json", "me_resnet10t_1x1-cpu_pytorch.json"]
FOREIGN = ["notes.txt", "train", "val", ".bashrc", "Documents", "checkpoint.pt.bak", "summary.json~", "ckpt-1.pth"]


def _strict(text: str):
    def refuse(name):
        raise AssertionError(f"{name} in JSON")

    return json.loads(text, parse_constant=refuse)


def _tree(root) -> dict:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("name", WRITTEN)
def test_a_planted_symlink_under_any_run_file_name_is_refused_before_anything_is_written(tiny_root, tmp_path, name):
    run = tmp_path / "tiny"
    run.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (run / name).symlink_to(victim)
    with pytest.raises(RunDirError) as e:
        train(tiny_config(tiny_root, tmp_path))
    msg = str(e.value)
    assert "\n" not in msg and f"'{run / name}' is a symbolic link" in msg
    assert victim.read_text() == "precious\n" and sorted(os.listdir(run)) == [name]


@pytest.mark.parametrize("writer", ["json", "text", "tsv", "checkpoint"])
def test_every_writer_refuses_a_symlink_and_leaves_its_target(tmp_path, writer):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "file"
    link.symlink_to(victim)
    write = {
        "json": lambda: write_json(link, {"a": 1}),
        "text": lambda: write_atomic(link, "x"),
        "tsv": lambda: outputs.write_tsv(link, []),
        "checkpoint": lambda: ckpt.save_atomic({"model": {"w": torch.ones(2)}}, link),
    }[writer]
    with pytest.raises(RunDirError, match="is a symbolic link"):
        write()
    assert victim.read_text() == "precious\n" and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "victim"]  # no temp file left


@pytest.mark.parametrize("resume", ["true", "false"])
@pytest.mark.parametrize("name", FOREIGN)
def test_a_directory_that_is_neither_empty_nor_a_run_is_refused_and_left_as_it_was(tiny_root, tmp_path, name, resume):
    home = tmp_path / "home"
    home.mkdir()
    (home / name).mkdir() if "." not in name else (home / name).write_text("mine")
    (home / "config.yaml").write_text("mine too\n")  # a run's name does not make a run
    before = _tree(home)
    with pytest.raises(RunDirError) as e:
        train(tiny_config(tiny_root, tmp_path, f"checkpoint.resume={resume}"), run_dir=home)
    msg = str(e.value)
    assert "\n" not in msg and "is neither empty nor a run" in msg and f"'{name}'" in msg
    assert _tree(home) == before  # nothing written, nothing moved to previous/


def test_a_lock_that_is_a_folder_is_one_line(tiny_root, tmp_path):
    (tmp_path / "tiny" / ".lock").mkdir(parents=True)
    with pytest.raises(RunDirError, match=r"\.lock' is a directory, not the run's lock file"):
        train(tiny_config(tiny_root, tmp_path))


def test_another_runs_checkpoints_are_kept_never_resumed_and_reported(tiny_root, tmp_path, capsys):
    a = train(tiny_config(tiny_root, tmp_path / "a", *DET))  # run A: ckpt-00000008.pt
    b = train(tiny_config(tiny_root, tmp_path / "b", *DET, "checkpoint.keep=1"), stop_after_epochs=1)
    run, theirs = tmp_path / "b" / "tiny", tmp_path / "a" / "tiny" / "ckpt-00000008.pt"
    shutil.copy(theirs, run / "ckpt-00000099.pt")  # higher-numbered: the newest by name
    shutil.copy(theirs, run / "ckpt-00000008.pt")  # the name B's next checkpoint needs
    capsys.readouterr()
    again = train(tiny_config(tiny_root, tmp_path / "b", *DET, "checkpoint.keep=1"))
    out = capsys.readouterr()
    assert again["run_id"] == b["run_id"] and again["steps"] == 8 and len(again["history"]) == 2
    assert (
        "2 checkpoint(s) in" in out.out and "ckpt-00000099.pt" in out.out and "never resumed from or deleted" in out.out
    )
    assert f"moved to '{run / 'previous' / a['run_id'] / 'ckpt-00000008.pt'}'" in out.err
    assert sorted(p.name for p in run.glob("ckpt-*.pt")) == ["ckpt-00000008.pt", "ckpt-00000099.pt"]  # keep=1: own
    assert ckpt.load(run / "ckpt-00000008.pt")["run_id"] == b["run_id"]
    assert ckpt.load(run / "ckpt-00000099.pt")["run_id"] == a["run_id"]
    assert ckpt.load(run / "previous" / a["run_id"] / "ckpt-00000008.pt")["run_id"] == a["run_id"]
    done = train(tiny_config(tiny_root, tmp_path / "b", *DET, "checkpoint.keep=1"))  # not from step 0
    assert done["steps"] == 8 and done["run_id"] == b["run_id"] and (run / "ckpt-00000099.pt").is_file()


def test_checkpoints_of_a_run_without_run_json_are_kept_and_reported(tiny_root, tmp_path, capsys):
    a = train(tiny_config(tiny_root, tmp_path / "a", *DET))
    run = tmp_path / "b" / "tiny"
    run.mkdir(parents=True)
    shutil.copy(tmp_path / "a" / "tiny" / "ckpt-00000008.pt", run / "ckpt-00000050.pt")
    capsys.readouterr()
    b = train(tiny_config(tiny_root, tmp_path / "b", *DET, "checkpoint.keep=1"), stop_after_epochs=1)
    assert b["steps"] == 4 and b["run_id"] != a["run_id"]  # not resumed from A's file
    assert "not this run's (ckpt-00000050.pt)" in capsys.readouterr().out
    assert sorted(p.name for p in run.glob("ckpt-*.pt")) == ["ckpt-00000004.pt", "ckpt-00000050.pt"]


def test_temp_files_of_a_killed_writer_are_removed_by_the_next_run_saying_so(tiny_root, tmp_path, capsys):
    train(tiny_config(tiny_root, tmp_path, *DET), stop_after_epochs=1)
    run = tmp_path / "tiny"
    stale = [".ckpt-00000008.pt.tmp424242", ".checkpoint.pt.link424242", ".progress.json.tmp7", ".run.json.tmp99"]
    for name in stale:
        (run / name).write_bytes(b"\0" * (1 << 20))
    capsys.readouterr()
    train(tiny_config(tiny_root, tmp_path, *DET))
    out = capsys.readouterr().out
    assert f"removed {len(stale)} temp file(s) an interrupted write left in {run}" in out
    assert ".ckpt-00000008.pt.tmp424242 (1.0 MiB)" in out
    assert not [p for p in run.iterdir() if p.name in stale]


def test_no_epoch_validated_writes_strict_json_and_no_nan(tiny_root, tmp_path, capsys):
    s = train(tiny_config(tiny_root, tmp_path), stop_after_epochs=0)
    assert (s["final_top1"], s["final_top5"]) == (None, None)
    run = tmp_path / "tiny"
    for name in (files.SUMMARY, files.ENTRY, files.META, files.RUN):
        _strict((run / name).read_text())
    assert "nan%" not in capsys.readouterr().out.lower()
    with pytest.raises(ValueError):  # the writer itself refuses to produce NaN
        json.dumps(float("nan"), allow_nan=False)
    write_json(tmp_path / "x.json", {"a": float("nan"), "b": [float("inf")], "c": 1.5})
    assert _strict((tmp_path / "x.json").read_text()) == {"a": None, "b": [None], "c": 1.5}


def test_a_full_disk_at_the_epoch_table_still_writes_the_epochs_checkpoint(tiny_root, tmp_path, monkeypatch, capsys):
    def full(path, rows):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs, "write_tsv", full)
    s = train(tiny_config(tiny_root, tmp_path, *DET))
    assert s["steps"] == 8 and ckpt.load(tmp_path / "tiny" / "checkpoint.pt")["state"]["step"] == 8
    assert "dawnbench.tsv' failed: No space left on device; the previous version is kept" in capsys.readouterr().err


def test_a_blacklist_that_excludes_every_validation_image_is_refused_before_training(tiny_root, tmp_path):
    blacklist = tmp_path / "all.txt"
    blacklist.write_text("".join(f"{i}\n" for i in range(1, 21)))  # tiny_root has 20 validation images
    with pytest.raises(DataError, match="excludes every one of the 20 images"):
        train(tiny_config(tiny_root, tmp_path, f"data.val_blacklist={blacklist}"))
    assert not (tmp_path / "tiny" / files.SUMMARY).exists() and not list((tmp_path / "tiny").glob("ckpt-*"))


# Names a run writes after its run.json: found in a folder without one, they are a user's files, not a run's.
AFTER_RUN = sorted(files._NAMES - files.BEFORE_RUN - {files.RUN, files.CHECKPOINT})


@pytest.mark.parametrize("name", AFTER_RUN)
def test_run_names_without_run_json_are_a_users_files_and_left_as_they_were(tmp_path, name):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / name).write_text("# my own, with comments\n")
    before = _tree(proj)
    msg = directory.not_a_run(proj)
    assert f"holds '{name}' but no run.json: not a run's directory" in msg and "\n" not in msg
    assert _tree(proj) == before


@pytest.mark.parametrize("name", sorted(files.BEFORE_RUN) + ["ckpt-00000004.pt", "checkpoint.pt", ".share-ab12"])
def test_what_comes_before_run_json_is_still_a_run_directory(tmp_path, name):
    (tmp_path / name).mkdir() if name in (files.ARCHIVE, files.LAUNCH, files.TENSORBOARD) else (
        tmp_path / name
    ).write_text("x")
    assert directory.not_a_run(tmp_path) is None


def test_a_run_of_another_user_is_not_resumed(tmp_path):
    (tmp_path / "run.json").write_text('{"run_id": "abc"}')
    os.chown(tmp_path / "run.json", os.geteuid() + 4242, -1)
    msg = directory.not_a_run(tmp_path)
    assert f"holds a run of another user (its run.json belongs to uid {os.geteuid() + 4242}" in msg


def test_a_link_above_the_run_directory_is_said(tiny_root, tmp_path, capsys):
    (tmp_path / "real").mkdir()
    (tmp_path / "runs").symlink_to(tmp_path / "real")
    cfg = tiny_config(tiny_root, tmp_path / "runs", *DET)
    train(cfg, stop_after_epochs=1)
    out = capsys.readouterr().out
    assert f"is '{tmp_path / 'real' / 'tiny'}' (a symbolic link above it)" in out
    assert (tmp_path / "real" / "tiny" / "run.json").is_file()


@pytest.mark.parametrize("name", ["run.json", "progress.json"])
def test_a_run_file_that_is_a_fifo_is_one_line_never_a_hang(tiny_root, tmp_path, name):
    run = tmp_path / "tiny"
    run.mkdir()
    os.mkfifo(run / name)  # the old reader opened it and waited for a writer forever
    with pytest.raises(RunDirError) as e:
        train(tiny_config(tiny_root, tmp_path))
    msg = str(e.value)
    assert "\n" not in msg and f"'{run / name}' is not a regular file" in msg, msg
    assert sorted(os.listdir(run)) == [name]


# progress.json's step -> the steps the resume redoes (the checkpoint is at step 4 of the plan's 8)
PROGRESS_STEPS = {'{"step": Infinity}': 0, '{"step": 1e18}': 0, '{"step": "6"}': 0, '{"step": true}': 0}
PROGRESS_STEPS |= {'{"step": -3}': 0, "[6]": 0, '{"step": 1000000000000000000}': 4, '{"step": 6}': 2}


@pytest.mark.parametrize("text", sorted(PROGRESS_STEPS))
def test_progress_json_is_a_step_of_the_plan_or_ignored_with_a_warning(tiny_root, tmp_path, capsys, text):
    train(tiny_config(tiny_root, tmp_path, *DET), stop_after_epochs=1)
    (tmp_path / "tiny" / files.PROGRESS).write_text(text + "\n")
    capsys.readouterr()
    summary = train(tiny_config(tiny_root, tmp_path, *DET))
    err = capsys.readouterr().err
    assert summary["steps"] == 8 and summary["redone_steps"] == PROGRESS_STEPS[text], summary["redone_steps"]
    warned = [ln for ln in err.splitlines() if ln.startswith("warning: ") and files.PROGRESS in ln]
    assert len(warned) == (PROGRESS_STEPS[text] == 0), err
    saved = json.loads((tmp_path / "tiny" / files.SUMMARY).read_text())
    assert saved["redone_steps"] == PROGRESS_STEPS[text]


def test_a_run_directory_spelled_with_dotdot_is_judged_as_the_folder_it_names(tiny_root, tmp_path):
    """`runs/..` while runs/ does not exist: the kernel calls it missing, so it passed as new, and the launcher's
    launch/ (and runs/) were written into the folder above (the repository, for a config named '...')."""
    home = tmp_path / "repo"
    home.mkdir()
    (home / "README.md").write_text("mine\n")
    before = _tree(home)
    with pytest.raises(RunDirError) as e:
        train(tiny_config(tiny_root, tmp_path), run_dir=home / "runs" / "..")
    msg = str(e.value)
    assert "\n" not in msg and f"run directory '{home}' is neither empty nor a run" in msg, msg
    assert _tree(home) == before  # no runs/, no launch/, nothing
    assert directory.not_a_run(home / "runs" / "..") == directory.not_a_run(home)


def test_the_launcher_refuses_runs_dotdot_before_it_writes_launch(tmp_path, capsys):
    """The launcher's check is the trainer's: no launch/ or runs/ appears in the folder above."""
    from support import ROOT

    from scripts import launch

    home = tmp_path / "repo"
    home.mkdir()
    (home / "README.md").write_text("mine\n")
    before = _tree(home)
    argv = ["--hosts", "localhost:1", "--transport", "local", "--run-dir", str(home / "runs" / "..")]
    rc = launch.main([*argv, "-c", str(ROOT / "tests" / "tiny.yaml"), f"data.root={tmp_path / 'none'}"])
    err = capsys.readouterr().err
    assert rc == 2 and f"launch: error: run directory '{home}' is neither empty nor a run" in err, err
    assert _tree(home) == before
