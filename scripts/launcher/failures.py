"""What a job's end means: a rank's exit code in words, the code the launcher exits with, the failed rank named from
torchrun's or horovodrun's report (and the host's kernel log, for a SIGKILL), and the one line that says what to do
next, with the step a rerun starts from. `job` is always a launcher.job.Job (which imports this module, so it is not
named here)."""

from __future__ import annotations

import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from launcher.hosts import Host

from recipes.exit_codes import BAD_INPUT, FAILED, PREEMPTED, SIGNALLED
from recipes.rundir import files as run_files

RERUN_ENV = "DAWNBENCH_RERUN"  # the command that resumes the run (recipes/preemption.py prints it when preempted)
EXIT_PREEMPTED = PREEMPTED  # a rank stopped by a signal after writing its checkpoint (recipes/preemption.py)


def describe_exit(rc: int) -> str:
    if rc < 0:
        return f"killed by {signal.Signals(-rc).name}"
    if rc > 128:
        try:
            return f"exit code {rc} ({signal.Signals(rc - 128).name})"
        except ValueError:
            pass
    return f"exit code {rc}"


def exit_status(rc: int) -> int:
    """The launcher's exit status for a host's: the same code (75 preempted, 2 bad input, ...), 128 + N for a
    command killed by signal N (137: SIGKILL), as a shell reports it."""
    if rc < 0:
        return SIGNALLED + (-rc)
    return rc if 0 < rc < 256 else FAILED


@dataclass
class RankFailure:
    """The first failed rank, as torchrun's failure report names it ("Root Cause (first observed failure)")."""

    rank: str  # "1 (local_rank: 1)"
    host: str
    exitcode: int  # negative: killed by that signal
    pid: int | None


_REPORT_FIELD = re.compile(r"^\s+(rank|host|exitcode)\s*: (.*)$")


def parse_root_cause(lines: list[str]) -> RankFailure | None:
    """The root cause of torchrun's failure report (its lines between the '=' rules); None when there is none."""
    fields: dict[str, str] = {}
    for line in lines[next((i for i, ln in enumerate(lines) if ln.startswith("Root Cause")), len(lines)) :]:
        m = _REPORT_FIELD.match(line)
        if m and m.group(1) not in fields:
            fields[m.group(1)] = m.group(2).strip()
    code = re.match(r"(-?\d+)(?: \(pid: (\d+)\))?", fields.get("exitcode", ""))
    if code is None:
        return None
    pid = int(code.group(2)) if code.group(2) else None
    return RankFailure(fields.get("rank", "?"), fields.get("host", "?"), int(code.group(1)), pid)


# horovodrun --gloo's line for the first rank that failed (horovod/runner/gloo_run.py), before it exits 1 itself.
_HOROVOD_FAILED = re.compile(r"^Process (\d+) exit with status code (-?\d+)\.$")


def horovod_failure(line: str) -> RankFailure | None:
    """The failed rank of horovodrun's 'Process 1 exit with status code 137.' (the shell's 128 + N: signal N)."""
    m = _HOROVOD_FAILED.match(line)
    if m is None:
        return None
    code = int(m.group(2))
    signum = code - SIGNALLED if code > SIGNALLED else 0
    return RankFailure(m.group(1), "", -signum if signum else code, None)


_OOM = re.compile(r"(?:Killed process |oom-kill:.*\bpid=)(\d+)")


def oom_record(kernel_log: str, pid: int) -> str | None:
    """The kernel log's line that says its OOM killer killed `pid` (None: no such line)."""
    for line in kernel_log.splitlines():
        m = _OOM.search(line)
        if m and int(m.group(1)) == pid:
            return line.strip()
    return None


def read_kernel_log(job, host: Host) -> str | None:
    """That host's kernel log (`dmesg`), or None where it cannot be read (dmesg_restrict, no dmesg, no answer)."""
    try:
        p = subprocess.run(
            job.transport.argv(host, "dmesg"), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=15
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout if p.returncode == 0 and p.stdout else None


def describe_failure(job, host: Host, failure: RankFailure) -> str:
    """'rank 1 (local_rank: 1) on node07: killed by SIGKILL (...)': which rank, where, and why where it can tell."""
    where = f"rank {failure.rank}" + (f" on {failure.host}" if failure.host else "")
    if failure.exitcode >= 0:
        return f"{where}: exit code {failure.exitcode}"
    try:
        name = signal.Signals(-failure.exitcode).name
    except ValueError:
        name = f"signal {-failure.exitcode}"
    what = f"{where}: killed by {name}"
    if failure.exitcode != -signal.SIGKILL or failure.pid is None:
        return what
    log = read_kernel_log(job, host)
    if log is None:
        return (
            f"{what} (the OOM killer, a kill -9 or a scheduler past its grace period: the kernel log of {host.name} "
            "could not be read from here; run dmesg there as root)"
        )
    record = oom_record(log, failure.pid)
    if record is not None:
        return f"{what} from the kernel's OOM killer (dmesg on {host.name}: {record})"
    return (
        f"{what} (no OOM-killer record of pid {failure.pid} in the kernel log of {host.name}: a kill -9 or a scheduler "
        "past its grace period)"
    )


def resume_point(job) -> str:
    """Where a rerun of a killed job starts: the step of the newest `ckpt-<step>.pt` in the run directory where this
    machine sees it (the launcher runs on one of the hosts, or the folder is shared), else what the rerun looks for."""
    path = Path(job.workdir) / job.run_dir
    try:
        steps = [int(m.group(1)) for p in path.iterdir() if (m := run_files.STEP_CHECKPOINT.match(p.name))]
    except OSError:
        return "the last checkpoint written before this stop (step 0 if there is none)"
    if not steps:
        return f"step 0 (no checkpoint in {path})"
    return f"step {max(steps)} (the newest checkpoint in {path}; the steps after it are redone)"


def next_step(job, rc: int, log: Path) -> str:
    """One line: what to do now, for this exit code."""
    rerun = job.env.get(RERUN_ENV) or "the same command"
    if rc == EXIT_PREEMPTED:
        return f"next: rerun {rerun} to resume from the checkpoint (docs/reproduce.md, 'A run died')"
    if rc == BAD_INPUT:
        return f"next: the last lines of {log} name the bad input; fix it and rerun {rerun}"
    return (
        f"next: read the end of {log}, then rerun {rerun}: it resumes from the last checkpoint "
        "(docs/reproduce.md, 'A run died', lists what each exit code means)"
    )
