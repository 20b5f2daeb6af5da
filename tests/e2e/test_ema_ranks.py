"""run.ema on 2 ranks: the EMA's BN statistics stay per rank until validation averages them (like the model's), so a
mid-epoch checkpoint keeps every rank's (`ema_bn_per_rank`) and a resume from it ends bit-identical to the
uninterrupted run, EMA included."""

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
def test_two_ranks_resumed_mid_epoch_keep_the_ema_bit_identical(tiny_root, tmp_path):
    ref, resumed = tmp_path / "ref", tmp_path / "resumed"
    two_ranks(ref, tiny_root)
    mid = ckpt.load(ref / "ckpt-00000006.pt")  # epoch 2, step 2 of 4
    assert mid["state"]["epoch_step"] == 2 and len(mid["ema_bn_per_rank"]) == 2
    r0, r1 = mid["ema_bn_per_rank"]
    assert any(not torch.equal(r0[k], r1[k]) for k in r0)  # each rank's EMA averaged its own BN statistics
    assert all(torch.equal(r0[k], mid["ema"][k]) for k in r0)
    assert "ema_bn_per_rank" not in ckpt.load(ref / "ckpt-00000004.pt")  # after validation: averaged, one copy
    two_ranks(resumed, tiny_root, "--resume", str(ref / "ckpt-00000006.pt"))
    a, b = ckpt.load(ref / "ckpt-00000008.pt"), ckpt.load(resumed / "ckpt-00000008.pt")
    for entry in ("model", "ema"):
        assert all(torch.equal(a[entry][k], b[entry][k]) for k in a[entry]), entry
