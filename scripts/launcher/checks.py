"""The checks before a job starts, on every host at once through its transport: the working directory, Python
and the config (`Job.check_command`), the pre-flight report (launcher/preflight.py), and whether the run directory is
shared between the hosts. A problem is one line, with the exit code the runbook's table gives it."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import time

from launcher.hosts import Host
from launcher.job import CHECK_MARK, Job, _kill_group

from recipes.exit_codes import BAD_INPUT, CANNOT_START, FAILED


def on_every_host(job: Job, commands: list[str], timeout: float) -> list[tuple[Host, int | None, str, str]]:
    """Run commands[i] on host i, all at once; (host, exit code or None on timeout, stdout, stderr) per host."""
    procs = []
    for host, command in zip(job.hosts, commands, strict=True):
        argv = job.transport.argv(host, command)
        try:
            p = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        except OSError as e:
            for _, q in procs:
                _kill_group(q, signal.SIGKILL)
                q.communicate()
            raise TransportError(
                f"host {host.name}: cannot run the {job.transport.name} transport ({argv[0]}): {e}"
            ) from None
        procs.append((host, p))
    results = []
    deadline = time.monotonic() + timeout
    for host, p in procs:
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            results.append((host, p.returncode, out, err))
        except subprocess.TimeoutExpired:
            _kill_group(p, signal.SIGKILL)
            out, err = p.communicate()
            results.append((host, None, out, err))
    return results


class TransportError(RuntimeError):
    """The transport itself cannot be started (no ssh, no srun)."""


class Problem(str):
    """A check's one line, with the exit code the table gives for it (docs/reproduce.md, 'A run died'): bad input
    unless a subclass says otherwise."""

    code = BAD_INPUT


class HostFailure(Problem):
    """A host the transport could not reach, or whose check crashed: a failure, not bad input."""

    code = FAILED


class NoTransport(Problem):
    """The transport's own program could not be started (no ssh, no srun)."""

    code = CANNOT_START


def exit_code(problems: list[str]) -> int:
    """The code for a failed check: the transport missing first, then a host not reached, else bad input."""
    codes = {getattr(p, "code", BAD_INPUT) for p in problems}
    return next((c for c in (CANNOT_START, FAILED) if c in codes), BAD_INPUT)


# What names this machine itself: a hostfile line `localhost slots=2` over ssh needs an ssh server here.
_THIS_MACHINE = ("localhost", "127.0.0.1", "::1", "ip6-localhost")


def _unreachable(job: Job, host: Host, rc: int | None, out: str, err: str, timeout: float) -> HostFailure:
    if rc is None:
        return HostFailure(f"host {host.name}: no answer within {timeout:g} s ({job.transport.name} transport)")
    why = job.transport.failure(rc) or f"exit {rc}"
    tail = " | ".join((err.strip() or out.strip()).splitlines()[-3:])
    hint = ""
    if job.transport.name == "ssh" and host.name.lower() in (*_THIS_MACHINE, socket.gethostname().lower()):
        hint = "; for this machine alone, add `--transport local` (no ssh)"
    return HostFailure(f"host {host.name}: not reachable through {job.transport.name}: {why}: {tail}{hint}")


def run_checks(job: Job, timeout: float) -> list[str]:
    """Run the check command on every host at once; returns one message per problem (empty: all good)."""
    commands = [job.check_command(first=i == 0) for i in range(len(job.hosts))]
    try:
        results = on_every_host(job, commands, timeout)
    except TransportError as e:
        return [NoTransport(e)]
    problems = []
    for host, rc, out, err in results:
        marks = [ln[len(CHECK_MARK) :].strip() for ln in out.splitlines() if ln.startswith(CHECK_MARK)]
        if rc == 0 and "ok" in marks:
            continue
        found = [m for m in marks if m != "ok"]
        if rc is not None and found:
            problems += [f"host {host.name}: {m}" for m in found]
        else:
            problems.append(_unreachable(job, host, rc, out, err, timeout))
    return problems


def preflight_command(job: Job, data_dirs: list[str], blacklist: str | None) -> str:
    """Shell command that prints the host's `launch-preflight: {json}` line (scripts/launcher/preflight.py)."""
    argv = [job.python, "scripts/launcher/preflight.py", "--run-dir", job.run_dir]
    for d in data_dirs:
        argv += ["--data", d]
    if blacklist:
        argv += ["--blacklist", blacklist]
    env = {k: v for k, v in job.env.items() if k.startswith("DAWNBENCH_")}
    assigns = [f"{k}={v}" for k, v in sorted(env.items())]
    return f"cd {shlex.quote(job.workdir)} && exec " + shlex.join(["env", *assigns, *argv] if assigns else argv)


def run_preflight(
    job: Job, data_dirs: list[str], blacklist: str | None, timeout: float
) -> tuple[dict[str, dict], list[str]]:
    """Every host's pre-flight report ({host name: report}) and the hosts that did not give one."""
    from launcher.preflight import MARK

    command = preflight_command(job, data_dirs, blacklist)
    try:
        results = on_every_host(job, [command] * len(job.hosts), timeout)
    except TransportError as e:
        return {}, [NoTransport(e)]
    reports, problems = {}, []
    for host, rc, out, err in results:
        line = next((ln for ln in out.splitlines() if ln.startswith(MARK)), None)
        if rc == 0 and line:
            reports[host.name] = json.loads(line[len(MARK) :])
        elif rc is None or not err.strip():
            problems.append(_unreachable(job, host, rc, out, err, timeout))
        else:
            problems.append(HostFailure(f"host {host.name}: the pre-flight failed: {err.strip().splitlines()[-1]}"))
    return reports, problems


# ---------------------------------------------------------------------------------------------------------
# Is the run directory shared between the hosts?


def probe_shared_run_dir(job: Job, timeout: float) -> tuple[list[str], list[str]]:
    """Write a token into the run directory on the first host and look for it on the others.

    Returns (hosts that saw it, hosts that did not). The token file is removed afterwards.
    """
    q = shlex.quote
    token = f"{os.getpid()}-{time.time_ns()}"
    name = f".launch-token-{token}"
    cd = f"cd {q(job.workdir)} && mkdir -p {q(job.run_dir)} && cd {q(job.run_dir)}"

    def on(host: Host, command: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            job.transport.argv(host, command), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
        )

    first, others = job.hosts[0], job.hosts[1:]
    on(first, f"{cd} && echo {q(token)} > {q(name)}")
    seen, unseen = [first.name], []
    try:
        for host in others:
            p = on(host, f"{cd} && cat {q(name)} 2>/dev/null")
            (seen if p.stdout.strip() == token else unseen).append(host.name)
    finally:
        on(first, f"{cd} && rm -f {q(name)}")
    return seen, unseen


def describe_run_dir(job: Job, seen: list[str], unseen: list[str]) -> str:
    where = f"run directory {job.run_dir}"
    if not unseen:
        return (
            f"{where} is shared by all {len(seen)} host(s) (a token written on {seen[0]} is seen by every host): "
            f"checkpoints, summary.json and dawnbench.json are written there by rank 0"
        )
    return (
        f"{where} is NOT shared ({', '.join(unseen)} did not see a token written on {seen[0]}): each host has "
        f"its own copy; rank 0 (on whichever host c10d places it) writes checkpoints, summary.json and "
        f"dawnbench.json into its host's copy, and at every start the ranks resume from the newest checkpoint "
        f"of this run on any host, sent to all ranks over the process group"
    )
