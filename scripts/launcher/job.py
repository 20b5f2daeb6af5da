"""One job on several hosts: the per-host commands, the checks before starting, and the run that fails fast.

`torchrun` engine: one torchrun agent per host (c10d rendezvous on the first host; `--max-restarts N` lets the
agents restart every worker from the last checkpoint after a failure, see docs/failures.md).
`horovod` engine: one `horovodrun --gloo` on the first host, which starts the workers on every host itself.
Either way each host's command runs under the guard (launcher/guard.py), so that stopping the job leaves nothing
behind, and the first host whose command exits non-zero stops the whole job.
"""

from __future__ import annotations

import math
import os
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from launcher.failures import (
    EXIT_PREEMPTED,
    RankFailure,
    describe_exit,
    describe_failure,
    exit_status,
    horovod_failure,
    next_step,
    parse_root_cause,
    resume_point,
)
from launcher.guard import GRACE_S
from launcher.hosts import Host

from recipes.exit_codes import BAD_INPUT, CANNOT_START, INTERRUPTED, KILLED, TIMEOUT

# Variables that tune communication: passed to every host, since ssh and srun do not carry our environment.
FORWARD_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "HOROVOD_")
FORWARD_NAMES = ("OMP_NUM_THREADS",)
CHECK_MARK = "launch-check:"


@dataclass
class Job:
    hosts: list[Host]
    transport: object  # launcher.transports.*
    config: str
    overrides: list[str]
    run_dir: str
    procs_per_host: int
    engine: str = "torchrun"  # torchrun | horovod
    port: int = 29400
    workdir: str = "."
    python: str = "python"
    env: dict[str, str] = field(default_factory=dict)
    data_paths: list[str] = field(default_factory=list)  # directories every host must see
    grace: float = GRACE_S
    join_timeout: float = 300.0
    rdzv_id: str = "dawnbench"
    iface: str | None = None
    ssh_port: int | None = None
    horovodrun: str | None = None
    max_restarts: int = 0
    program: list[str] | None = None  # what each torchrun worker runs instead of train.py (the link probe)

    @property
    def world_size(self) -> int:
        return len(self.hosts) * self.procs_per_host

    @property
    def endpoint(self) -> str:
        return f"{self.hosts[0].addr}:{self.port}"

    # -- commands ---------------------------------------------------------------------------------------
    def train_args(self) -> list[str]:
        if self.program is not None:
            return list(self.program)
        return ["train.py", "-c", self.config, "--run-dir", self.run_dir, *self.overrides]

    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k.startswith(FORWARD_PREFIXES) or k in FORWARD_NAMES}
        if self.iface:
            env.update(GLOO_SOCKET_IFNAME=self.iface, NCCL_SOCKET_IFNAME=self.iface)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.env)
        env.update(extra or {})
        return env

    def _wrap(self, argv: list[str], env: dict[str, str]) -> str:
        """`cd WORKDIR && exec env K=V... PYTHON scripts/launch.py guard -- ARGV` as one shell command."""
        guard = [self.python, "scripts/launch.py", "guard", "--grace", f"{self.grace:g}", "--"]
        assigns = [f"{k}={v}" for k, v in sorted(env.items())]
        return f"cd {shlex.quote(self.workdir)} && exec " + shlex.join(["env", *assigns, *guard, *argv])

    def torchrun_argv(self, i: int) -> list[str]:
        conf = f"is_host={1 if i == 0 else 0},join_timeout={self.join_timeout:g}"
        return [
            self.python,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            str(len(self.hosts)),
            "--nproc-per-node",
            str(self.procs_per_host),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            self.endpoint,
            "--rdzv-id",
            self.rdzv_id,
            "--rdzv-conf",
            conf,
            "--local-addr",
            self.hosts[i].addr,
            "--max-restarts",
            str(self.max_restarts),
            # torchrun's own SIGTERM-to-SIGKILL wait (30 s by default) follows --grace: a preempted rank that is
            # writing its checkpoint is not killed before the guard's deadline (recipes/preemption.py)
            "--shutdown-timeout",
            str(math.ceil(self.grace)),
            *self.train_args(),
        ]

    def horovodrun_path(self) -> str:
        if self.horovodrun:
            return self.horovodrun
        return str(Path(self.python).parent / "horovodrun") if "/" in self.python else "horovodrun"

    def horovod_argv(self) -> list[str]:
        hosts = ",".join(f"{h.name}:{self.procs_per_host}" for h in self.hosts)
        extra = (["--network-interface", self.iface] if self.iface else []) + (
            ["-p", str(self.ssh_port)] if self.ssh_port else []
        )
        return [
            self.horovodrun_path(),
            "--gloo",
            "-np",
            str(self.world_size),
            "-H",
            hosts,
            "--start-timeout",
            f"{self.join_timeout:g}",
            *extra,
            self.python,
            *self.train_args(),
        ]

    def commands(self) -> list[tuple[Host, str]]:
        """(host, shell command) for every host that the launcher starts something on."""
        if self.engine == "horovod":
            # torch.distributed inside the workers (validation counts, BN averaging) rendezvous here.
            env = self._env({"MASTER_ADDR": self.hosts[0].addr, "MASTER_PORT": str(self.port)})
            return [(self.hosts[0], self._wrap(self.horovod_argv(), env))]
        # The workers read the rendezvous round there (recipes/distributed.py: their store namespace).
        env = self._env({"DAWNBENCH_RDZV_ENDPOINT": self.endpoint})
        return [
            (h, self._wrap(self.torchrun_argv(i), {**env, "DAWNBENCH_LAUNCH_HOST": h.name}))
            for i, h in enumerate(self.hosts)
        ]

    def check_command(self, first: bool) -> str:
        """Shell command that prints one `launch-check:` line per problem on a host and exits non-zero if any."""
        q = shlex.quote

        def problem(msg: str, fatal: bool = False) -> str:
            return "{ echo " + q(f"{CHECK_MARK} {msg}") + ("; exit 3; }" if fatal else "; fail=1; }")

        modules = "torch, horovod.torch" if self.engine == "horovod" else "torch"
        lines = [
            f"cd {q(self.workdir)} 2>/dev/null || " + problem(f"working directory {self.workdir} not found", True),
            "fail=0",
            "test -f train.py || " + problem(f"{self.workdir} has no train.py (not this repository)"),
            f"{q(self.python)} -c {q('import ' + modules)} >/dev/null 2>&1 || "
            + problem(f"{self.python} cannot import {modules}"),
            f"test -f {q(self.config)} || " + problem(f"config {self.config} not found"),
        ]
        if self.engine == "horovod" and first:
            lines.append(
                f"command -v {q(self.horovodrun_path())} >/dev/null || "
                + problem(f"{self.horovodrun_path()} not found")
            )
        if first:
            # The rendezvous (torchrun's c10d store, or MASTER_PORT for horovod) binds this port on the first host;
            # when something holds it, torchrun would only say so deep inside a traceback.
            bind = f"import socket; s = socket.socket(); s.bind(('', {int(self.port)}))"
            lines.append(
                f"{q(self.python)} -c {q(bind)} >/dev/null 2>&1 || "
                + problem(f"rendezvous port {self.port} is in use (stop what holds it, or choose --port / PORT=)")
            )
        lock = f"{self.run_dir}/.lock"
        lines.append(
            f"test ! -d {q(lock)} || "
            + problem(f"{lock} is a directory, not the run's lock file: remove it (rmdir), then launch again")
        )
        for path in self.data_paths:
            lines.append(
                f'test -n "$(ls -A {q(path)} 2>/dev/null | head -n 1)" || '
                + problem(f"data path {path} is missing or empty")
            )
        lines.append(f"test $fail = 0 && echo {q(CHECK_MARK + ' ok')}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# Running and stopping.


def _kill_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class _TorchrunReport:
    """torchrun's agent ends a failed run with its own traceback (ChildFailedError) and a report of some 30 lines:
    kept in the host's log file, left off the console (one line says where it is), so the console ends with the
    rank's own last lines and the launcher's line naming the cause. The report's root cause is kept in `failure`.
    Any other traceback (a rank's own) is shown as it is."""

    def __init__(self):
        self.stopped = self.told = False
        self.held: list[str] = []  # a traceback's first lines, until it shows whose it is
        self.hiding = False
        self.rules = 0
        self.report: list[str] = []
        self.failure: RankFailure | None = None

    def filter(self, line: str, log: Path) -> list[str]:
        """The lines to show for one line of output (none, it, or lines held back before it)."""
        if line.startswith("preempted: "):
            self.stopped = True
        if self.failure is None:
            self.failure = horovod_failure(line)  # horovodrun names the first failed rank in one line
        if self.hiding:
            self.report.append(line)
            if line.startswith("===="):
                self.rules += 1
                if self.rules == 2:  # the report ends with its second rule of '='
                    self.hiding = False
                    self.failure = parse_root_cause(self.report) or self.failure
            return []
        if self.held or line.startswith("Traceback (most recent call last)"):
            self.held.append(line)
            if "torch/distributed/run.py" in line or "ChildFailedError" in line:
                self.held, self.hiding, self.rules, self.report = [], True, 0, []
                if self.told:
                    return []
                self.told = True
                what = "of the clean stop" if self.stopped else "of the failure"
                return [f"(torchrun's report {what}, a traceback, is in {log}, not shown here)"]
            if len(self.held) > 1 and not line.startswith((" ", "Traceback")):  # a rank's traceback ended
                held, self.held = self.held, []
                return held
            return []
        return [line]

    def flush(self) -> list[str]:
        held, self.held = self.held, []
        return held


class _Host:
    """One running host command: its process, and a thread copying its output with a `[host]` prefix."""

    def __init__(self, host: Host, argv: list[str], label: str, out: TextIO, lock: threading.Lock, log: Path):
        self.host, self.label, self.log = host, label, log
        self.report = _TorchrunReport()
        self.preempted = False  # a rank said `preempted:` (recipes/cli.py): its checkpoint is written
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.thread = threading.Thread(target=self._copy, args=(out, lock, log), daemon=True)
        self.thread.start()

    def _copy(self, out: TextIO, lock: threading.Lock, log: Path) -> None:
        # O_NOFOLLOW: a log name planted as a link is never appended through (the launcher refuses before this)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "ab") as f:
            for raw in self.proc.stdout:
                f.write(raw)
                f.flush()
                self.preempted = self.preempted or b"preempted: " in raw
                self._show(out, lock, self.report.filter(raw.decode(errors="replace").rstrip(), log))
        self._show(out, lock, self.report.flush())

    def _show(self, out: TextIO, lock: threading.Lock, lines: list[str]) -> None:
        with lock:
            for line in lines:
                out.write(f"[{self.label}] {line}\n")
            out.flush()

    def close_stdin(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass


def _wait(running: list[_Host], seconds: float) -> list[_Host]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(h.proc.poll() is None for h in running):
        time.sleep(0.05)
    return [h for h in running if h.proc.poll() is None]


def stop_hosts(running: list[_Host], grace: float) -> None:
    """Close every host's stdin (its guard stops its tree); after grace + 10 s, SIGTERM then SIGKILL the rest."""
    for h in running:
        h.close_stdin()
    left = _wait(running, grace + 10)
    for h in left:
        _kill_group(h.proc, signal.SIGTERM)
    for h in _wait(left, 3):
        _kill_group(h.proc, signal.SIGKILL)
        h.proc.wait(timeout=30)


def run(job: Job, log_dir: Path, out: TextIO, timeout: float | None = None) -> int:
    """Start every host's command and wait. Returns 0, or the exit code of the first host that failed."""
    if log_dir.is_symlink() or log_dir.parent.is_symlink():
        link = log_dir if log_dir.is_symlink() else log_dir.parent
        out.write(f"launch: error: '{link}' is a symbolic link: the launcher writes its logs only into its own files\n")
        return BAD_INPUT
    log_dir.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    width = max(len(h.name) for h in job.hosts)

    def say(msg: str) -> None:
        with lock:
            out.write(f"launch: {msg}\n")
            out.flush()

    stop_reason: list[str] = []

    def on_signal(signum, frame):
        stop_reason.append(signal.Signals(signum).name)

    old = {}
    if threading.current_thread() is threading.main_thread():
        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    running: list[_Host] = []
    t0 = time.monotonic()
    try:
        for i, (host, command) in enumerate(job.commands()):
            argv = job.transport.argv(host, command)
            log = log_dir / f"{i:03d}-{host.name}.log"
            if log.is_symlink():  # appending through it would write into someone else's file
                say(f"error: '{log}' is a symbolic link: the launcher writes its logs only into its own files")
                return BAD_INPUT
            try:
                running.append(_Host(host, argv, host.name.ljust(width), out, lock, log))
            except OSError as e:
                say(f"host {host.name}: cannot start the {job.transport.name} transport ({argv[0]}): {e}")
                return CANNOT_START
        while True:
            codes = [h.proc.poll() for h in running]
            failed = [(h, c) for h, c in zip(running, codes, strict=True) if c not in (None, 0)]
            if failed:
                h, rc = failed[0]
                h.thread.join(timeout=5)  # its last lines, torchrun's report among them, are read
                rank = h.report.failure
                if rank is not None:  # torchrun exits 1 for any failed rank: the rank's own code is the cause
                    rc = EXIT_PREEMPTED if rank.exitcode == EXIT_PREEMPTED else exit_status(rank.exitcode)
                why = job.transport.failure(rc)
                cause = describe_failure(job, h.host, rank) if rank is not None else describe_exit(rc)
                others = [x for x in running if x.proc.poll() is None]
                what = "stopped (preempted; its checkpoint is written)" if rc == EXIT_PREEMPTED else "failed"
                say(
                    f"host {h.host.name} ({h.host.addr}) {what}: {cause}{'; ' + why if why else ''} "
                    f"after {time.monotonic() - t0:.1f} s; stopping {len(others)} other host(s)"
                )
                t1 = time.monotonic()
                stop_hosts(others, job.grace)
                say(f"stopped in {time.monotonic() - t1:.1f} s; log of {h.host.name}: {h.log}")
                say(next_step(job, rc, h.log))
                return exit_status(rc)
            if all(c == 0 for c in codes):
                say(f"all {len(running)} host(s) finished in {time.monotonic() - t0:.1f} s")
                return 0
            if stop_reason or (timeout is not None and time.monotonic() - t0 > timeout):
                what = f"got {stop_reason[0]}" if stop_reason else f"timeout of {timeout:g} s reached"
                say(f"{what}: stopping all hosts")
                stopping = [x for x in running if x.proc.poll() is None]
                stop_hosts(stopping, job.grace)
                for x in stopping:
                    x.thread.join(timeout=5)  # their last lines: the `preempted:` line among them
                if all(x.preempted for x in stopping):
                    say("the ranks wrote their checkpoint (their `preempted:` lines)")
                    say(next_step(job, EXIT_PREEMPTED, log_dir))
                    return INTERRUPTED if stop_reason else TIMEOUT
                # No `preempted:` line: the ranks were killed (or died) before they wrote the checkpoint of the
                # step they stopped at, so this stop wrote nothing and a rerun goes back to the last checkpoint.
                silent = ", ".join(x.host.name for x in stopping if not x.preempted)
                say(
                    f"no checkpoint written: the ranks on {silent} did not say `preempted:` within the grace of "
                    f"{job.grace:g} s and were killed; a rerun starts from {resume_point(job)}"
                )
                say(next_step(job, KILLED, log_dir))
                return KILLED if stop_reason else TIMEOUT
            time.sleep(0.1)
    finally:
        stop_hosts([x for x in running if x.proc.poll() is None], job.grace)
        for h in running:
            h.thread.join(timeout=10)
        for s, handler in old.items():
            signal.signal(s, handler)
