"""scripts/gpu_check/ without a GPU: its three outcomes from faked driver and CUDA states, and every way it once
passed without testing (a reused run directory, a world of one, a threshold never compared, a hung subprocess left
running, bf16 on a GPU without it, graphs never counted), each shown to give a fail row and exit 1 now."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from support import ROOT

from base import registry
from scripts.gpu_check import gpu_check
from scripts.gpu_check import gpu_check_env as env
from scripts.gpu_check import gpu_check_runs as runs
from scripts.gpu_check import gpu_check_steps as steps
from scripts.gpu_check.gpu_check_rows import failed, guard, judged, markdown_table, row

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the check would run")


# --- outcome 1 and 2: no GPU, a GPU torch cannot use ---------------------------------------------------------------
def _fake_smi(tmp_path: Path, line: str | None) -> dict:
    """An environment whose PATH has an `nvidia-smi` printing `line` (None: one that fails, as with no driver)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{line}'\n" if line else "#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    smi.chmod(0o755)
    return {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}


def _run(args, env_=None):
    cmd = [sys.executable, "-m", "scripts.gpu_check.gpu_check", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env_, cwd=ROOT)


@no_gpu
def test_no_gpu_prints_one_line_and_exits_0(tmp_path):
    out = tmp_path / "gpu.json"
    p = _run(["--out", str(out)], _fake_smi(tmp_path, None))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines() == [env.NO_GPU]
    assert not out.exists()  # nothing ran, nothing written


@no_gpu
def test_a_gpu_torch_cannot_use_is_a_failure_naming_driver_cuda_and_fix(tmp_path):
    """The driver lists a GPU but torch.cuda cannot start: before, 'no CUDA GPU present' and exit 0."""
    p = _run(["--out", str(tmp_path / "gpu.json")], _fake_smi(tmp_path, "Tesla V100-SXM2-16GB, 535.104.05"))
    assert p.returncode == 1, p.stdout + p.stderr
    [line] = p.stdout.strip().splitlines()
    assert "Tesla V100-SXM2-16GB" in line and "driver 535.104.05" in line
    if torch.version.cuda and torch.version.cuda.startswith("13"):
        assert "CUDA 13.0, which needs driver >= 580.65.06" in line
        assert "make install CUDA=cu126" in line


def test_classify_every_state():
    drv = lambda v: env.Driver(v, ["NVIDIA A100-SXM4-80GB"])  # noqa: E731
    assert env.classify(True, "2.14.1", "13.0", None, "").kind == "run"
    assert env.classify(False, "2.14.1", "13.0", None, "") == env.Outcome("none", env.NO_GPU)
    assert env.classify(False, "2.14.1", "13.0", env.Driver("580.1", []), "").kind == "none"
    old = env.classify(False, "2.14.1+cu130", "13.0", drv("550.54.15"), "driver too old")
    assert old.kind == "unusable" and old.exit_code == 1
    assert "driver 550.54.15" in old.line and "CUDA 13.0" in old.line and "make install CUDA=cu126" in old.line
    ancient = env.classify(False, "2.14.1+cu126", "12.6", drv("470.82.01"), "")
    assert "update the NVIDIA driver to >= 525.60.13" in ancient.line and "CUDA=cu126" not in ancient.line
    too_old_for_both = env.classify(False, "2.14.1+cu130", "13.0", drv("470.82.01"), "")
    assert "update the NVIDIA driver to >= 580.65.06" in too_old_for_both.line
    cpu_only = env.classify(False, "2.14.1+cpu", None, drv("580.65.06"), "")
    assert cpu_only.kind == "unusable" and "CPU-only build" in cpu_only.line
    busy = env.classify(False, "2.14.1", "13.0", drv("580.95.05"), "CUDA error: all CUDA-capable devices are busy\nx")
    assert busy.kind == "unusable" and "all CUDA-capable devices are busy" in busy.line and "\n" not in busy.line


def test_driver_from_proc_without_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    (tmp_path / "gpus" / "0000:3b:00.0").mkdir(parents=True)
    (tmp_path / "version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\nGCC version: 12\n"
    )
    (tmp_path / "gpus" / "0000:3b:00.0" / "information").write_text("Model: \t\t Tesla T4\nIRQ: 1\n")
    assert env.read_driver(tmp_path) == env.Driver("535.104.05", ["Tesla T4"])
    assert env.read_driver(tmp_path / "missing") is None


# --- a run, with the GPU faked ------------------------------------------------------------------------------------
@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(env, "probe", lambda: env.Outcome("run"))
    monkeypatch.setattr(gpu_check, "probe", lambda: env.Outcome("run"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (8, 0))


def test_a_failed_row_exits_1_and_every_row_prints_its_threshold(fake_gpu, monkeypatch, tmp_path, capsys):
    def checks(rows, work, steps_, gpus, profile, parts):
        slow = steps.StepTiming([90.0, 91.0, 89.0], [100.0, 100.0, 100.0], kernel_ms=1.5)  # 10% slower than bare
        rows.append(steps.step_row("train step x", slow, 256))
        profile["rates"].append({"image_size": 96, "batch_size": 256, "images_per_s": 90.0})

    monkeypatch.setattr(gpu_check, "run_checks", checks)
    out = tmp_path / "g.json"
    assert gpu_check.main(["--out", str(out), "--work", str(tmp_path / "w")]) == 1
    report = json.loads(out.read_text())
    first, whole = report["rows"]
    assert first["result"] == "fail: 10 > 3" and first["threshold"] == "<= 3 % slower than bare loop"
    assert "trainer 90 img/s per GPU (rounds 89-91)" in first["reference"]
    assert "GPU kernels 1.5 of 2560.0 ms per step" in first["reference"]
    assert whole["name"] == "the whole check" and whole["result"] == "pass" and whole["threshold"] == "<= 480 s"
    table = capsys.readouterr().out
    assert "| train step x | fail: 10 > 3 | 10 | % slower than bare loop | <= 3 % slower than bare loop |" in table
    profile = json.loads((tmp_path / "gpu_profile.json").read_text())
    assert set(profile) == {"gpu", "torch", "date", "commit", "model", "channels_last", "dtype", "rates"}
    assert profile["gpu"] == "NVIDIA A100-SXM4-80GB" and profile["model"] == "resnet50_tweaked"
    assert profile["channels_last"] is True and profile["dtype"] == "fp16"
    assert profile["rates"] == [{"image_size": 96, "batch_size": 256, "images_per_s": 90.0}]
    assert time.strptime(profile["date"], "%Y-%m-%d")


def test_a_rerun_into_the_same_work_starts_from_nothing(fake_gpu, monkeypatch, tmp_path):
    seen = []

    def checks(rows, work, steps_, gpus, profile, parts):
        seen.append((work, sorted(work.iterdir())))
        runs.fresh(work / "run-ddp").mkdir()  # what a run leaves behind
        rows.append(judged("x", 1.0, "", at_least=1.0))

    monkeypatch.setattr(gpu_check, "run_checks", checks)
    for _ in range(2):
        assert gpu_check.main(["--out", str(tmp_path / "g.json"), "--work", str(tmp_path / "w")]) == 0
    (a, before_a), (b, before_b) = seen
    assert a != b and a.parent == b.parent == tmp_path / "w"
    assert before_a == before_b == []  # the second run found none of the first one's files
    with pytest.raises(RuntimeError, match="exists already"):
        runs.fresh(a / "run-ddp")


def test_every_run_is_new_engaged_and_on_its_own_port(tmp_path):
    over = runs.train_overrides(tmp_path / "sample", tmp_path / "run")
    assert "checkpoint.resume=false" in over and "comm.engage_single_rank=true" in over
    (c1, p1), (c2, p2) = runs.torchrun(1, "a"), runs.torchrun(1, "b")
    assert f"127.0.0.1:{p1}" in c1 and "--standalone" not in c1
    assert p1 != p2 or c1 != c2


def _summary(run_dir: Path, **kw) -> None:
    s = {
        "epochs": 3,
        "history": [{}, {}, {}],
        "restarts": 0,
        "world_size": 1,
        "images_per_s": 900.0,
        "final_top1": 60.0,
        "comm": {"backend": "ddp", "steps": 36, "bytes": 36 * 46_000_000},
    }
    s.update(kw)
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps(s))


def test_a_world_of_one_that_moved_nothing_fails(tmp_path):
    log = tmp_path / "log"
    log.write_text("")
    _summary(tmp_path / "ok")
    ok = runs.judge_run("r", tmp_path / "ok", log, 0, transport="nccl", classes=10)
    assert ok["result"] == "pass" and ok["threshold"] == ">= 20 % top-1" and "nccl moved 1,579.3 MB" in ok["reference"]
    _summary(tmp_path / "idle", comm={"backend": "ddp", "steps": 0, "bytes": 0})  # the old world-of-one summary
    idle = runs.judge_run("r", tmp_path / "idle", log, 0, transport="nccl", classes=10)
    assert idle["result"] == "fail: moved 0 bytes over nccl: the backend was never engaged"
    _summary(tmp_path / "resumed", history=[{}], restarts=1)
    assert runs.judge_run("r", tmp_path / "resumed", log, 0, transport="nccl", classes=10)["result"].startswith(
        "fail: trained 1 of 3"
    )
    _summary(tmp_path / "chance", final_top1=12.0)
    assert runs.judge_run("r", tmp_path / "chance", log, 0, transport="nccl", classes=10)["result"] == "fail: 12 < 20"
    _summary(tmp_path / "untuned")
    tuned = runs.judge_run("r", tmp_path / "untuned", log, 0, transport="nccl", classes=10, tuned=True)
    assert tuned["result"] == "fail: comm.autotune=true but the tuner measured no candidate"
    assert runs.judge_run("r", tmp_path / "none", log, 3, transport="nccl", classes=10)["result"].startswith(
        "fail: exit 3"
    )


def test_thresholds_can_fail():
    assert steps.step_row("s", steps.StepTiming([97.5], [100.0]), 256)["result"] == "pass"
    assert steps.step_row("s", steps.StepTiming([96.0], [100.0]), 256)["result"] == "fail: 4 > 3"


def test_the_overhead_is_judged_on_paired_rounds():
    """A drift that slows both sides of a round cancels: the medians of each side alone would show 9%."""
    t = steps.StepTiming(ours=[100.0, 90.0, 80.0, 99.0, 89.0], bare=[101.0, 91.0, 81.0, 100.0, 90.0])
    assert round(t.overhead_pct, 2) == 1.1 and t.rate == 90.0 and t.bare_rate == 91.0
    assert steps.step_row("s", t, 256)["result"] == "pass"
    slower = steps.StepTiming(ours=[95.0, 96.0, 94.0], bare=[100.0, 100.0, 100.0])
    assert steps.step_row("s", slower, 256)["result"] == "fail: 5 > 3"


def test_parts_bring_what_they_need(fake_gpu, monkeypatch, tmp_path, capsys):
    assert gpu_check.with_needs(["eval"]) == ["e2e", "eval"]
    assert gpu_check.with_needs(["dali", "allreduce"]) == ["steps", "dali", "allreduce"]
    assert gpu_check.with_needs(list(gpu_check.PARTS)) == list(gpu_check.PARTS)
    ran = []
    monkeypatch.setattr(gpu_check, "run_checks", lambda rows, work, s, g, profile, parts: ran.append(parts))
    assert gpu_check.main(["--out", str(tmp_path / "g.json"), "--parts", "steps"]) == 0
    report = json.loads((tmp_path / "g.json").read_text())
    assert ran == [["steps"]] and report["parts"] == ["steps"]
    assert report["rows"][-1]["name"] == "the check's parts: steps"
    assert "; parts: steps" in capsys.readouterr().out
    assert judged("w", 2e-3, "max |w| diff", at_most=1e-4)["result"] == "fail: 0.002 > 0.0001"
    assert judged("w", float("nan"), "x", at_most=1.0)["result"] == "fail: no number"
    assert judged("w", 0.0, "x", at_most=1.0, why="moved 0 bytes")["result"] == "fail: moved 0 bytes"
    with pytest.raises(ValueError, match="threshold"):
        judged("w", 1.0, "x")
    assert runs.moved({"bytes": 0, "steps": 0}, "gloo")[0].startswith("moved 0 bytes")


def test_the_json_is_written_after_every_part_and_every_capture_case(fake_gpu, monkeypatch, tmp_path):
    """A run cut off (the device call's time limit) keeps the rows it had: --out is rewritten after each part, and
    after each case of `capture`, marked incomplete until the check ends."""
    from scripts.gpu_check import gpu_check_capture

    out, seen = tmp_path / "g.json", []

    def cases(rows, write, allow_skip=False):
        for case in ("phases", "optimizers"):
            rows.append(judged(f"capture {case}", 1.0, "s", at_most=60.0))
            write()
            seen.append(json.loads(out.read_text()))

    monkeypatch.setattr(gpu_check_capture, "check_capture", cases)
    assert gpu_check.main(["--out", str(out), "--parts", "capture", "--work", str(tmp_path / "w")]) == 0
    assert [[r["name"] for r in s["rows"]] for s in seen] == [
        ["capture phases"],
        ["capture phases", "capture optimizers"],
    ]
    assert [s["complete"] for s in seen] == [False, False] and seen[0]["parts"] == ["capture"]
    final = json.loads(out.read_text())
    assert final["complete"] is True and final["seconds"] > 0
    assert [r["name"] for r in final["rows"]] == ["capture phases", "capture optimizers", "the check's parts: capture"]


def test_bf16_only_where_native_and_rn50_against_nvidia(fake_gpu, monkeypatch, tmp_path):
    calls, timing = [], steps.StepTiming

    def measure(model, optim, amp, *, size, batch, steps, work):  # measure_step's signature
        calls.append((model, optim, amp, size, batch))
        return timing([1000.0], [1010.0], kernel_ms=2.0)

    monkeypatch.setattr(steps, "measure_step", measure)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Tesla V100-SXM2-16GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (7, 0))
    rows, profile = [], {"dtype": "fp16", "rates": []}
    steps.check_steps(rows, 5, tmp_path, profile)
    assert [c[2] for c in calls] == ["fp16"] * 5  # no bf16 step ran on a V100
    bf16 = [r for r in rows if " bf16 " in r["name"]]
    assert len(bf16) == 2 and all(
        r["result"].startswith("skip: Tesla V100-SXM2-16GB (compute capability 7.0)") for r in bf16
    )
    assert calls[-1] == ("resnet50", "sgd", "fp16", 224, 256)  # NVIDIA's model (v1.5), not resnet50d
    assert rows[-1]["result"] == "fail: 1,000 < 1,080"  # 90% of ~1,200 img/s
    assert [r["image_size"] for r in profile["rates"]] == [96, 128, 224, 288]
    assert [r["batch_size"] for r in profile["rates"]] == [256, 256, 256, 128]
    assert all(r["kernel_ms_per_step"] == 2.0 and r["images_per_s"] == 1000.0 for r in profile["rates"])
    assert all(r["seconds"] is not None for r in rows if not r["result"].startswith("skip"))
    calls.clear()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    rows = []
    steps.check_steps(rows, 5, tmp_path, {"dtype": "fp16", "rates": []})
    assert [c[2] for c in calls].count("bf16") == 2
    assert "floor: A100's 2,078/GPU" in rows[-1]["reference"]


def test_references():
    assert env.native_bf16((8, 0)) and env.native_bf16((9, 0))
    assert not env.native_bf16((7, 0)) and not env.native_bf16((7, 5))
    assert round(env.rn50_reference("NVIDIA A100-SXM4-80GB").images_per_s) == 2078
    assert env.rn50_reference("Tesla V100-SXM2-16GB").images_per_s == 1200.0
    assert env.rn50_reference("NVIDIA H100 80GB HBM3").images_per_s == pytest.approx(16621 / 8)
    t4 = env.rn50_reference("Tesla T4")
    assert t4.images_per_s is None and "no published" in t4.text


def test_graphs_are_counted_per_mode(monkeypatch):
    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_end", lambda self: None)  # no GPU: a capture that succeeds
    counter = runs.GraphCounter()
    with counter.counting():
        counter.log("building none ...")
        counter.log("building fp16 ...")
        torch.cuda.CUDAGraph.capture_end(object())
        torch.cuda.CUDAGraph.capture_end(object())
        counter.log("measuring 200 images at batch size 1")
    torch.cuda.CUDAGraph.capture_end(object())  # after the block: not counted
    assert counter.counts == {"fp16": 2}


# --- a timed-out subprocess takes everything it started with it --------------------------------------------------
def test_timeout_stops_ranks_in_sessions_of_their_own(tmp_path):
    pidfile = tmp_path / "rank.pid"
    rank = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    agent = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {rank!r}], start_new_session=True)\n"  # as torchrun starts ranks
        "time.sleep(120)\n"
    )
    t = time.monotonic()
    rc = env.run_logged([sys.executable, "-c", agent], tmp_path / "log", 3, ROOT)
    assert rc == 124 and time.monotonic() - t < 30
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and env._alive(pid):
        time.sleep(0.1)
    assert not env._alive(pid), "the rank outlived the timeout"
    assert "timed out after 3 s" in (tmp_path / "log").read_text()


# --- the table and the guard ---------------------------------------------------------------------------------------
def test_help():
    p = _run(["--help"])
    assert p.returncode == 0
    assert "--out" in p.stdout and "--steps" in p.stdout and "--work" in p.stdout


def test_markdown_table_and_failures():
    rows = [
        judged("a", 2077.6, "img/s", at_least=1000, reference="x|y"),
        row("b", "fail: exit 1", None),
        row("c", "skip: horovod not importable (ImportError)", 1.2345, "ms", seconds=3.4),
    ]
    lines = markdown_table(rows).splitlines()
    assert lines[0] == "| check | result | number | unit | threshold | reference | s |"
    assert lines[2] == "| a | pass | 2,078 | img/s | >= 1,000 img/s | x\\|y |  |"
    assert lines[3] == "| b | fail: exit 1 |  |  |  |  |  |"
    assert lines[4] == "| c | skip: horovod not importable (ImportError) | 1.23 | ms |  |  | 3 |"
    assert failed(rows) == ["b"]
    json.dumps(rows)  # the rows are what --out writes


def test_guard_turns_an_exception_into_a_failed_timed_row():
    rows = []
    with guard(rows, "check x"):
        raise RuntimeError("no nvJPEG\nmore")
    assert rows[0]["result"] == "fail: RuntimeError: no nvJPEG" and rows[0]["seconds"] >= 0
    with guard(rows, "check y"):
        rows.append(judged("check y", 1.0, "", at_least=0.5))
        rows.append(judged("check y2", 1.0, "", at_least=0.5))
    assert rows[1]["seconds"] is not None and rows[2]["seconds"] is None
    assert failed(rows) == ["check x"]


def test_allreduce_worker_on_the_cpu(tmp_path):
    """The worker behind the multistream-vs-DDP rows, on 2 CPU ranks: same weights, bytes moved by both."""
    out = tmp_path / "w.json"
    cmd, _ = runs.torchrun(2, "gpu-check-test")
    cmd += ["-m", "scripts.gpu_check.gpu_check_worker", str(out), "cpu", "3"]
    rc = env.run_logged(cmd, tmp_path / "log", 240, ROOT, {**os.environ, "OMP_NUM_THREADS": "1"})
    assert rc == 0, (tmp_path / "log").read_text()[-3000:]
    r = json.loads(out.read_text())
    assert r["world"] == 2 and "error" not in r
    assert r["ddp"]["steps"] == r["multistream"]["steps"] == 3
    assert r["ddp"]["bytes"] > 0 and r["multistream"]["bytes"] > 0
    others = registry.compared_with_reference()
    assert set(r["max_diff"]) == set(r["rank_spread"]) == set(others)  # per backend, each held to its own record
    for b in others:
        assert r["max_diff"][b] <= runs.weights_atol(b) and r["rank_spread"][b] == 0.0


@pytest.mark.slow
def test_trainer_and_bare_loop_run_on_one_prebuilt_batch(monkeypatch, tmp_path):
    """measure_step's glue on the CPU (autocast("cuda") is off there): the trainer's input is the prebuilt batch."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    made = []
    from data import synthetic

    real = synthetic.SyntheticPipeline.train_batches

    def counting(self, info, start_step=0):
        made.append(info.epoch)
        return real(self, info, start_step)

    monkeypatch.setattr(synthetic.SyntheticPipeline, "train_batches", counting)
    with pytest.warns(UserWarning):  # CUDA autocast and GradScaler disabled on the CPU
        t = steps.measure_step("resnet10t", "sgd", "bf16", size=32, batch=8, steps=2, work=tmp_path, rounds=2)
    assert len(t.ours) == len(t.bare) == 2 and min(t.ours + t.bare) > 0
    assert t.kernel_ms is None  # no CUDA: nothing to profile
    assert made == [0]  # one batch taken before the clock; the 4 timed epochs never asked the input for more
