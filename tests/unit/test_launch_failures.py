"""When a run dies: the launcher names the failed host's log file and the next command, keeps the exit code (75
preempted, 137 killed, 2 bad input), and the preemption line says what to rerun for the way the run was started."""

from __future__ import annotations

import io
import subprocess
import sys
from types import SimpleNamespace

import pytest
from support import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

from launcher.hosts import HostError, parse_hostfile  # noqa: E402
from launcher.job import RERUN_ENV, exit_status, run  # noqa: E402
from launcher.transports import Local  # noqa: E402

from recipes.preemption import rerun_hint  # noqa: E402


def _job(*commands: str, rerun: str = "make reproduce-8gpu DATA='/d'"):
    hosts = [SimpleNamespace(name=f"node0{i + 1}", addr=f"10.0.0.{i + 1}") for i in range(len(commands))]
    return SimpleNamespace(
        hosts=hosts,
        transport=Local(),
        grace=5.0,
        env={RERUN_ENV: rerun},
        commands=lambda: list(zip(hosts, commands, strict=True)),
    )


@pytest.mark.parametrize(("code", "expected"), [("exit 75", 75), ("exit 2", 2), ("kill -9 $$", 137), ("exit 3", 3)])
def test_the_launcher_keeps_the_exit_code_and_names_the_log_file_and_the_next_command(code, expected, tmp_path):
    out = io.StringIO()
    rc = run(_job(f"echo training; {code}", "read line"), tmp_path / "launch", out)  # the other stops on EOF
    text = out.getvalue()
    assert rc == expected
    log = tmp_path / "launch" / "000-node01.log"
    assert f"log of node01: {log}" in text and log.read_text() == "training\n"
    next_line = next(line for line in text.splitlines() if line.startswith("launch: next: "))
    assert "make reproduce-8gpu DATA='/d'" in next_line
    if expected == 75:
        assert "stopped (preempted; its checkpoint is written)" in text and "to resume from the checkpoint" in next_line
    elif expected == 2:
        assert f"the last lines of {log} name the bad input" in next_line
    else:
        assert f"read the end of {log}" in next_line


def test_exit_status_of_a_killed_command_is_128_plus_the_signal():
    assert (exit_status(-9), exit_status(-15), exit_status(75), exit_status(0), exit_status(300)) == (
        137,
        143,
        75,
        1,
        1,
    )


def test_the_preemption_line_names_the_command_that_started_the_run():
    assert rerun_hint({RERUN_ENV: "make reproduce-158s HOSTS='h.txt'"}) == (
        "rerun `make reproduce-158s HOSTS='h.txt'` to resume from it"
    )
    assert "the same torchrun command" in rerun_hint({"TORCHELASTIC_RUN_ID": "x", "LOCAL_RANK": "0"})
    assert "the same train.py command" in rerun_hint({})
    assert "--resume" not in rerun_hint({}) + rerun_hint({"TORCHELASTIC_RUN_ID": "x"})


def test_make_passes_its_own_command_to_the_launcher():
    p = subprocess.run(
        ["make", "-n", "reproduce-8gpu", "DATA=/data/imagenet", "CONFIG=configs/presets/v100_1gpu.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rerun = "make reproduce-8gpu DATA='\\''/data/imagenet'\\'' CONFIG='\\''configs/presets/v100_1gpu.yaml'\\''"
    assert f"DAWNBENCH_RERUN='{rerun}' " in p.stdout


def test_a_placeholder_line_in_a_hostfile_is_refused(tmp_path):
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("node01 slots=8\n...   # 16 lines for the record\n")
    with pytest.raises(HostError, match=r"hosts.txt:2: '...' is not a host name \(a placeholder"):
        parse_hostfile(hostfile)


TORCHRUN_REPORT = """preempted: stopped by SIGTERM at step 6 (epoch 2, 2 step(s) into it): checkpoint of step 6 in r
E1204 12:00:00.000 api.py:1 failed (exitcode: 75) local_rank: 0 (pid: 42) of binary: python
Traceback (most recent call last):
  File "torch/distributed/run.py", line 1, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
  exitcode  : 75 (pid: 42)
============================================================
after the report"""


def test_torchruns_traceback_after_a_clean_stop_stays_in_the_log_file_only(tmp_path):
    report = tmp_path / "report.txt"
    report.write_text(TORCHRUN_REPORT + "\n")
    out = io.StringIO()
    assert run(_job(f"cat '{report}'; exit 75"), tmp_path / "launch", out) == 75
    console = out.getvalue()
    log = tmp_path / "launch" / "000-node01.log"
    assert log.read_text() == TORCHRUN_REPORT + "\n"  # everything, in the file
    assert "Traceback" not in console and "ChildFailedError" not in console and "=====" not in console
    assert "preempted: stopped by SIGTERM" in console and "failed (exitcode: 75)" in console
    assert f"(torchrun's report of the clean stop, a traceback, is in {log}, not shown here)" in console
    assert "[node01] after the report" in console
    # A traceback without a clean stop before it is a real failure: shown.
    report.write_text(TORCHRUN_REPORT.split("\n", 1)[1] + "\n")
    out = io.StringIO()
    assert run(_job(f"cat '{report}'; exit 1"), tmp_path / "again", out) == 1
    assert "Traceback (most recent call last)" in out.getvalue()


def test_a_planted_log_link_is_refused_and_its_target_left_alone(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "launch").mkdir()
    (tmp_path / "launch" / "000-node01.log").symlink_to(victim)
    out = io.StringIO()
    assert run(_job("echo training"), tmp_path / "launch", out) == 2
    assert "000-node01.log' is a symbolic link" in out.getvalue() and victim.read_text() == "precious\n"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "launch").symlink_to(elsewhere)
    assert run(_job("echo training"), tmp_path / "run" / "launch", out) == 2
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("kind", ["foreign", "link"])
def test_the_launcher_checks_the_run_directory_before_it_writes_anything(tmp_path, kind):
    run_dir = tmp_path / "proj"
    run_dir.mkdir()
    if kind == "foreign":
        (run_dir / "config.yaml").write_text("# mine\n")
    else:
        (tmp_path / "victim").write_text("x")
        (run_dir / "network.json").symlink_to(tmp_path / "victim")
    before = sorted(p.name for p in run_dir.iterdir())
    p = subprocess.run(
        [sys.executable, "scripts/launch.py", "--hosts", "localhost", "--no-check", "--run-dir", str(run_dir)]
        + ["-c", "tests/tiny.yaml", "--probe-network"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    words = "holds 'config.yaml' but no run.json" if kind == "foreign" else "network.json' is a symbolic link"
    assert p.stderr.startswith("launch: error: ") and words in p.stderr
    assert sorted(q.name for q in run_dir.iterdir()) == before  # no launch/ folder, no probe, no token
