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

from launcher import failures as failures_module  # noqa: E402
from launcher import job as job_module  # noqa: E402
from launcher.failures import RERUN_ENV, exit_status  # noqa: E402
from launcher.hosts import HostError, parse_hostfile  # noqa: E402
from launcher.job import run  # noqa: E402
from launcher.transports import Local  # noqa: E402

from recipes.preemption import rerun_hint  # noqa: E402


def _job(*commands: str, rerun: str = "make reproduce-8gpu DATA='/d'"):
    hosts = [SimpleNamespace(name=f"node0{i + 1}", addr=f"10.0.0.{i + 1}") for i in range(len(commands))]
    return SimpleNamespace(
        hosts=hosts,
        transport=Local(),
        grace=5.0,
        env={RERUN_ENV: rerun},
        workdir="/nonexistent-workdir",  # the run directory is not seen from here
        run_dir="runs/r",
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


# torchrun 2.14's output when rank 1 of 2 was killed with SIGKILL (its exit status: 1), cut to what matters here.
KILLED_REPORT = """rank 1 up
E1205 13:05:13.761000 14680 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/v/lib/python3.11/site-packages/torch/distributed/run.py", line 1142, in <module>
    main()
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=======================================================
train.py FAILED
-------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-05_13:05:13
  host      : node01
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 14697)  (SIGTERM)
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-05_13:05:13
  host      : node01
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 14700)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 14700
======================================================="""

OOM_LINE = "[ 812.4] Out of memory: Killed process 14700 (python) total-vm:9000kB, anon-rss:8000kB"


@pytest.mark.parametrize(
    ("kernel_log", "cause"),
    [
        (f"[ 1.0] boot\n{OOM_LINE}\n", f"from the kernel's OOM killer (dmesg on node01: {OOM_LINE})"),
        ("[ 1.0] boot\n", " (no OOM-killer record of pid 14700 in the kernel log of node01: a kill -9 or a"),
        (None, " (the OOM killer, a kill -9 or a scheduler past its grace period: the kernel log of node01 could not"),
    ],
)
def test_a_killed_rank_is_named_with_its_host_signal_and_the_runbooks_code(tmp_path, monkeypatch, kernel_log, cause):
    monkeypatch.setattr(failures_module, "read_kernel_log", lambda job, host: kernel_log)
    report = tmp_path / "report.txt"
    report.write_text(KILLED_REPORT + "\n")
    out = io.StringIO()
    assert run(_job(f"cat '{report}'; exit 1", "read line"), tmp_path / "launch", out) == 137  # torchrun said 1
    console = out.getvalue()
    log = tmp_path / "launch" / "000-node01.log"
    assert log.read_text() == KILLED_REPORT + "\n"
    assert "Traceback" not in console and "ChildFailedError" not in console and "=====" not in console
    assert f"[node01] (torchrun's report of the failure, a traceback, is in {log}, not shown here)" in console
    failed = next(line for line in console.splitlines() if " failed: " in line)
    assert failed.startswith(
        "launch: host node01 (10.0.0.1) failed: rank 1 (local_rank: 1) on node01: killed by SIGKILL"
    )
    assert cause in failed
    assert console.rstrip().splitlines()[-1].startswith("launch: next: read the end of")  # the cause is near the end


def test_a_ranks_own_traceback_is_shown_and_its_exit_code_kept(tmp_path):
    own = 'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\nKeyError: 3\nafter'
    report = tmp_path / "report.txt"
    report.write_text(own + "\n" + KILLED_REPORT.replace("-9 (pid: 14700)  (SIGKILL)", "1 (pid: 14700)") + "\n")
    out = io.StringIO()
    assert run(_job(f"cat '{report}'; exit 1"), tmp_path / "launch", out) == 1
    console = out.getvalue()
    assert "".join(f"[node01] {line}\n" for line in own.splitlines()) in console
    assert "failed: rank 1 (local_rank: 1) on node01: exit code 1 after" in console
    assert "ChildFailedError" not in console and "run.py" not in console


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


def test_one_grace_default_shown_by_help_and_said_once_in_the_docs():
    import re

    from launcher import guard

    sys.path.insert(0, str(ROOT))
    import launch  # scripts/launch.py

    assert guard.GRACE_S == 100.0
    helptext = " ".join(launch._parser().format_help().split())
    assert "(default: 100 s)" in helptext and launch._parser().parse_args(["-c", "x"]).grace == guard.GRACE_S
    assert job_module.Job(hosts=[], transport=None, config="", overrides=[], run_dir="", procs_per_host=1).grace == 100
    said = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for sentence in re.split(r"\.\s", " ".join(doc.read_text().split())):
            if "--grace" in sentence:  # a number of seconds given as its default, or bare in parentheses: "(10;"
                said += [(doc.name, n) for n in re.findall(r"(?<![-\w.])(\d+)(?=(?: s)? by default|;)", sentence)]
    assert said == [("reproduce.md", "100")]


def test_horovodruns_failed_rank_is_named_and_its_code_kept(tmp_path):
    said = "[1]<stderr>:training\nProcess 1 exit with status code 137.\n"
    said += "Terminating remaining workers after failure of Process 1."
    report = tmp_path / "report.txt"
    report.write_text(said + "\n")
    out = io.StringIO()
    assert run(_job(f"cat '{report}'; exit 1"), tmp_path / "launch", out) == 137  # horovodrun itself said 1
    failed = next(line for line in out.getvalue().splitlines() if " failed: " in line)
    assert failed.startswith("launch: host node01 (10.0.0.1) failed: rank 1: killed by SIGKILL after ")
    assert failures_module.horovod_failure("Process 3 exit with status code 3.") == failures_module.RankFailure(
        "3", "", 3, None
    )


def test_an_oom_line_of_another_pid_is_not_blamed_on_this_rank():
    """L3: the kernel log of a busy host holds other processes' OOM kills; only this rank's pid is its cause."""
    oom_record = failures_module.oom_record
    other = "[ 812.4] Out of memory: Killed process 14701 (python) total-vm:9000kB, anon-rss:8000kB"
    longer = "[ 812.5] Out of memory: Killed process 147000 (python) total-vm:9000kB"
    cgroup = "[ 813.0] oom-kill:constraint=CONSTRAINT_MEMCG,task=python,pid=14700,uid=0"
    assert oom_record(f"{other}\n{longer}\n", 14700) is None
    assert oom_record(f"{other}\n{cgroup}\n", 14700) == cgroup
    assert oom_record(f"{other}\n{OOM_LINE}\n", 14700) == OOM_LINE


@pytest.mark.parametrize("value", ["٣", "1_000", "+3", "3.0", "1234567"])
def test_slots_are_ascii_digits(tmp_path, value):
    """int() read slots=٣ as 3 processes and slots=1_000 as 1,000."""
    f = tmp_path / "hosts"
    f.write_text(f"node01 slots={value}\n")
    with pytest.raises(HostError) as e:
        parse_hostfile(f)
    assert str(e.value) == f"{f}:1: slots must be an integer, got {ascii(value)} (ASCII digits, at most 6)"


@pytest.mark.parametrize(
    ("on_stop", "expected"),
    [
        ("echo 'preempted: stopped by SIGTERM at step 4: checkpoint written'; exit 75", 130),
        ("exit 143", 137),  # stopped without a word: nothing was written
    ],
)
def test_a_stop_says_whether_the_ranks_wrote_their_checkpoint(on_stop, expected, tmp_path):
    """SIGTERM to the launcher: 130 and the resume line only when every host's ranks said `preempted:`; else the
    line that no checkpoint was written and the rerun goes back to the last one, and 137 (the table's 'killed')."""
    import os
    import signal
    import threading

    out = io.StringIO()
    job = _job(f"echo training; read line; {on_stop}", f"echo training; read line; {on_stop}")
    job.grace = 0.5
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    rc = run(job, tmp_path / "launch", out)
    text = out.getvalue()
    assert rc == expected, text
    if expected == 130:
        assert "launch: the ranks wrote their checkpoint (their `preempted:` lines)" in text
        assert "no checkpoint written" not in text
    else:
        assert (
            "launch: no checkpoint written: the ranks on node01, node02 did not say `preempted:` within the grace of "
            "0.5 s and were killed; a rerun starts from the last checkpoint written before this stop (step 0 if "
            "there is none)"
        ) in text
        assert "to resume from the checkpoint" not in text


def test_a_killed_job_names_the_step_a_rerun_starts_from(tmp_path):
    """Where the launcher sees the run directory, the grace line names the newest checkpoint's step."""
    from launcher.failures import resume_point

    job = _job("true", "true")
    job.workdir, job.run_dir = str(tmp_path), "runs/r"
    assert resume_point(job) == "the last checkpoint written before this stop (step 0 if there is none)"
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "checkpoint.pt").write_bytes(b"")
    assert resume_point(job) == f"step 0 (no checkpoint in {run})"
    for step in (8, 12, 4):
        (run / f"ckpt-{step:08d}.pt").write_bytes(b"")
    (run / "ckpt-00000099.pt.tmp").write_bytes(b"")  # a save cut short is not a checkpoint
    assert resume_point(job) == f"step 12 (the newest checkpoint in {run}; the steps after it are redone)"


def test_a_failed_check_exits_with_the_tables_code():
    """The transport's program missing: 127; a host not reached: 1; anything else a check finds: bad input, 2."""
    from launcher.checks import HostFailure, NoTransport, Problem, exit_code, run_checks

    hosts = [SimpleNamespace(name="node01", addr="10.0.0.1")]
    job = SimpleNamespace(
        hosts=hosts,
        transport=SimpleNamespace(name="ssh", argv=lambda host, command: ["/no/such/ssh", command]),
        check_command=lambda first: "true",
    )
    problems = run_checks(job, 5.0)
    assert problems == ["host node01: cannot run the ssh transport (/no/such/ssh): [Errno 2] No such file or "
                        "directory: '/no/such/ssh'"]  # fmt: skip
    assert exit_code(problems) == 127
    assert exit_code([Problem("data"), HostFailure("host"), NoTransport("ssh")]) == 127
    assert exit_code([Problem("data"), HostFailure("host")]) == 1
    assert exit_code([Problem("data"), "a verdict's line"]) == 2
