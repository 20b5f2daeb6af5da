"""The run directory's writers: each file under its declared name, written by the rank that owns it."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from base.errors import RunDirError
from recipes.config import load_config
from recipes.distributed import DistInfo
from recipes.rundir import files
from recipes.rundir.directory import archive, read_run_id, run_files, write_run_file
from recipes.rundir.outputs import TSV_HEADER, RunOutputs

CPU = torch.device("cpu")


def test_rank_0_writes_config_meta_progress_and_history(tmp_path):
    cfg = load_config(None, ["run.name=w", "optim.lr=0.3"])
    out = RunOutputs(tmp_path, DistInfo(0, 2, 0, 2, CPU), leader=True)
    out.start(cfg, "run-1")
    assert read_run_id(tmp_path) == "run-1"
    assert yaml.safe_load((tmp_path / files.CONFIG).read_text())["optim"]["lr"] == 0.3
    meta = json.loads((tmp_path / files.META).read_text())
    assert (meta["run_id"], meta["world_size"], meta["device"], meta["torch"]) == ("run-1", 2, "cpu", torch.__version__)
    out.progress(17, 3)
    assert json.loads((tmp_path / files.PROGRESS).read_text()) == {"step": 17, "epoch": 3}
    out.history([{"epoch": 1, "train_seconds": 1800.0, "top1": 12.345, "top5": 40.0}])
    assert (tmp_path / files.TSV).read_text() == TSV_HEADER + "1\t0.500000\t12.35\t40.00\n"
    assert sorted(p.name for p in run_files(tmp_path)) == sorted(
        [files.RUN, files.CONFIG, files.META, files.PROGRESS, files.TSV]
    )


def test_other_ranks_write_only_what_their_directory_leads(tmp_path):
    cfg = load_config(None, [])
    follower = RunOutputs(tmp_path / "a", DistInfo(1, 2, 1, 2, CPU), leader=False)
    (tmp_path / "a").mkdir()
    follower.start(cfg, "run-1")
    follower.progress(1, 0)
    assert list((tmp_path / "a").iterdir()) == []
    leader = RunOutputs(tmp_path / "b", DistInfo(1, 2, 0, 1, CPU), leader=True)  # a host's own disk
    (tmp_path / "b").mkdir()
    leader.start(cfg, "run-1")
    assert [p.name for p in (tmp_path / "b").iterdir()] == [files.RUN]  # the run file only: rank 0 writes the rest


def test_the_run_file_keeps_its_start_and_archive_moves_a_run_aside(tmp_path):
    write_run_file(tmp_path, "old")
    started = json.loads((tmp_path / files.RUN).read_text())["started"]
    write_run_file(tmp_path, "old")  # the same run: unchanged
    assert json.loads((tmp_path / files.RUN).read_text())["started"] == started
    (tmp_path / files.SUMMARY).write_text("{}")
    (tmp_path / files.LAUNCH).mkdir()
    dest = archive(tmp_path, "old")
    assert dest == tmp_path / files.ARCHIVE / "old"
    assert sorted(p.name for p in dest.iterdir()) == [files.RUN, files.SUMMARY]
    assert run_files(tmp_path) == [] and (tmp_path / files.LAUNCH).is_dir()  # the launcher's logs stay
    assert archive(tmp_path, "old") == tmp_path / files.ARCHIVE / "old-1"  # never overwrites an archived run


def test_meta_records_what_the_run_ran_on(tmp_path, monkeypatch):
    monkeypatch.setenv("DAWNBENCH_PROVIDER", "alibabacloud")  # as the launcher passes --provider/--instance-type on
    monkeypatch.setenv("DAWNBENCH_INSTANCE_TYPE", "ecs.gn6e-c12g1.24xlarge")
    RunOutputs(tmp_path, DistInfo(0, 1, 0, 1, CPU), leader=True).start(load_config(None, []), "run-1")
    env = json.loads((tmp_path / files.META).read_text())["environment"]
    assert (env["provider"], env["instance_type"]) == ("alibabacloud", "ecs.gn6e-c12g1.24xlarge")
    assert env["torch"] == torch.__version__ and env["cuda"] == torch.version.cuda
    assert {"cudnn", "nccl", "dali", "driver", "gpu_model", "gpu_count"} <= env.keys()
    assert env["gpu_count"] == (torch.cuda.device_count() if torch.cuda.is_available() else 0)


def test_progress_is_not_fsynced_but_the_run_record_is(tmp_path, monkeypatch):
    """progress.json is rewritten every log window, inside the training loop: an fsync there stalls the loop
    (3.5 ms per write on the 2-core CI VM). It is a hint, so it is renamed into place without one."""
    import os

    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    out = RunOutputs(tmp_path, DistInfo(0, 1, 0, 1, CPU), leader=True)
    out.start(load_config(None, []), "run-1")
    assert synced  # run.json, config.yaml, meta.json are durable
    synced.clear()
    out.progress(5, 0)
    assert synced == [] and json.loads((tmp_path / files.PROGRESS).read_text()) == {"step": 5, "epoch": 0}
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_a_run_json_over_its_cap_is_refused_not_overwritten(tmp_path):
    """A 2 GB sparse run.json was taken as "not a run's": the resume started a new run at step 0 over the old one."""
    with open(tmp_path / files.RUN, "wb") as f:
        f.truncate(2 << 30)
    with pytest.raises(RunDirError) as e:
        write_run_file(tmp_path, "run-2")
    assert str(e.value) == (
        f"'{tmp_path / files.RUN}' is 2,147,483,648 bytes: a run's run.json is about 100; move it away or choose "
        "another run directory"
    )
    assert (tmp_path / files.RUN).stat().st_size == 2 << 30
    (tmp_path / files.RUN).write_text("not json")  # small and not a run's: the run writes its own over it
    write_run_file(tmp_path, "run-2")
    assert read_run_id(tmp_path) == "run-2"
