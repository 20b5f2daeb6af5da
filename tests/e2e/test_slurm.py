"""scripts/slurm/dawnbench.sbatch: its syntax and SLURM options, a dry run and a real run with a fake `srun` and
`scontrol` on PATH (the job's "nodes" are this machine), SIGTERM as SLURM sends it before preemption, the requeue,
and the rerun that resumes in the same run directory."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support import ROOT

SBATCH = ROOT / "scripts" / "slurm" / "dawnbench.sbatch"
TINY = "model.name=resnet10t run.threads=1 data.workers=0 data.val_batch_size=8 log.tensorboard=false"


def test_sbatch_script_parses_and_asks_for_requeue_and_an_early_sigterm():
    assert subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, timeout=30).returncode == 0
    options = re.findall(r"^#SBATCH (\S+)", SBATCH.read_text(), re.M)
    assert "--requeue" in options and "--signal=B:TERM@120" in options and "--ntasks-per-node=1" in options


def _fake_slurm(tmp_path: Path) -> Path:
    """srun: drops its options and runs `sh -c COMMAND` here; scontrol: lists $FAKE_NODES, logs requeues."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text('#!/bin/sh\nwhile [ "$1" != sh ]; do shift; done\nexec "$@"\n')
    (bin_dir / "scontrol").write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = requeue ]; then echo "requeue $2" >> {tmp_path}/scontrol.log; exit 0; fi\n'
        'if [ "$1 $2" = "show hostnames" ]; then for n in $FAKE_NODES; do echo "$n"; done; exit 0; fi\n'
        "exit 1\n"
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir


def _env(tmp_path: Path, **extra: str) -> dict:
    return {
        **os.environ,
        "PATH": f"{_fake_slurm(tmp_path)}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "FAKE_NODES": "node1 node2",
        "SLURM_SUBMIT_DIR": str(ROOT),
        "DAWNBENCH_PYTHON": sys.executable,
        "DAWNBENCH_CONFIG": "configs/quickstart.yaml",
        "DAWNBENCH_RUN_DIR": str(tmp_path / "run"),
        "OMP_NUM_THREADS": "1",
        **extra,
    }


def test_sbatch_dry_run_with_a_fake_srun(tmp_path, tiny_root):
    env = _env(tmp_path, DAWNBENCH_DATA=str(tiny_root), DAWNBENCH_LAUNCH_ARGS="--dry-run --gpus-per-host 1")
    p = subprocess.run(["bash", str(SBATCH)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "dawnbench.sbatch: job 4242 (start 1) on node[1-2]" in p.stdout
    assert "transport slurm" in p.stdout
    through = "srun --unbuffered --nodes=1 --ntasks=1 --nodelist=HOST --kill-on-bad-exit=1 sh -c COMMAND"
    assert f"launch: each host runs COMMAND through the slurm transport: {through}" in p.stdout
    for node in ("node1", "node2"):
        line = next(ln for ln in p.stdout.splitlines() if ln.startswith(f"launch: [{node}]"))
        assert f"DAWNBENCH_LAUNCH_HOST={node} " in line
        assert "guard --grace 100" in line and f"data.root={tiny_root}" in line
        assert "comm.backend=multistream comm.autotune=true" in line
    assert "nothing started" in p.stdout and not (tmp_path / "run").exists()
    # The record config without an author stops in the launcher, before any srun step, with the fix.
    env = _env(tmp_path, DAWNBENCH_CONFIG="configs/dawnbench_158s.yaml", DAWNBENCH_LAUNCH_ARGS="--dry-run")
    p = subprocess.run(["bash", str(SBATCH)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "launch: error: dawnbench.author and dawnbench.author_email required" in p.stderr
    assert "dawnbench.sbatch: launcher exited with 2" in p.stdout


@pytest.mark.slow
def test_sigterm_stops_the_job_requeues_it_and_the_rerun_resumes(tmp_path, tiny_root):
    """SLURM's SIGTERM to the batch shell: the launcher stops both nodes' commands, whose ranks stop at the next step
    boundary with a checkpoint (exit 75), and the script requeues the job; run again (as the requeued job is) into
    the same run directory, training resumes from that checkpoint."""
    env = _env(
        tmp_path,
        DAWNBENCH_DATA=str(tiny_root),
        DAWNBENCH_GRACE="30",  # the ranks leave as soon as their checkpoint is written
        SLURM_JOB_NODELIST="localhost",  # one node: the rendezvous needs an address that resolves
        FAKE_NODES="localhost",
        DAWNBENCH_LAUNCH_ARGS=f"--gpus-per-host 1 --port {_port()}",
        DAWNBENCH_OVERRIDES=f"{TINY} log.every_steps=1 phases.0.epochs=2 phases.1.epochs=1",
    )
    job = subprocess.Popen(
        ["bash", str(SBATCH)], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(job.stdout), daemon=True)
    reader.start()
    ckpt = tmp_path / "run" / "checkpoint.pt"
    deadline = time.monotonic() + 400
    while not ckpt.exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ckpt.exists(), "".join(lines[-40:])
    job.send_signal(signal.SIGTERM)  # as SLURM does (--signal=B:TERM@120): to the batch shell only
    rc = job.wait(timeout=120)
    reader.join(timeout=30)
    out = "".join(lines)
    assert "dawnbench.sbatch: SIGTERM: stopping the launcher" in out
    assert "launch: got SIGTERM: stopping all hosts" in out
    assert "dawnbench.sbatch: requeued job 4242" in out and rc == 130
    stopped = re.search(r"preempted: stopped by SIGTERM at step (\d+) .*: checkpoint of step \1 in", out)
    assert stopped, out[-4000:]
    # The ranks' one line, no traceback of theirs (torchrun's agent prints its own for the SIGTERM it got).
    assert "KeyboardInterrupt" not in out and f'File "{ROOT}/recipes' not in out and "left behind" not in out
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "run")], capture_output=True, text=True).stdout.split()
    assert left == [], left
    # The requeued job: the same script, SLURM_RESTART_COUNT=1, the same run directory.
    again = subprocess.run(
        ["bash", str(SBATCH)], env={**env, "SLURM_RESTART_COUNT": "1"}, cwd=tmp_path, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout[-4000:]
    assert "dawnbench.sbatch: job 4242 (start 2)" in again.stdout
    assert re.search(rf"resumed from .*: .*, {stopped[1]} step\(s\) done", again.stdout), again.stdout[-4000:]
    assert (tmp_path / "run" / "summary.json").is_file()


def _port() -> int:
    from support import free_port

    return free_port()


def test_sbatch_outside_slurm_keeps_the_launchers_exit_code_after_sigterm(tmp_path):
    """Run by hand (no SLURM_JOB_ID), a SIGTERM stops the launcher, nothing is requeued, and its 75 is the answer."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\ntrap 'exit 75' TERM\nwhile :; do sleep 0.05; done\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    p = subprocess.Popen(
        ["bash", str(SBATCH)],
        cwd=tmp_path,
        env={**env, "DAWNBENCH_PYTHON": str(fake)},
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 75, out
    assert "not inside a SLURM job: nothing to requeue" in out and "launcher exited with 75" in out
