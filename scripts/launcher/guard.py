"""The per-host guard: runs one host's command and makes sure none of it outlives the launcher.

    python scripts/launch.py guard [--grace S] -- COMMAND [ARGS...]

The launcher starts this on every host (through ssh, srun, ...) with the host's stdin connected to itself. The
guard starts COMMAND in its own session and becomes a child subreaper, so workers that their agent leaves behind
are re-parented to the guard instead of init. It stops the whole tree (SIGTERM to every descendant, SIGKILL after
--grace seconds) when its stdin closes (the launcher stopped the job, died, or the ssh connection dropped), when it
gets SIGTERM/SIGHUP/SIGINT, and when COMMAND ends with processes left over. Its exit status is COMMAND's
(128 + N when COMMAND died of signal N; 143 when the guard stopped it).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
# Seconds between SIGTERM and SIGKILL when a job stops: every rank finishes its step and writes its checkpoint. The
# one default of `launch.py --grace` (and of the guard, which the launcher always passes it).
GRACE_S = 100.0


def _become_subreaper() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: leftover workers are still found while their agent lives


def _process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) for every process we can see."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces and parentheses
        table[int(entry.name)] = (int(fields[1]), fields[0])
    return table


def descendants(root: int, include_zombies: bool = False) -> list[int]:
    """All processes below `root` (children first)."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(0), []):
            todo.append(c)
            if include_zombies or table[c][1] != "Z":
                out.append(c)
    return out


def _reap(keep: int | None) -> None:
    """Collect exited processes re-parented to us (but not `keep`, whose status Popen must read)."""
    me = os.getpid()
    for pid, (ppid, state) in _process_table().items():
        if ppid == me and state == "Z" and pid != keep:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def stop_tree(grace: float, keep: int | None = None) -> None:
    """SIGTERM every descendant, SIGKILL whatever is left after `grace` seconds."""
    me = os.getpid()
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        pids = descendants(me)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and descendants(me):
            _reap(keep)
            time.sleep(0.05)


def _watch_stdin(stop: threading.Event, why: list[str]) -> None:
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    why.append("the launcher closed the connection")
    stop.set()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="launch.py guard", description=__doc__.split("\n\n")[0])
    ap.add_argument("--grace", type=float, default=GRACE_S, help="seconds between SIGTERM and SIGKILL (%(default)g)")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("give the command after --")
    _become_subreaper()
    stop = threading.Event()
    why: list[str] = []

    def on_signal(signum, frame):
        why.append(f"got {signal.Signals(signum).name}")
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        child = subprocess.Popen(cmd, start_new_session=True, stdin=subprocess.DEVNULL)
    except OSError as e:
        print(f"guard: cannot start {cmd[0]}: {e}", flush=True)
        return 127
    print(f"guard: pid {child.pid} on {socket.gethostname()}: {shlex.join(cmd)}", flush=True)
    threading.Thread(target=_watch_stdin, args=(stop, why), daemon=True).start()
    while True:
        rc = child.poll()
        if rc is not None:
            break
        if stop.wait(0.2):
            print(f"guard: stopping pid {child.pid} and its processes ({why[0]})", flush=True)
            stop_tree(args.grace, keep=child.pid)
            child.wait()
            rc = -signal.SIGTERM
            break
        _reap(child.pid)
    deadline = time.monotonic() + 2.0  # processes that are exiting anyway get a moment to do so
    while descendants(os.getpid()) and time.monotonic() < deadline:
        _reap(None)
        time.sleep(0.05)
    left = descendants(os.getpid())
    if left:  # e.g. workers whose agent died: re-parented to us, stop them too
        print(f"guard: stopping {len(left)} process(es) left behind by the command", flush=True)
        stop_tree(args.grace)
    _reap(None)
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main())
