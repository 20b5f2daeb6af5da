"""scripts/compare_runs.py on real run directories: the table's numbers against the runs' own logs, and the plot."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import pytest
from PIL import Image
from support import ROOT, TINY_OVERRIDES, free_port, horovodrun, needs_horovod, tiny_config, torchrun

from models import create_model
from recipes.comm.stats import CommStats
from recipes.config import ModelConfig
from recipes.trainer import train
from scripts import compare_runs

HORIZON = "phases=[{epochs: 1, image_size: 32, batch_size: 12}, {epochs: 1, image_size: 48, batch_size: 12}]"
CLI = [*TINY_OVERRIDES, HORIZON]


def _horovod_missing() -> str | None:
    """Why the Horovod comparison cannot run here (None: it can)."""
    if importlib.util.find_spec("horovod") is None:
        return "horovod is not installed (scripts/install_horovod.sh builds it)"
    return None


HOROVOD_MISSING = _horovod_missing()


@pytest.fixture(scope="module")
def runs(tiny_root, tmp_path_factory):
    """A single-process run (in this process) and a 2-process run (torchrun) of the same tiny recipe."""
    base = tmp_path_factory.mktemp("compare")
    single = base / "single"
    train(tiny_config(tiny_root, base, HORIZON), run_dir=single)
    double = base / "double"
    p = torchrun(
        2,
        ["train.py", "-c", "configs/base.yaml", "--run-dir", str(double), f"data.root={tiny_root}", *CLI],
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    (double / "console.log").write_text(p.stdout)
    return single, double


def table_rows(text: str) -> dict[str, dict[str, str]]:
    """{run: {column: cell}} for both Markdown tables of the report."""
    out: dict[str, dict[str, str]] = {}
    header = None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if header is None:
            header = cells
        elif not set(line) <= set("|-: "):
            out.setdefault(cells[0], {}).update(zip(header[1:], cells[1:], strict=True))
    return out


def first_hit_seconds(run_dir, metric: str, threshold: float) -> tuple[float, int]:
    """From the DAWNBench TSV (hours, cumulative training time): the first epoch at the threshold."""
    for line in (run_dir / "dawnbench.tsv").read_text().splitlines()[1:]:
        epoch, hours, top1, top5 = line.split("\t")
        if float({"top1": top1, "top5": top5}[metric]) >= threshold:
            return float(hours) * 3600, int(epoch)
    raise AssertionError("target not reached")


def test_table_numbers_match_the_runs_logs_and_the_plot_is_a_png(runs, tmp_path, capsys):
    single, double = runs
    png = tmp_path / "cmp.png"
    assert compare_runs.main([str(double), str(single), "--plot", str(png), "--markdown", str(tmp_path / "t.md")]) == 0
    text = capsys.readouterr().out
    rows = table_rows(text)
    s1 = json.loads((single / "summary.json").read_text())
    s2 = json.loads((double / "summary.json").read_text())
    d, o = rows["double"], rows["single"]
    assert (d["processes"], o["processes"], d["backend"]) == ("2", "1", "ddp")
    # Default target (no target in the config): top-5 >= 93; with 4 classes it is reached at epoch 1.
    assert d["target"] == "top5 >= 93%"
    for row, run_dir in ((d, double), (o, single)):
        seconds, epoch = first_hit_seconds(run_dir, "top5", 93.0)
        value, at = re.fullmatch(r"([\d.]+) s \(epoch (\d+)\)", row["time to target"]).groups()
        assert float(value) == pytest.approx(seconds, abs=0.06) and int(at) == epoch
    assert d["total time"] == f"{s2['wall_seconds']:.1f} s"
    assert d["images/s"] == f"{s2['images_per_s']:.1f}" and o["images/s"] == f"{s1['images_per_s']:.1f}"
    assert d["images/s per process"] == f"{s2['images_per_s'] / 2:.1f}"
    # The trainer's own console summary of the 2-process run says the same.
    log = (double / "console.log").read_text()
    assert re.search(r"\| images/s \(training\)\s+\| (\S+) \|", log).group(1) == d["images/s"]
    assert d["scaling efficiency"] == f"{100 * s2['images_per_s'] / (2 * s1['images_per_s']):.1f}%"
    assert o["scaling efficiency"] == "100.0%"
    # ddp times its allreduce through its comm hook (CommStats in summary.json); one process reduces nothing.
    comm = s2["comm"]
    assert comm["backend"] == "ddp" and comm["steps"] == s2["steps"] and comm["comm_seconds"] > 0
    assert d["comm per step"] == f"{1000 * comm['comm_seconds'] / comm['steps']:.1f} ms"
    assert o["comm per step"] == o["comm share"] == "n/a"
    assert d["final top-1 / top-5"] == f"{s2['final_top1']:.2f}% / {s2['final_top5']:.2f}%"
    # Per-phase images/s: one epoch per phase here, so each equals the epoch line the trainer printed.
    epoch_ips = re.findall(r"^epoch \d/2  val .* ([\d.]+) img/s$", log, re.M)
    assert [d["phase 0 (32 px)"], d["phase 1 (48 px)"]] == epoch_ips
    assert (tmp_path / "t.md").read_text().strip() == text.split("\n\nplot:")[0].strip()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(png) as img:
        img.verify()
    with Image.open(png) as img:
        assert img.size[0] > 800 and img.size[1] > 300


def test_explicit_target_and_communication_counters(runs, tmp_path, capsys):
    """The backend's CommStats become time per step and share of the step; an unreachable target says so."""
    _, double = runs
    assert compare_runs.main([str(double), "--target", "top1=101", "--plot", str(tmp_path / "p.png")]) == 0
    row = table_rows(capsys.readouterr().out)["double"]
    summary = json.loads((double / "summary.json").read_text())
    stats = CommStats.from_dict(summary["comm"])
    step = summary["train_seconds"] / summary["steps"]
    assert 0 < stats.comm_seconds_per_step < step  # the window lies inside the step
    assert row["comm per step"] == f"{1000 * stats.comm_seconds_per_step:.1f} ms"
    assert row["comm share"] == f"{100 * stats.comm_seconds_per_step / step:.1f}%"
    assert row["time to target"] == "not reached" and row["target"] == "top1 >= 101%"
    assert row["scaling efficiency"] == "n/a"  # no single-process run among the arguments
    # The gradients of every step went through the allreduce, in fp32: the model's parameter bytes per step.
    model_bytes = 4 * sum(p.numel() for p in create_model(ModelConfig(name="resnet10t"), 4).parameters())
    assert stats.bytes_per_step == model_bytes and stats.bytes == model_bytes * stats.steps


def test_comm_stats_round_trip_and_old_summaries():
    stats = CommStats("multistream", steps=4, comm_seconds=0.2, wait_seconds=0.05, bytes=400, settings={"streams": 2})
    d = json.loads(json.dumps(stats.to_dict()))
    assert d["comm_seconds_per_step"] == pytest.approx(0.05) and d["bytes_per_step"] == 100
    assert CommStats.from_dict(d) == stats
    assert CommStats.from_dict({}) is None and CommStats.from_dict({"comm/sync_ms": 3.0}) is None
    assert CommStats("ddp").comm_seconds_per_step is None


def _backend_run(base, tiny_root, backend: str):
    """The 2-process tiny recipe with `backend`: torchrun, or horovodrun for horovod."""
    run_dir = base / backend
    args = [
        "train.py",
        "-c",
        "configs/base.yaml",
        "--run-dir",
        str(run_dir),
        f"data.root={tiny_root}",
        *CLI,
        f"comm.backend={backend}",
        "comm.tune_cache=null",
    ]
    p = horovodrun(2, args, timeout=600) if backend == "horovod" else torchrun(2, args, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["multistream", pytest.param("horovod", marks=needs_horovod)])
def test_every_backend_fills_the_comm_columns(runs, tiny_root, tmp_path, backend, capsys):
    """Real 2-process runs: ddp (the fixture), multistream and horovod each report their own comm time."""
    _, ddp_dir = runs
    other = _backend_run(tmp_path, tiny_root, backend)
    assert compare_runs.main([str(ddp_dir), str(other), "--plot", str(tmp_path / "c.png")]) == 0
    rows = table_rows(capsys.readouterr().out)
    for name, run_dir in (("double", ddp_dir), (backend, other)):
        s = json.loads((run_dir / "summary.json").read_text())
        stats = CommStats.from_dict(s["comm"])
        step = s["train_seconds"] / s["steps"]
        assert stats.backend == s["comm_backend"] == rows[name]["backend"]
        assert stats.steps == s["steps"] and 0 < stats.comm_seconds_per_step < step
        assert rows[name]["comm per step"] == f"{1000 * stats.comm_seconds_per_step:.1f} ms"
        assert rows[name]["comm share"] == f"{100 * stats.comm_seconds_per_step / step:.1f}%"
        if name != "double":
            assert 0 <= stats.wait_seconds <= stats.comm_seconds and stats.bytes > 0


def test_bad_arguments_are_named(tmp_path):
    p = subprocess.run(
        [sys.executable, "scripts/compare_runs.py", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2
    assert f"compare_runs: error: {tmp_path}: no summary.json (not a run directory" in p.stderr
    with pytest.raises(compare_runs.CompareError, match="--target 'top3=1': expected top1=N and/or top5=N"):
        compare_runs.parse_target("top3=1")


@pytest.mark.slow
@pytest.mark.skipif(HOROVOD_MISSING is not None, reason=HOROVOD_MISSING or "")
def test_horovod_baseline_against_multistream(tmp_path, tiny_root):
    """The baseline comparison through the launcher: Horovod (horovodrun --gloo, 2 processes) against multistream
    (two local hosts), on the tiny recipe with a target every run reaches in its first epoch (the mechanics: launch
    engines, the table's time to target and rates from each run's own logs; the quickstart's accuracy is
    tests/e2e/test_distributed.py's)."""
    pytest.importorskip("horovod.torch", reason="horovod is installed but horovod.torch does not load")

    common = [
        "--transport",
        "local",
        "--timeout",
        "800",
        "-c",
        "configs/base.yaml",
        f"data.root={tiny_root}",
        *CLI,
        "run.target_top5=100",  # 4 classes: the top 5 hold every class, so every run reaches it in epoch 1
        "run.stop_at_target=true",
    ]
    hvd_dir, ms_dir = tmp_path / "horovod", tmp_path / "multistream"
    launch = [sys.executable, "scripts/launch.py"]
    p = subprocess.run(
        [
            *launch,
            "--engine",
            "horovod",
            "--hosts",
            "localhost:2",
            "--port",
            str(free_port()),
            "--run-dir",
            str(hvd_dir),
            *common,
            "comm.backend=horovod",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    hosts = tmp_path / "hosts"
    hosts.write_text("host-a addr=127.0.0.1\nhost-b addr=127.0.0.1\n")
    q = subprocess.run(
        [
            *launch,
            "--hostfile",
            str(hosts),
            "--gpus-per-host",
            "1",
            "--port",
            str(free_port()),
            "--run-dir",
            str(ms_dir),
            *common,
            "comm.backend=multistream",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert q.returncode == 0, q.stdout[-3000:] + q.stderr[-3000:]
    png = tmp_path / "hvd.png"
    r = subprocess.run(
        [sys.executable, "scripts/compare_runs.py", str(ms_dir), str(hvd_dir), "--plot", str(png)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    rows = table_rows(r.stdout)
    for run, run_dir in ((q, ms_dir), (p, hvd_dir)):
        name, log = run.args[-1].removeprefix("comm.backend="), run.stdout  # the backend the run was launched with
        s = json.loads((run_dir / "summary.json").read_text())
        row = rows[name]
        assert row["backend"] == name and row["processes"] == "2"
        assert row["target"] == "top5 >= 100%"  # the runs' own target
        seconds, epoch = first_hit_seconds(run_dir, "top5", 100.0)
        value, at = re.fullmatch(r"([\d.]+) s \(epoch (\d+)\)", row["time to target"]).groups()
        assert float(value) == pytest.approx(seconds, abs=0.06) and int(at) == epoch
        assert row["images/s"] == f"{s['images_per_s']:.1f}"
        assert re.search(r"\| images/s \(training\)\s+\| (\S+) \|", log).group(1) == row["images/s"]
    with Image.open(png) as img:
        img.verify()
