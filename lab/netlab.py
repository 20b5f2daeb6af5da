#!/usr/bin/env python
"""Network lab: several "hosts" on one machine, as Linux network namespaces behind a shaped link.

Each host is a namespace `dbn<pid>-h<i>` with one interface (eth0, 10.250.0.<i+1>/24) wired by a veth pair to a
bridge in a switch namespace `dbn<pid>-sw`. Nothing is added to the calling namespace, and every address lives
inside the lab's own namespaces. Each host's egress is shaped with `tc`:

    htb root 1:  ->  class 1:1  rate = ceil = link cap                       (the NIC)
                       -> 256 leaf classes 1:100..1:1ff  rate link/256, ceil = per-flow cap
    u32 filter: TCP packets are hashed on the low 8 bits of their source port into the 256 leaves, so each
    TCP connection (flow) is held to the per-flow cap while all of them share the link cap; anything that is not
    TCP goes to the default leaf 1:2 (link rate).

The switch side of each veth caps the host's ingress at the link rate too. Inside each host, the machine's
hostname resolves to that host's address (an /etc/netns/<ns>/hosts file, which `ip netns exec` mounts).
A per-flow cap of about a third of the link reproduces the record's situation: one stream reaches ~1/3 of
the link, several streams fill it.
Two flows whose source ports share the low 8 bits share a leaf.

Packets: by default the kernel hands the shapers GSO packets of up to 64 KB, and htb sends a packet whole once its
class has any tokens, so connections sharing the link are served one such burst after another: a message of a few
tens of KB on the first leaf served goes out at the link's speed and the others wait, which no switch does.
`packet_segs=N` (`--packet-segs N`) sets `gso_max_segs N` on both ends of every veth (and a DRR quantum of N
frames), so the shapers see packets of at most N MSS and interleave connections nearly as a switch's queue does.
4 connections sending 20 KB messages at once over a 40 Mbit/s link, each connection's bytes over its busy time:
4.6, 2.4, 1.6 and 1.2 MB/s with 64 KB GSO packets; 1.8-1.2 MB/s with N = 8; 1.26-1.36 with N = 4; 1.29-1.32 with
N = 1. Every packet costs CPU in the sending and receiving host: at 16 lab hosts on 2 cores, N = 1 took a rank
446 ms of CPU per step, N = 4 223-296 ms, against 122 ms with GSO; the hop-level runs use N = 4.

Use it from Python (`with NetLab(2, link_mbit=1000, flow_mbit=333) as lab: lab.run_all(...)`) or as a command:

    sudo python -m lab.netlab --hosts 2 --link-mbit 1000 --flow-mbit 333 -- \\
        python -c "print('host {rank} of {world} at {addr}, master {master}')"
    sudo python -m lab.netlab --hosts 2 --link-mbit 1000 --flow-mbit 333 --check   # measure the shaping
    sudo python -m lab.netlab --hosts 2 --link-mbit 1000 --flow-mbit 333 --check --profile one-slow --both-ways
    sudo python -m lab.netlab --cleanup     # remove namespaces left by labs whose process died

`{rank}`, `{world}`, `{addr}` and `{master}` in the command are replaced per host (other braces pass through).
The lab is torn down when the block or command ends, on an exception, on Ctrl-C and on SIGTERM/SIGHUP: every process
inside its namespaces is ended (`ip netns pids`), then the namespaces and their /etc/netns entries are removed.
After a SIGKILL of the lab itself, `--cleanup` does the same for every lab whose process is gone.
Ending processes, clean-up and the throughput check are in lab/netlab_procs.py (re-exported here).
Run it from the repository root, as a module (`python -m lab.netlab`).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# `python lab/netlab.py` puts lab/ on sys.path, not the repository: the imports below are lab.*.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Processes and namespaces (netlab_procs.py); imported here too by the tests and lab/bench_allreduce.py.
from lab import netlab_flows  # noqa: E402
from lab.netlab_procs import (  # noqa: E402, F401
    _SINK,
    _SOURCE,
    ETC_NETNS,
    PREFIX,
    NetLabError,
    _kill_tree,
    _run,
    cleanup_stale,
    kill_namespace_processes,
    measure_mbit,
    namespace_pids,
)

SUBNET = "10.250.0"
FLOW_CLASSES = 256  # leaves selected by the low 8 bits of the TCP source port
# Rates tc's htb shapes faithfully: below ~0.1 Mbit/s a leaf's share (link / 512) rounds to nothing.
MIN_MBIT, MAX_MBIT = 0.1, 1_000_000.0


def available() -> str | None:
    """None when a lab can be built here, else the reason it cannot."""
    if os.geteuid() != 0:
        return "the network lab needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the network lab needs '{tool}' (apt-get install iproute2)"
    return None


def _mbit(v: float) -> str:
    return f"{int(round(v * 1000))}kbit"


class NetLab:
    """N hosts in network namespaces joined by a bridge; see the module docstring for the shaping."""

    def __init__(
        self,
        hosts: int,
        link_mbit: float | None = None,
        flow_mbit: float | None = None,
        tag: str | None = None,
        burst_ms: float | None = None,
        packet_segs: int | None = None,
    ):
        if hosts < 1 or hosts > 250:
            raise ValueError(f"hosts: expected 1..250, got {hosts}")
        if flow_mbit is not None and link_mbit is None:
            raise ValueError("a per-flow cap needs a link cap (flow_mbit without link_mbit)")
        for name, rate in (("link_mbit", link_mbit), ("flow_mbit", flow_mbit)):
            if rate is not None and not (math.isfinite(rate) and MIN_MBIT <= rate <= MAX_MBIT):
                raise ValueError(f"{name}: expected a rate from {MIN_MBIT:g} to {MAX_MBIT:g} Mbit/s, got {rate}")
        if burst_ms is not None and not (math.isfinite(burst_ms) and 0.1 <= burst_ms <= 1000):
            raise ValueError(f"burst_ms: expected 0.1 to 1000 ms, got {burst_ms}")
        self.hosts, self.link_mbit, self.flow_mbit, self.burst_ms = hosts, link_mbit, flow_mbit, burst_ms
        if packet_segs is not None and not 1 <= packet_segs <= 64:
            raise ValueError(f"packet_segs: expected 1 to 64 MSS per packet, got {packet_segs}")
        self.packet_segs = packet_segs
        self.tag = tag or f"{PREFIX}{os.getpid()}"
        if not re.fullmatch(r"[a-z0-9]{1,12}", self.tag):
            raise ValueError(f"tag: expected 1-12 lowercase letters/digits, got {self.tag!r}")
        self.switch = f"{self.tag}-sw"
        self.names = [f"{self.tag}-h{i}" for i in range(hosts)]
        self._created: list[str] = []
        self._old_handlers: dict = {}
        self._procs: list[subprocess.Popen] = []

    # -- life cycle -------------------------------------------------------------------------------------
    def __enter__(self) -> NetLab:
        self._install_signal_handlers()
        try:
            self.up()
        except BaseException:
            self.down()
            self._restore_signal_handlers()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.down()
        finally:
            self._restore_signal_handlers()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum, frame):
            raise SystemExit(128 + signum)  # unwinds through __exit__, which removes the namespaces

        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, handler)

    def _restore_signal_handlers(self) -> None:
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers.clear()

    def up(self) -> None:
        reason = available()
        if reason:
            raise NetLabError(reason)
        self._netns_add(self.switch)
        _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        for i, ns in enumerate(self.names):
            self._netns_add(ns)
            _run(["ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}", "netns", self.switch])
            _run(["ip", "-n", self.switch, "link", "set", f"p{i}", "master", "br0", "up"])
            if self.packet_segs is not None:  # packets of at most N MSS through both shapers (the docstring)
                segs = str(self.packet_segs)
                _run(["ip", "-n", ns, "link", "set", "eth0", "gso_max_segs", segs])
                _run(["ip", "-n", self.switch, "link", "set", f"p{i}", "gso_max_segs", segs])
            _run(["ip", "-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            self._hosts_file(ns, self.addr(i))
            if self.link_mbit is not None:
                self._tc_batch(ns, self._egress_rules("eth0"))
                self._tc_batch(self.switch, self._ingress_rules(f"p{i}"))
        for i in range(1, self.hosts):  # wait until the bridge forwards (ARP, port state)
            self._wait_reachable(0, i)

    def down(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                _kill_tree(p)
        self._procs.clear()
        for ns in reversed(self._created):
            # Processes that left the child's process group (torchrun's workers start their own sessions) would
            # outlive `ip netns del` in a namespace without a name: end everything that runs inside first.
            kill_namespace_processes(ns)
            _run(["ip", "netns", "del", ns], check=False)  # deleting a namespace removes its links and qdiscs
            shutil.rmtree(ETC_NETNS / ns, ignore_errors=True)
        self._created.clear()
        with contextlib.suppress(OSError):
            ETC_NETNS.rmdir()  # only if no other namespace configuration is left in it

    def _hosts_file(self, ns: str, addr: str) -> None:
        """/etc/netns/<ns>/hosts, which `ip netns exec` mounts over /etc/hosts: inside host i, this machine's
        hostname resolves to host i's own address, as on a real machine (libraries that find their address
        from the hostname, like Gloo without an interface name, then use the lab link, not loopback)."""
        d = ETC_NETNS / ns
        d.mkdir(parents=True, exist_ok=True)
        (d / "hosts").write_text(f"127.0.0.1\tlocalhost\n{addr}\t{socket.gethostname()}\n")

    def _netns_add(self, ns: str) -> None:
        _run(["ip", "netns", "add", ns])
        self._created.append(ns)
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])

    # -- shaping ----------------------------------------------------------------------------------------
    def _egress_rules(self, dev: str) -> list[str]:
        link, ms = _mbit(self.link_mbit), self.burst_ms
        rules = [
            f"qdisc add dev {dev} root handle 1: htb default 2",
            f"class add dev {dev} parent 1: classid 1:1 htb rate {link} ceil {link} "
            + netlab_flows.burst_words(self.link_mbit, self.link_mbit, ms, "256k"),
            f"class add dev {dev} parent 1:1 classid 1:2 htb rate {_mbit(self.link_mbit / 2)} ceil {link} "
            + netlab_flows.burst_words(self.link_mbit / 2, self.link_mbit, ms, "64k"),
        ]
        if self.flow_mbit is None:
            return rules
        leaf_mbit = max(self.link_mbit / (2 * FLOW_CLASSES), 0.01)
        flow_mbit = min(self.flow_mbit, self.link_mbit)
        leaf_rate, flow = _mbit(leaf_mbit), _mbit(flow_mbit)
        for h in range(FLOW_CLASSES):
            rules.append(
                f"class add dev {dev} parent 1:1 classid 1:{0x100 + h:x} htb rate {leaf_rate} ceil {flow} "
                + netlab_flows.burst_words(leaf_mbit, flow_mbit, ms, "128k")
                + " "
                + netlab_flows.quantum_words(self.packet_segs)
            )
        # Leaves a flow profile pins connections to (lab/netlab_flows.py: prio 1 filters, ahead of the hash).
        pin_mbit = max(self.link_mbit / (2 * netlab_flows.PIN_LEAVES), 0.01)
        for h in range(netlab_flows.PIN_LEAVES):
            rules.append(
                f"class add dev {dev} parent 1:1 classid 1:{netlab_flows.PIN_BASE + h:x} htb rate {_mbit(pin_mbit)} "
                f"ceil {flow} "
                + netlab_flows.burst_words(pin_mbit, flow_mbit, ms, "128k")
                + " "
                + netlab_flows.quantum_words(self.packet_segs)
            )
        rules += [
            f"filter add dev {dev} parent 1: prio 2 handle 2: protocol ip u32 divisor {FLOW_CLASSES}",
            # IPv4 without options (Linux TCP never sets any): the TCP source port is the high half of word 20.
            f"filter add dev {dev} parent 1: prio 2 protocol ip u32 ht 800:: match ip protocol 6 0xff "
            "hashkey mask 0x00ff0000 at 20 link 2:",
        ]
        for h in range(FLOW_CLASSES):
            rules.append(
                f"filter add dev {dev} parent 1: prio 2 protocol ip u32 ht 2:{h:x}: match u32 0 0 "
                f"flowid 1:{0x100 + h:x}"
            )
        return rules

    def _ingress_rules(self, dev: str) -> list[str]:
        link = _mbit(self.link_mbit)
        return [
            f"qdisc add dev {dev} root handle 1: htb default 1",
            f"class add dev {dev} parent 1: classid 1:1 htb rate {link} ceil {link} "
            + netlab_flows.burst_words(self.link_mbit, self.link_mbit, self.burst_ms, "256k"),
        ]

    def _tc_batch(self, ns: str, rules: list[str]) -> None:
        with tempfile.NamedTemporaryFile("w", suffix=".tc", delete=False) as f:
            f.write("\n".join(rules) + "\n")
        try:
            _run(["ip", "netns", "exec", ns, "tc", "-batch", f.name])
        finally:
            os.unlink(f.name)

    # -- running things ---------------------------------------------------------------------------------
    def addr(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def argv(self, i: int, argv: list[str]) -> list[str]:
        """`argv` wrapped to run inside host i."""
        return ["ip", "netns", "exec", self.names[i], *argv]

    def popen(self, i: int, argv: list[str], **kw) -> subprocess.Popen:
        p = subprocess.Popen(self.argv(i, argv), start_new_session=True, **kw)
        self._procs.append(p)
        return p

    def run_all(
        self, argv_for, env_for=None, timeout: float = 600, cwd: str | None = None, per_host: int = 1
    ) -> list[tuple[int, str]]:
        """Run `argv_for(r)` for every process r at once; returns [(returncode, output)] per process.

        `per_host`: processes per host (a multi-GPU host's local ranks), numbered as torchrun numbers them: process r
        runs in host r // per_host as its local rank r % per_host, and its local ranks reach each other inside the
        host's namespace (over loopback), the other hosts over the shaped link.
        If one process fails, the others are stopped (a collective would wait for it until its own timeout);
        if `timeout` passes, all are killed and their return code is -9.
        """
        if per_host < 1:
            raise ValueError(f"per_host: expected 1 or more processes per host, got {per_host}")
        n = self.hosts * per_host
        outs = [tempfile.TemporaryFile("w+") for _ in range(n)]
        procs = []
        for r in range(n):
            env = {**os.environ, **(env_for(r) if env_for else {})}
            procs.append(
                self.popen(r // per_host, argv_for(r), stdout=outs[r], stderr=subprocess.STDOUT, env=env, cwd=cwd)
            )
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
                time.sleep(1.0 if time.monotonic() <= deadline else 0)  # let a failing peer finish its message
                for p in procs:
                    if p.poll() is None:
                        _kill_tree(p)
                break
            time.sleep(0.05)
        results = []
        for p, f in zip(procs, outs, strict=True):
            p.wait()
            f.seek(0)
            results.append((p.returncode, f.read()))
            f.close()
        return results

    def _wait_reachable(self, src: int, dst: int, timeout: float = 10.0) -> None:
        code = (
            "import socket, sys, time\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"s.connect(({self.addr(dst)!r}, 9)); s.send(b'x')\n"
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = subprocess.run(self.argv(src, [sys.executable, "-c", code]), capture_output=True, timeout=30)
            neigh = _run(["ip", "-n", self.names[src], "neigh", "show", self.addr(dst)], check=False).stdout
            if r.returncode == 0 and ("REACHABLE" in neigh or "STALE" in neigh or "DELAY" in neigh):
                return
            time.sleep(0.1)
        raise NetLabError(f"host {dst} ({self.addr(dst)}) not reachable from host {src} after {timeout:.0f} s")


_PLACEHOLDER = re.compile(r"\{(rank|world|addr|master)\}")


def substitute(arg: str, **values) -> str:
    """`arg` with {rank}, {world}, {addr} and {master} replaced; any other brace is left as it is (no str.format:
    a command such as `python -c "d = {'a': 1}"` passes through)."""
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), arg)


def print_flows(
    lab: NetLab, profile: str, seed: int, flow_mbit: float, streams: int = 4, both_ways: bool = False
) -> list:
    """The throughput check under a flow profile: every connection's leaf, ceiling and measured rate (`both_ways`:
    host 0 sends back on the same connections at once, and each direction is a row)."""
    rates = netlab_flows.measure_flows(
        lab, streams, profile=profile, seed=seed, flow_mbit=flow_mbit, both_ways=both_ways
    )
    for src in sorted({r.src for r in rates}, reverse=True):
        rows = [r for r in rates if r.src == src]
        total = sum(r.mbit for r in rows)
        also = " (host 0 sending back at the same time)" if both_ways and src == 1 else ""
        also = " (host 1 sending at the same time)" if src == 0 else also
        print(
            f"\n{profile} (seed {seed}), {streams} connections host {src} -> {1 - src}{also}, together "
            f"{total:.1f} Mbit/s"
        )
        print("| connection | source port | leaf | ceiling Mbit/s | measured Mbit/s |")
        print("|---:|---:|---|---:|---:|")
        for r in rows:
            print(f"| {r.k} | {r.sport} | {r.leaf} | {r.ceil_mbit:.1f} | {r.mbit:.1f} |", flush=True)
    return rates


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=2, help="number of hosts (namespaces)")
    ap.add_argument("--link-mbit", type=float, default=None, help="link cap per host and direction (Mbit/s)")
    ap.add_argument("--flow-mbit", type=float, default=None, help="cap of one TCP connection (Mbit/s)")
    ap.add_argument("--timeout", type=float, default=3600, help="kill the command after this many seconds")
    ap.add_argument("--check", action="store_true", help="measure 1, 2, 3, 4 and 8 TCP streams between 2 hosts")
    ap.add_argument("--cleanup", action="store_true", help="remove namespaces of labs whose process died")
    ap.add_argument(
        "--profile",
        choices=netlab_flows.PROFILES,
        default=None,
        help="--check: 4 connections pinned to leaves as this flow profile says (lab/netlab_flows.py); each "
        "connection's leaf and rate are printed",
    )
    ap.add_argument("--seed", type=int, default=0, help="--profile: the seed of one-slow's and random's draws")
    ap.add_argument(
        "--both-ways",
        action="store_true",
        help="--profile: host 0 sends back on the same 4 connections at the same time, its ends pinned as the "
        "profile says for host 0; each direction's rates are printed",
    )
    ap.add_argument(
        "--burst-ms",
        type=float,
        default=None,
        help="each shaping class's token-bucket burst, in milliseconds of its rate (default: fixed 128-256 KB)",
    )
    ap.add_argument(
        "--packet-segs",
        type=int,
        default=None,
        metavar="N",
        help="packets of at most N MSS through the shapers (gso_max_segs N), so connections interleave as at a "
        "switch (default: the kernel's 64 KB GSO packets)",
    )
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- command to run in every host")
    args = ap.parse_args(argv)
    if args.cleanup:
        removed = cleanup_stale()
        print(f"removed {len(removed)} stale namespace(s){': ' + ', '.join(removed) if removed else ''}")
        return 0
    if args.hosts < 1:
        print(f"netlab: error: --hosts: expected 1 or more, got {args.hosts}", file=sys.stderr)
        return 2
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not args.check and not cmd:
        ap.error("give a command after --, or --check, or --cleanup")
    reason = available()
    if reason:
        print(f"netlab: {reason}", file=sys.stderr)
        return 2
    try:
        lab = NetLab(
            max(args.hosts, 2 if args.check else 1),
            args.link_mbit,
            args.flow_mbit,
            burst_ms=args.burst_ms,
            packet_segs=args.packet_segs,
        )
    except ValueError as e:
        print(f"netlab: error: {e}", file=sys.stderr)
        return 2
    with lab:
        if args.check:
            print(f"| TCP streams | Mbit/s (link cap {args.link_mbit}, per-flow cap {args.flow_mbit}) |")
            print("|---:|---:|")
            for k in (1, 2, 3, 4, 8):
                print(f"| {k} | {measure_mbit(lab, k):.0f} |", flush=True)
            if args.profile and args.flow_mbit:
                print_flows(lab, args.profile, args.seed, args.flow_mbit, both_ways=args.both_ways)
            return 0
        fmt = {"world": lab.hosts, "master": lab.addr(0)}
        results = lab.run_all(
            lambda i: [substitute(a, rank=i, addr=lab.addr(i), **fmt) for a in cmd], timeout=args.timeout
        )
        for i, (rc, out) in enumerate(results):
            for line in out.splitlines():
                print(f"[host {i}] {line}")
            if rc != 0:
                print(f"[host {i}] exited with {rc}", file=sys.stderr)
        return max((abs(rc) for rc, _ in results), default=0)


if __name__ == "__main__":
    sys.exit(main())
