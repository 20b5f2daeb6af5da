"""Hosts with only local disks, restarts and replaced hosts: every rank resumes from one agreed state.

Each lab host sees its own run directory: `ip netns exec` bind-mounts `/etc/netns/<host>/<entry>` over
`/etc/<entry>`, so the same `--run-dir /etc/<entry>` is a different, private directory on every host.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from support import NETLAB_MISSING, ROOT, TINY_OVERRIDES, free_port, two_local_hosts, worker_pid

from recipes.rundir import checkpoint_files as ckpt

TINY = [
    "-c",
    "configs/base.yaml",
    *TINY_OVERRIDES,
    "run.deterministic=true",
    "checkpoint.every_steps=1",
    "phases=[{epochs: 4, image_size: 32, batch_size: 12}]",
]
STEPS = 16  # 4 epochs x ceil(48 / 12)


def _launch(hostfile: Path, run_dir: str, data: Path, *extra: str, transport: str = "netns") -> subprocess.Popen:
    cmd = [
        sys.executable,
        "scripts/launch.py",
        "--hostfile",
        str(hostfile),
        "--transport",
        transport,
        "--gpus-per-host",
        "1",
        "--port",
        str(free_port()),
        "--run-dir",
        run_dir,
        "--max-restarts",
        "3",
        "--timeout",
        "900",
        *(["--iface", "eth0"] if transport == "netns" else []),
        *TINY,
        f"data.root={data}",
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def _finish(proc: subprocess.Popen, timeout: float = 900) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return out


def _reached(dirs: list[Path]) -> int:
    best = 0
    for d in dirs:
        try:
            best = max(best, json.loads((d / "progress.json").read_text())["step"])
        except (OSError, ValueError, KeyError):
            pass
    return best


def _wait_step(proc: subprocess.Popen, dirs: list[Path], step: int, timeout: float = 600) -> None:
    end = time.time() + timeout
    while _reached(dirs) < step:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.time() < end, f"step {step} not reached"
        time.sleep(0.05)


def _summary(dirs: list[Path]) -> dict:
    found = [json.loads((d / "summary.json").read_text()) for d in dirs if (d / "summary.json").is_file()]
    assert found, f"no summary.json in {dirs}"
    return found[0]


class PrivateDirs:
    """A lab whose hosts each see their own directory at /etc/<entry>."""

    def __init__(self, lab, entry: str):
        self.lab, self.entry = lab, entry
        self.mountpoint = Path("/etc") / entry
        self.mountpoint.mkdir()
        for ns in lab.names:
            (Path("/etc/netns") / ns / entry).mkdir(parents=True)

    def host_dir(self, i: int) -> Path:
        return Path("/etc/netns") / self.lab.names[i] / self.entry

    def hostfile(self, tmp_path: Path, hosts: list[int]) -> Path:
        f = tmp_path / f"hosts-{'-'.join(map(str, hosts))}"
        f.write_text("".join(f"{self.lab.names[i]} addr={self.lab.addr(i)}\n" for i in hosts))
        return f

    def close(self) -> None:
        shutil.rmtree(self.mountpoint, ignore_errors=True)


@pytest.fixture(scope="module")
def lab3():
    if NETLAB_MISSING:
        pytest.skip(NETLAB_MISSING)
    from lab import netlab

    with netlab.NetLab(3) as lab:
        yield lab


@pytest.fixture(scope="module")
def reference(lab3, tiny_root, tmp_path_factory):
    """The uninterrupted run on hosts 0 and 1 (private run directories)."""
    dirs = PrivateDirs(lab3, f"dbref{os.getpid()}")
    try:
        out = _finish(_launch(dirs.hostfile(tmp_path_factory.mktemp("ref"), [0, 1]), str(dirs.mountpoint), tiny_root))
        s = _summary([dirs.host_dir(0), dirs.host_dir(1)])
        assert s["steps"] == STEPS, out[-3000:]
        s["model"] = ckpt.load(dirs.host_dir(0) / f"ckpt-{STEPS:08d}.pt")["model"]
        yield s
    finally:
        dirs.close()


@pytest.mark.slow
@pytest.mark.netns
def test_local_disks_sigkill_resumes_every_host_from_the_same_step(lab3, reference, tiny_root, tmp_path):
    dirs = PrivateDirs(lab3, f"dbkill{os.getpid()}")
    try:
        local = [dirs.host_dir(0), dirs.host_dir(1)]
        proc = _launch(dirs.hostfile(tmp_path, [0, 1]), str(dirs.mountpoint), tiny_root)
        _wait_step(proc, local, 10)  # mid-way through epoch 3 of 4
        victim = worker_pid(proc.pid, 1)
        assert victim, "rank 1 not found"
        os.kill(victim, signal.SIGKILL)
        out = _finish(proc)
        assert proc.returncode == 0, out[-4000:]
        assert f"run directory {dirs.mountpoint} is NOT shared" in out
        s = _summary(local)
        assert s["steps"] == reference["steps"] and s["restarts"] == 1
        assert (s["final_top1"], s["final_top5"]) == (reference["final_top1"], reference["final_top5"])
        # Both hosts kept every checkpoint (one writer per directory), with the same weights at the end.
        finals = [ckpt.load(d / f"ckpt-{STEPS:08d}.pt")["model"] for d in local]
        assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])
        # Bit-identical to the uninterrupted run: the mid-epoch checkpoint kept every rank's BN statistics.
        assert all(torch.equal(finals[0][k], reference["model"][k]) for k in finals[0])
        assert "resumed from" in out and "step(s) will be redone" in out
    finally:
        dirs.close()


@pytest.mark.slow
@pytest.mark.netns
def test_restart_with_a_replaced_host_resumes_where_the_job_stopped(lab3, reference, tiny_root, tmp_path):
    dirs = PrivateDirs(lab3, f"dbrepl{os.getpid()}")
    try:
        proc = _launch(dirs.hostfile(tmp_path, [0, 1]), str(dirs.mountpoint), tiny_root)
        _wait_step(proc, [dirs.host_dir(0), dirs.host_dir(1)], 10)
        os.killpg(proc.pid, signal.SIGKILL)  # the whole job dies; host 1 is then replaced by host 2 (empty disk)
        _finish(proc, timeout=60)
        time.sleep(2)
        proc = _launch(dirs.hostfile(tmp_path, [0, 2]), str(dirs.mountpoint), tiny_root)
        out = _finish(proc)
        assert proc.returncode == 0, out[-4000:]
        s = _summary([dirs.host_dir(0), dirs.host_dir(2)])
        assert s["steps"] == reference["steps"] and s["final_top1"] == reference["final_top1"]
        assert "resumed from" in out
        final = ckpt.load(dirs.host_dir(2) / f"ckpt-{STEPS:08d}.pt")  # the new host has the run's checkpoints
        assert final["run_id"] == s["run_id"]
        kept = ckpt.load(dirs.host_dir(0) / f"ckpt-{STEPS:08d}.pt")["model"]  # the surviving host's copy
        assert all(torch.equal(final["model"][k], kept[k]) for k in final["model"])
        assert all(torch.equal(final["model"][k], reference["model"][k]) for k in final["model"])
    finally:
        dirs.close()


@pytest.mark.slow
def test_worker_killed_before_joining_its_generation_restart_still_succeeds(tiny_root, tmp_path):
    run = tmp_path / "run"
    proc = _launch(two_local_hosts(tmp_path), str(run), tiny_root, "dist.timeout_s=60", transport="local")
    try:
        end = time.time() + 120
        victim = None
        while victim is None and time.time() < end:
            victim = worker_pid(proc.pid, 1)
            time.sleep(0.01)
        assert victim, "rank 1 never started"
        os.kill(victim, signal.SIGSTOP)  # still importing: it has not joined its generation's store namespace
        time.sleep(12)  # meanwhile rank 0 (its imports take about 4 s here) reaches the process-group setup
        os.kill(victim, signal.SIGKILL)
        out = _finish(proc, timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-4000:]
    s = json.loads((run / "summary.json").read_text())
    assert s["steps"] == STEPS
