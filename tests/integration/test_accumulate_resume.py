"""Gradient accumulation in the trainer: checkpoints fall on optimizer-step boundaries only, so a run interrupted
between two micro-batches resumes from the last whole step and ends bit-identical to an uninterrupted run."""

from __future__ import annotations

import pytest
import torch
from support import FOLDER_PIPELINES, tiny_config

import recipes.step_builder
from recipes.rundir import checkpoint_files as ckpt
from recipes.trainer import train

# 48 images, global batch 12, 1 process: 4 steps per epoch, each 3 micro-batches of 4 images
ACC = (
    "run.deterministic=true",
    "phases=[{epochs: 2, image_size: 32, batch_size: 12}]",
    "run.accumulate=3",
    "checkpoint.every_steps=1",
    "checkpoint.keep=100",
)


class _Interrupted(Exception):
    pass


def _criterion_failing_at(call: int):
    """create_criterion, but the `call`-th micro-batch's loss raises (the process dies mid-accumulation)."""
    make = recipes.step_builder.create_criterion
    calls = {"n": 0}

    def create(cfg):
        inner = make(cfg)

        def loss(logits, y):
            calls["n"] += 1
            if calls["n"] == call:
                raise _Interrupted(f"micro-batch {call}")
            return inner(logits, y)

        return loss

    return create


@pytest.mark.parametrize("backend", FOLDER_PIPELINES)
def test_a_run_interrupted_mid_accumulation_resumes_exactly(tiny_root, tmp_path, monkeypatch, backend):
    over = (*ACC, f"data.backend={backend}")
    full = train(tiny_config(tiny_root, tmp_path / "a", *over))
    assert full["steps"] == 8
    with monkeypatch.context() as m:
        m.setattr(recipes.step_builder, "create_criterion", _criterion_failing_at(5 * 3 + 2))  # step 6, 2nd of 3
        with pytest.raises(_Interrupted):
            train(tiny_config(tiny_root, tmp_path / "b", *over))
    b = tmp_path / "b" / "tiny"
    assert ckpt.load(b / "checkpoint.pt")["state"]["step"] == 5  # the last whole optimizer step
    resumed = train(tiny_config(tiny_root, tmp_path / "b", *over))
    assert resumed["steps"] == 8
    wa = ckpt.load(tmp_path / "a" / "tiny" / "ckpt-00000008.pt")
    wb = ckpt.load(b / "ckpt-00000008.pt")
    assert all(torch.equal(wa["model"][k], wb["model"][k]) for k in wa["model"])
    mom = wa["optimizer"]["state"][0]["momentum_buffer"]
    assert torch.equal(mom, wb["optimizer"]["state"][0]["momentum_buffer"])
