"""Run directories that cannot be mixed or lost: run ids, resume=false, recipe checks, the lock, checkpoint.pt."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from support import ROOT, tiny_config

from base.errors import RunDirError
from recipes.config import load_config
from recipes.rundir import checkpoint_files as ckpt
from recipes.rundir.directory import read_run_id
from recipes.rundir.resume import compare, recipe_differences
from recipes.trainer import train

DET = ("run.deterministic=true",)


def test_resume_false_archives_the_old_run_and_a_rerun_continues_the_new_one(tiny_root, tmp_path):
    old = train(tiny_config(tiny_root, tmp_path, *DET))  # run A: 2 epochs, ckpt-00000008.pt
    run = tmp_path / "tiny"
    new = train(tiny_config(tiny_root, tmp_path, *DET, "checkpoint.resume=false"), stop_after_epochs=1)  # run B
    assert new["run_id"] != old["run_id"] and new["steps"] == 4
    kept = run / "previous" / old["run_id"]
    assert (kept / "ckpt-00000008.pt").is_file() and (kept / "summary.json").is_file()  # moved, not deleted
    assert sorted(p.name for p in run.glob("ckpt-*.pt")) == ["ckpt-00000004.pt"]
    # A plain rerun continues B (not A's higher-numbered checkpoint, which is no candidate any more).
    again = train(tiny_config(tiny_root, tmp_path, *DET))
    assert again["run_id"] == new["run_id"] == read_run_id(run)
    assert again["steps"] == 8 and again["epochs"] == 2 and len(again["history"]) == 2
    assert ckpt.load(run / "checkpoint.pt")["run_id"] == new["run_id"]


def test_another_runs_checkpoint_is_never_a_candidate(tiny_root, tmp_path):
    train(tiny_config(tiny_root, tmp_path / "a", *DET))
    b = train(tiny_config(tiny_root, tmp_path / "b", *DET), stop_after_epochs=1)
    shutil.copy(tmp_path / "a" / "tiny" / "ckpt-00000008.pt", tmp_path / "b" / "tiny" / "ckpt-00000008.pt")
    again = train(tiny_config(tiny_root, tmp_path / "b", *DET))
    assert again["run_id"] == b["run_id"] and again["steps"] == 8 and len(again["history"]) == 2


def test_changed_recipe_refuses_listing_the_differences_and_force_records_it(tiny_root, tmp_path):
    train(tiny_config(tiny_root, tmp_path, *DET), stop_after_epochs=1)
    run = tmp_path / "tiny"
    before = (run / "config.yaml").read_text()
    changed = ("optim.lr=0.2", "phases=[{epochs: 3, image_size: 32, batch_size: 12}]")
    with pytest.raises(RunDirError) as e:
        train(tiny_config(tiny_root, tmp_path, *DET, *changed))
    assert "optim.lr: 0.1 -> 0.2" in str(e.value) and "phases.0.epochs: 2 -> 3" in str(e.value)
    assert "checkpoint.resume=force" in str(e.value)
    assert (run / "config.yaml").read_text() == before  # a refused start changes nothing
    # Logging, output and checkpoint frequency may change.
    ok = train(
        tiny_config(tiny_root, tmp_path, *DET, "log.every_steps=3", "checkpoint.every_steps=3", "checkpoint.keep=3"),
        stop_after_epochs=0,
    )
    assert ok["steps"] == 4 and ok["resume_forced"] == []
    forced = train(tiny_config(tiny_root, tmp_path, *DET, *changed, "checkpoint.resume=force"))
    assert forced["steps"] == 12
    diffs = forced["resume_forced"][0]["differences"]
    assert "optim.lr: 0.1 -> 0.2" in diffs and forced["resume_forced"][0]["step"] == 4
    assert yaml.safe_load((run / "config.yaml").read_text())["optim"]["lr"] == 0.2


def test_changed_class_list_refuses(tiny_root, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(tiny_root, data)
    train(tiny_config(data, tmp_path, *DET), stop_after_epochs=1)
    gone = sorted(p.name for p in (data / "train").iterdir())[-1]
    shutil.rmtree(data / "train" / gone)
    shutil.rmtree(data / "val" / gone)
    with pytest.raises(RunDirError, match=rf"class list: 4 -> 3 classes \(missing \['{gone}'\]\)"):
        train(tiny_config(data, tmp_path, *DET))


def test_world_size_change_keeps_the_data_order_and_says_what_changes():
    from recipes.config import to_dict

    cfg = load_config(ROOT / "configs" / "base.yaml", ["phases=[{epochs: 1, image_size: 32, batch_size: 16}]"])
    from recipes.rundir.payload import Checkpoint

    ck = Checkpoint(model={}, config=to_dict(cfg), world_size=1, num_train=48, state={"step": 2})
    problems, notes = compare(ck, cfg, [], 48, 2)  # ceil(ceil(n / w) / (B / w)) == ceil(n / B) steps
    assert problems == [] and "the data order carries over" in notes[0] and "1 -> 2" in notes[0]
    problems, _ = compare(dataclasses.replace(ck, num_train=40), cfg, [], 48, 2)
    assert problems == ["training images: 40 -> 48"]


def test_recipe_differences_ignore_logging_and_output():
    a = {"run": {"name": "a", "seed": 0}, "log": {"every_steps": 5}, "phases": [{"epochs": 2}]}
    b = {"run": {"name": "b", "seed": 1}, "log": {"every_steps": 1}, "phases": [{"epochs": 2}, {"epochs": 1}]}
    assert recipe_differences(a, b) == ["phases.1.epochs: '<absent>' -> 1", "phases.length: 1 -> 2", "run.seed: 0 -> 1"]


def test_a_config_written_with_every_plugins_keys_is_the_same_recipe():
    """A checkpoint's config from before each plug-in owned its keys holds every optimizer's: another one's key at its
    default is the same recipe, set to another value it is a difference."""
    a = {"optim": {"name": "sgd", "momentum": 0.9, "eta": 0.001, "trust_clip_max": 1.0}, "comm": {"streams": 4}}
    b = {"optim": {"name": "sgd", "momentum": 0.9}, "comm": {}}
    assert recipe_differences(a, b) == []
    a["optim"]["eta"] = 0.002
    assert recipe_differences(a, b) == ["optim.eta: 0.002 -> '<absent>'"]


def _train_cli(tiny_root, out, *extra) -> subprocess.Popen:
    args = [
        "train.py",
        "-c",
        "configs/base.yaml",
        f"data.root={tiny_root}",
        f"run.out_dir={out}",
        "run.name=tiny",
        "model.name=resnet10t",
        "data.workers=0",
        "run.threads=1",
        "log.tensorboard=false",
        *extra,
    ]
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_two_trainings_into_one_directory_the_second_fails_at_once(tiny_root, tmp_path):
    first = _train_cli(tiny_root, tmp_path, "phases=[{epochs: 200, image_size: 32, batch_size: 12}]")
    run = tmp_path / "tiny"
    try:
        end = time.time() + 300
        while not (run / "progress.json").is_file():
            assert first.poll() is None and time.time() < end, first.communicate()[1][-2000:]
            time.sleep(0.2)
        t0 = time.time()
        second = _train_cli(tiny_root, tmp_path, "phases=[{epochs: 200, image_size: 32, batch_size: 12}]")
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2, err[-2000:]
        assert f"run directory '{run}' is in use by another training (host " in err
        assert f"pid {first.pid}, since" in err and "Traceback" not in err
        assert time.time() - t0 < 60
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate()
    # The lock died with its holder (SIGKILL): the next start resumes.
    third = _train_cli(
        tiny_root, tmp_path, "phases=[{epochs: 200, image_size: 32, batch_size: 12}]", "checkpoint.resume=false"
    )
    try:
        end = time.time() + 300
        while not list(run.glob("previous/*")):
            assert third.poll() is None and time.time() < end, third.communicate()[1][-2000:]
            time.sleep(0.2)
    finally:
        third.send_signal(signal.SIGKILL)
        third.communicate()


def _crash_at(monkeypatch, n: int) -> None:
    """Make the n-th file-system step of a checkpoint write (rename, link, copy, write) raise, as a kill would."""
    count = {"i": 0}

    def wrap(fn):
        def inner(*a, **k):
            count["i"] += 1
            if count["i"] == n:
                raise KeyboardInterrupt(f"interrupted at step {n}")
            return fn(*a, **k)

        return inner

    monkeypatch.setattr(os, "replace", wrap(os.replace))
    monkeypatch.setattr(os, "link", wrap(os.link))
    monkeypatch.setattr(shutil, "copyfile", wrap(shutil.copyfile))


@pytest.mark.parametrize("n", range(1, 9))
def test_an_interrupt_anywhere_in_a_checkpoint_write_leaves_checkpoint_pt_verifiable(tmp_path, monkeypatch, n):
    old = {"model": {"w": torch.zeros(4)}}
    new = {"model": {"w": torch.ones(4)}}
    ckpt.save_step_checkpoint(old, tmp_path, 1, keep=2)
    with monkeypatch.context() as m:
        _crash_at(m, n)
        try:
            ckpt.save_step_checkpoint(new, tmp_path, 2, keep=2)
        except KeyboardInterrupt:
            pass
    got = ckpt.load(tmp_path / "checkpoint.pt")["model"]["w"]  # verifies against its sidecar
    assert torch.equal(got, old["model"]["w"]) or torch.equal(got, new["model"]["w"])
    for p in ckpt.step_checkpoints(tmp_path):
        ckpt.load(p)
    state, _ = ckpt.load_latest(tmp_path)
    assert torch.equal(state["model"]["w"], got) or torch.equal(state["model"]["w"], new["model"]["w"])


def test_checkpoints_load_with_weights_only(tiny_root, tmp_path):
    train(tiny_config(tiny_root, tmp_path, "phases=[{epochs: 1, image_size: 32, batch_size: 12}]"))
    state = torch.load(tmp_path / "tiny" / "checkpoint.pt", weights_only=True)
    assert state["run_id"] == json.loads((tmp_path / "tiny" / "run.json").read_text())["run_id"]
    ckpt.set_rng_state(state["rng"][0])
    assert torch.equal(torch.get_rng_state(), state["rng"][0]["torch"])
