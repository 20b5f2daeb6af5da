"""Real multi-process runs (torchrun, gloo): exact validation (the quickstart: tests/e2e/test_front_door.py)."""

from __future__ import annotations

import json

import pytest
from support import tiny_config, torchrun

from recipes.evaluation.accuracy import evaluate_checkpoint
from recipes.trainer import train


@pytest.mark.slow
def test_validation_is_exact_for_world_size_not_dividing_val_set(tiny_root, tmp_path):
    train(tiny_config(tiny_root, tmp_path, "phases=[{epochs: 1, image_size: 32, batch_size: 12}]"))
    ckpt = tmp_path / "tiny" / "checkpoint.pt"
    single = evaluate_checkpoint(str(ckpt), str(tiny_root), batch_size=3)
    out = tmp_path / "eval3.json"
    p = torchrun(
        3, ["evaluate.py", str(ckpt), "--data", str(tiny_root), "--batch-size", "3", "--out", str(out)], timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    three = json.loads(out.read_text())
    assert single["count"] == three["count"] == 20  # 20 images over 3 ranks: 7 + 7 + 6, none twice
    assert three["world_size"] == 3
    assert three["top1"] == pytest.approx(single["top1"]) and three["top5"] == pytest.approx(single["top5"])


def test_generation_id_is_the_newest_rendezvous_round_in_the_rendezvous_store(monkeypatch):
    import datetime

    import torch.distributed as td
    from support import free_port

    from recipes.distributed import generation_id

    port = free_port()
    server = td.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # this agent's own count: not what the others have
    monkeypatch.setenv("DAWNBENCH_RDZV_ENDPOINT", f"127.0.0.1:{port}")
    timeout = datetime.timedelta(seconds=10)
    assert generation_id(timeout) == "restart1"  # no round complete yet: the agent's count
    for r in (0, 1, 3):  # round 2 closed without workers (a node joined and left)
        server.set(f"torch.rendezvous.job7.{r}/torchelastic/role_info/0", b"x")
    server.set("torch.rendezvous.other.9/torchelastic/role_info/0", b"x")
    assert generation_id(timeout) == "round3"
