"""2 ranks resumed mid-epoch: each rank's BN running statistics, the model's and run.ema's, are its own until
validation averages them, so a mid-epoch checkpoint keeps every rank's (`bn_per_rank`, `ema_bn_per_rank`) and a
resume from it ends bit-identical to the uninterrupted run, EMA included (rank 0's statistics alone gave weights
~5e-2 apart)."""

from __future__ import annotations

import pytest
import torch
from support import TINY_OVERRIDES, torchrun

from recipes.rundir import checkpoint_files as ckpt

RUN = [
    "-c",
    "configs/base.yaml",
    *TINY_OVERRIDES,
    "run.deterministic=true",
    "run.ema=true",
    "run.ema_decay=0.7",
    "checkpoint.every_steps=1",
    "checkpoint.keep=30",
    "phases=[{epochs: 2, image_size: 32, batch_size: 12}]",
]


def two_ranks(run_dir, data, *extra: str) -> None:
    p = torchrun(2, ["train.py", "--run-dir", str(run_dir), *RUN, f"data.root={data}", *extra])
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]


@pytest.mark.slow
def test_two_ranks_resumed_mid_epoch_end_bit_identical_ema_included(tiny_root, tmp_path):
    ref, resumed = tmp_path / "ref", tmp_path / "resumed"
    two_ranks(ref, tiny_root)
    mid = ckpt.load(ref / "ckpt-00000006.pt")  # epoch 2, step 2 of 4
    assert len(mid["bn_per_rank"]) == 2
    r0, r1 = mid["bn_per_rank"]
    assert r0.keys() == r1.keys() and any(not torch.equal(r0[k], r1[k]) for k in r0)  # the ranks' stats differ
    assert all(torch.equal(r0[k], mid["model"][k]) for k in r0)
    assert "bn_per_rank" not in ckpt.load(ref / "ckpt-00000004.pt")  # after validation: averaged, one copy
    assert mid["state"]["epoch_step"] == 2 and len(mid["ema_bn_per_rank"]) == 2
    r0, r1 = mid["ema_bn_per_rank"]
    assert any(not torch.equal(r0[k], r1[k]) for k in r0)  # each rank's EMA averaged its own BN statistics
    assert all(torch.equal(r0[k], mid["ema"][k]) for k in r0)
    assert "ema_bn_per_rank" not in ckpt.load(ref / "ckpt-00000004.pt")  # after validation: averaged, one copy
    two_ranks(resumed, tiny_root, "--resume", str(ref / "ckpt-00000006.pt"))
    a, b = ckpt.load(ref / "ckpt-00000008.pt"), ckpt.load(resumed / "ckpt-00000008.pt")
    for entry in ("model", "ema"):
        assert all(torch.equal(a[entry][k], b[entry][k]) for k in a[entry]), entry
