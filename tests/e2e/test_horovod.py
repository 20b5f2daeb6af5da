"""The Horovod baseline for real, under `horovodrun --gloo` (built by `make horovod`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import ROOT, TINY_CONFIG, horovodrun, needs_horovod


@needs_horovod
def test_horovod_backend_leaves_every_rank_with_the_mean(tmp_path):
    p = horovodrun(2, [str(ROOT / "tests" / "comm_worker.py"), "horovod", str(tmp_path)], timeout=300)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in results:
        assert "exception" not in r, r["exception"] + p.stdout[-2000:]
        assert r["world"] == 2  # torch.distributed was bootstrapped from horovodrun's environment
        assert r["horovod"] < 1e-6
        assert 0 < r["horovod_fp16"] <= 2.0**-9 * r["scale"]


@needs_horovod
@pytest.mark.slow
def test_horovod_trains_two_phases(tmp_path, tiny_root):
    run_dir = tmp_path / "hvd"
    p = horovodrun(
        2,
        [
            "train.py",
            "-c",
            str(TINY_CONFIG),
            "--run-dir",
            str(run_dir),
            f"data.root={tiny_root}",
            "comm.backend=horovod",
            "phases=[{epochs: 1, image_size: 32, batch_size: 12}, {epochs: 1, image_size: 48, batch_size: 12}]",
        ],
        timeout=900,
    )
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == 2 and summary["world_size"] == 2
    rows = (run_dir / "dawnbench.tsv").read_text().splitlines()
    assert len(rows) == 3  # header + two epochs
    assert "allreduce horovod" in p.stdout
    assert p.stdout.count("(20 images)") == 2  # exact evaluation: every validation image once per epoch, 20 on 2 ranks


def test_missing_horovod_says_how_to_install(tmp_path):
    code = (
        "import sys; sys.modules['horovod'] = None; sys.modules['horovod.torch'] = None\n"
        "from recipes.comm.horovod_backend import import_horovod\n"
        "import_horovod()\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "comm.backend=horovod: cannot import horovod.torch" in p.stderr and "make horovod" in p.stderr


def test_horovod_rejects_bf16_wire(tmp_path):
    from base.errors import ConfigError
    from recipes.comm import create_allreduce
    from recipes.config import load_config
    from recipes.distributed import DistInfo

    cfg = load_config(None, ["comm.backend=horovod", "comm.compression=bf16"])
    with pytest.raises(ConfigError, match="comm.compression: horovod supports 'none' or 'fp16'"):
        create_allreduce(cfg.comm, DistInfo(0, 1, 0, 1, None), timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name)
