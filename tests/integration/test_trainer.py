"""The trainer end to end on CPU: run directory contents, DAWNBench TSV, exact resume, clear errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import yaml
from support import ROOT, tiny_config

from base import registry
from base.errors import CheckpointError, DataError
from recipes.rundir import checkpoint_files as ckpt
from recipes.rundir.outputs import TSV_HEADER
from recipes.trainer import train


def test_run_dir_has_config_meta_tsv_checkpoint_tb(tiny_root, tmp_path):
    cfg = tiny_config(tiny_root, tmp_path, "log.tensorboard=true")
    summary = train(cfg)
    run = tmp_path / "tiny"
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["name"] == "resnet10t"
    meta = json.loads((run / "meta.json").read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert meta["git_commit"].startswith(head)
    lines = (run / "dawnbench.tsv").read_text().splitlines(keepends=True)
    assert lines[0] == TSV_HEADER
    rows = [ln.rstrip("\n").split("\t") for ln in lines[1:]]
    assert [r[0] for r in rows] == ["1", "2"]
    hours = [float(r[1]) for r in rows]
    assert 0 < hours[0] < hours[1] and hours[1] == pytest.approx(summary["train_seconds"] / 3600, abs=1e-6)
    assert summary["wall_seconds"] >= summary["train_seconds"]  # validation/checkpoints excluded from hours
    assert float(rows[-1][2]) == pytest.approx(summary["final_top1"], abs=0.01)
    assert 0 <= float(rows[-1][2]) <= float(rows[-1][3]) <= 100
    assert summary["steps"] == 2 * 4  # ceil(48 / 12) steps per epoch
    state = ckpt.load(run / "checkpoint.pt")
    assert state["state"]["epoch"] == 2 and state["state"]["step"] == 8
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run / "tb"))
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/images_per_s", "val/top1", "val/top5"} <= tags
    assert len(ea.Scalars("val/top1")) == 2


def test_interrupted_and_resumed_run_matches_uninterrupted(tiny_root, tmp_path):
    # Dropout draws from torch's global RNG every step: the resumed run matches only if the checkpoint's RNG states
    # are restored (with drop_rate 0 nothing in the tiny run consumes it, and a resume that skips the restore passed).
    over = ("run.deterministic=true", "model.drop_rate=0.5", "phases=[{epochs: 3, image_size: 32, batch_size: 12}]")
    full = train(tiny_config(tiny_root, tmp_path / "a", *over))
    first = train(tiny_config(tiny_root, tmp_path / "b", *over), stop_after_epochs=1)
    assert first["epochs"] == 1
    # The plan is recorded beside what ran, so a stopped run reads as partial (summary.json, compare_runs).
    written = json.loads((tmp_path / "b" / "tiny" / "summary.json").read_text())
    assert (written["planned_epochs"], written["planned_steps"], written["partial"]) == (3, full["steps"], True)
    resumed = train(tiny_config(tiny_root, tmp_path / "b", *over))  # same run dir: continues
    assert resumed["epochs"] == 3 and resumed["steps"] == full["steps"]
    assert (resumed["planned_epochs"], resumed["partial"]) == (3, False)
    a = ckpt.load(tmp_path / "a" / "tiny" / "checkpoint.pt")
    b = ckpt.load(tmp_path / "b" / "tiny" / "checkpoint.pt")
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    assert a["state"]["history"][-1]["top1"] == b["state"]["history"][-1]["top1"]
    mom_a = a["optimizer"]["state"][0]["momentum_buffer"]
    assert torch.equal(mom_a, b["optimizer"]["state"][0]["momentum_buffer"])


def test_checkpoint_is_written_atomically(tmp_path):
    path = tmp_path / "c.pt"
    ckpt.save_atomic({"model": {"w": torch.ones(2)}}, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt", "c.pt.sha256"]  # no temp file left behind
    assert torch.equal(ckpt.load(path)["model"]["w"], torch.ones(2))


def test_checkpoint_from_different_model_is_refused(tiny_root, tmp_path):
    train(tiny_config(tiny_root, tmp_path, "phases=[{epochs: 1, image_size: 32, batch_size: 12}]"))
    other = tiny_config(tiny_root, tmp_path, "model.name=resnet18")
    with pytest.raises(
        CheckpointError,
        match=r"differs from the checkpoint's in what it trains:\n  model.name: "
        r"'resnet10t' -> 'resnet18'",
    ):
        train(other)
    forced = tiny_config(tiny_root, tmp_path, "model.name=resnet18", "checkpoint.resume=force")
    with pytest.raises(CheckpointError, match="checkpoint was made for a different model"):
        train(forced)


def test_damaged_checkpoint_gives_clear_error(tmp_path):
    bad = tmp_path / "checkpoint.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot be read"):
        ckpt.load(bad)


def test_missing_dataset_and_empty_class_folder(tiny_root, tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        train(tiny_config(tmp_path / "nowhere", tmp_path))
    broken = tmp_path / "broken"
    shutil.copytree(tiny_root, broken)
    empty = broken / "train" / "n09999999"
    empty.mkdir()
    with pytest.raises(DataError, match="n09999999' is empty"):
        train(tiny_config(broken, tmp_path))


def test_cli_bad_inputs_exit_2_without_traceback(tiny_root, tmp_path):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("optim: {lr: 0.1\n")
    cases = [
        (["-c", str(bad_yaml)], "not valid YAML"),
        (["-c", "configs/quickstart.yaml", f"data.root={tmp_path}/none"], "does not exist"),
        (["-c", "configs/quickstart.yaml", f"data.root={tiny_root}", "--resume", str(tmp_path / "x.pt")], "not found"),
    ]
    for args, msg in cases:
        p = subprocess.run(
            [sys.executable, "train.py", *args, f"run.out_dir={tmp_path}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 2, (args, p.stderr)
        assert msg in p.stderr and "Traceback" not in p.stderr, p.stderr


# Optimizers that skip a non-finite step on the device (the others decide on the host, by their record): the first
# that reads its lr and momentum on the host and the first that takes them as device tensors, each under two
# precisions.
_SKIP_ON_DEVICE = [r for r in registry.OPTIMIZERS.values() if r.skips_on_device]
_HOST_HPARAMS = next(r.name for r in _SKIP_ON_DEVICE if not r.tensor_hparams)
_TENSOR_HPARAMS = next(r.name for r in _SKIP_ON_DEVICE if r.tensor_hparams)


@pytest.mark.parametrize(
    "optim,amp",
    [(_HOST_HPARAMS, "none"), (_TENSOR_HPARAMS, "none"), (_TENSOR_HPARAMS, "fp16"), (_HOST_HPARAMS, "bf16")],
)
def test_training_steps_read_nothing_back_from_the_device(tiny_root, tmp_path, optim, amp):
    """No host-device sync inside a step (a GPU would stall): the finite check is settled every log.every_steps."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from recipes.trainer import Trainer

    class Reads(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:  # .item(), bool(), float() of a tensor
                Reads.n += 1
            return func(*args, **(kwargs or {}))

    cfg = tiny_config(
        tiny_root, tmp_path, f"optim.name={optim}", f"run.amp={amp}", "log.every_steps=100", "checkpoint.enabled=false"
    )
    trainer = Trainer(cfg)
    try:
        x, y = next(iter(trainer.data.train_batches(trainer.plan.epoch_info(0))))
        with Reads():
            for _ in range(3):
                trainer.steps(x, y, trainer.state)
        assert Reads.n == 0 and len(trainer.steps.pending) == 3
        trainer.steps.settle(trainer.state, trainer.log)
        assert trainer.steps.pending == [] and trainer.state.skipped_steps == 0
    finally:
        trainer.close()


def test_dali_resume_matches_uninterrupted(tiny_root, tmp_path):
    """DALI's crops and flips come from one random stream per pipeline: a resume must draw the same numbers."""
    over = ("data.backend=dali", "run.deterministic=true", "phases=[{epochs: 2, image_size: 32, batch_size: 12}]")
    train(tiny_config(tiny_root, tmp_path / "a", *over))
    train(tiny_config(tiny_root, tmp_path / "b", *over), stop_after_epochs=1)
    resumed = train(tiny_config(tiny_root, tmp_path / "b", *over))  # a new pipeline, mid-phase
    assert resumed["epochs"] == 2
    a = ckpt.load(tmp_path / "a" / "tiny" / "checkpoint.pt")
    b = ckpt.load(tmp_path / "b" / "tiny" / "checkpoint.pt")
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k


def test_input_pipeline_build_counts_as_training_time(tiny_root, tmp_path):
    """DAWNBench hours include building the input pipeline at each epoch/phase start (DALI builds one per phase)."""
    import time

    from recipes.trainer import Trainer

    cfg = tiny_config(
        tiny_root, tmp_path, "phases=[{epochs: 2, image_size: 32, batch_size: 12}]", "checkpoint.enabled=false"
    )
    trainer = Trainer(cfg)
    real = trainer.data.train_batches

    def slow(info, start_step=0):
        time.sleep(1.0)  # a pipeline that takes a second to build
        return real(info, start_step=start_step)

    trainer.data.train_batches = slow
    try:
        summary = trainer.fit()
    finally:
        trainer.close()
    assert summary["train_seconds"] >= 2.0  # two epochs, two builds


def test_a_run_puts_back_the_process_settings_it_changed(tiny_root, tmp_path, monkeypatch, two_layer_model):
    """In-process runs left NCCL_LAUNCH_ORDER_IMPLICIT, torch's thread count and deterministic algorithms set for
    whatever the process ran next (every later test)."""
    from recipes.comm import process_env

    cfg = tiny_config(
        tiny_root,
        tmp_path,
        "comm.backend=multistream",
        "run.threads=1",
        "run.deterministic=true",
        f"model.name={two_layer_model}",
        "phases=[{epochs: 1, image_size: 32, batch_size: 24}]",
    )
    monkeypatch.delenv("NCCL_LAUNCH_ORDER_IMPLICIT", raising=False)
    assert process_env(cfg.comm) == {"NCCL_LAUNCH_ORDER_IMPLICIT": "1"}  # what the run sets
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        train(cfg)
        assert "NCCL_LAUNCH_ORDER_IMPLICIT" not in os.environ
        assert torch.get_num_threads() == 2 and not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.set_num_threads(before)
