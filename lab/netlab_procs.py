"""The network lab's processes and namespaces (lab/netlab.py builds the lab; these end what runs in it).

`_kill_tree` ends a process started in its own session with everything it started, `kill_namespace_processes`
everything inside one namespace (`ip netns pids`), and `cleanup_stale` what labs whose process died left behind
(`python -m lab.netlab --cleanup`). `measure_mbit` is the throughput check (`python -m lab.netlab --check`):
TCP streams from host 1 to host 0, to see the link and per-flow caps at work, on any `Hosts` (the lab's NetLab);
`_SINK` and `_SOURCE` are its two ends, self-contained programs run with `python -c` (lab/bench_allreduce.py
runs them on loopback too).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol

PREFIX = "dbn"
ETC_NETNS = Path("/etc/netns")
_LAB_NAME = re.compile(rf"{PREFIX}(\d+)-(sw|h\d+)")


class Hosts(Protocol):
    """What the throughput check needs of a lab (lab/netlab.py's NetLab): a host's address and its commands."""

    def addr(self, i: int) -> str: ...

    def argv(self, i: int, argv: list[str]) -> list[str]: ...

    def popen(self, i: int, argv: list[str], **kw) -> subprocess.Popen: ...


class NetLabError(RuntimeError):
    """The lab could not be set up (not root, no `ip`/`tc`, a kernel without netns/htb/u32...)."""


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and p.returncode != 0:
        raise NetLabError(f"`{' '.join(argv)}` failed ({p.returncode}): {p.stderr.strip() or p.stdout.strip()}")
    return p


def _kill_tree(p: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)  # the process was started in its own session: its group is its tree
    with contextlib.suppress(Exception):
        p.wait(timeout=10)


def namespace_pids(ns: str) -> list[int]:
    """PIDs of the processes whose network namespace is `ns` (`ip netns pids`)."""
    out = _run(["ip", "netns", "pids", ns], check=False).stdout
    return [int(t) for t in out.split() if t.isdigit() and int(t) != os.getpid()]


def kill_namespace_processes(ns: str, timeout: float = 10.0) -> int:
    """SIGKILL every process inside namespace `ns` until none is left (a dying tree may still fork); returns
    how many were killed."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while (pids := namespace_pids(ns)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        time.sleep(0.05)
    return len(killed)


def _lab_pid(name: str) -> int | None:
    m = _LAB_NAME.fullmatch(name)
    return int(m.group(1)) if m else None


def cleanup_stale(tag: str | None = None) -> list[str]:
    """Remove what labs whose creating process died left behind: the processes inside their namespaces, the
    namespaces and their /etc/netns entries. Only names of this module's form (`dbn<pid>-sw`, `dbn<pid>-h<i>`)
    whose <pid> no longer exists are touched; `tag` (`dbn<pid>`) narrows it to one lab. Returns the names."""

    def stale(name: str) -> bool:
        pid = _lab_pid(name)
        return pid is not None and not Path(f"/proc/{pid}").exists() and (tag is None or name.startswith(tag + "-"))

    out = _run(["ip", "netns", "list"], check=False).stdout
    removed = []
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        if stale(name):
            kill_namespace_processes(name)
            _run(["ip", "netns", "del", name], check=False)
            shutil.rmtree(ETC_NETNS / name, ignore_errors=True)
            removed.append(name)
    if ETC_NETNS.is_dir():
        for d in ETC_NETNS.iterdir():  # entries whose namespace was deleted without them
            if d.name not in removed and stale(d.name):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d.name)
    with contextlib.suppress(OSError):
        ETC_NETNS.rmdir()
    return removed


# -- throughput check: TCP streams from host 1 to host 0 ---------------------------------------------------
_SINK = r"""
import socket, sys, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2]))); srv.listen(64)
def drain(c):
    while c.recv(1 << 20):
        pass
while True:
    c, _ = srv.accept()
    threading.Thread(target=drain, args=(c,), daemon=True).start()
"""

_SOURCE = r"""
import socket, sys, threading, time
host, port, streams, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
buf = b"\0" * (1 << 20); sent = [0] * streams
def push(k):
    s = socket.create_connection((host, port)); end = time.monotonic() + seconds
    while time.monotonic() < end:
        sent[k] += s.send(buf)
    s.close()
threads = [threading.Thread(target=push, args=(k,)) for k in range(streams)]
t0 = time.monotonic(); [t.start() for t in threads]; [t.join() for t in threads]
print(sum(sent) * 8 / (time.monotonic() - t0) / 1e6)
"""


def measure_mbit(lab: Hosts, streams: int, seconds: float = 3.0, port: int = 5201) -> float:
    """Throughput (Mbit/s) of `streams` parallel TCP connections from host 1 to host 0."""
    sink = lab.popen(
        0, [sys.executable, "-c", _SINK, lab.addr(0), str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            probe = f"import socket; socket.create_connection(({lab.addr(0)!r}, {port}), timeout=1).close()"
            if subprocess.run(lab.argv(1, [sys.executable, "-c", probe]), capture_output=True).returncode == 0:
                break
            if time.monotonic() > deadline:
                raise NetLabError("throughput check: the sink on host 0 did not start")
            time.sleep(0.1)
        r = subprocess.run(
            lab.argv(1, [sys.executable, "-c", _SOURCE, lab.addr(0), str(port), str(streams), str(seconds)]),
            capture_output=True,
            text=True,
            timeout=seconds + 60,
        )
        if r.returncode != 0:
            raise NetLabError(f"throughput check failed: {r.stderr.strip()}")
        return float(r.stdout.strip())
    finally:
        _kill_tree(sink)
