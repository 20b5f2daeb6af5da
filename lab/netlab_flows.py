"""Uneven flows in the network lab: named profiles of per-connection ceilings, and pinning connections to leaves.

The lab (lab/netlab.py) hashes every TCP connection onto one of 256 leaf classes by the low 8 bits of its source
port, as a switch hashes the 5-tuple onto a path; every hashed leaf has the same ceiling (the per-flow cap). A
*profile* makes the flows unequal on purpose. Each host pins its own connections (by source port and destination)
to leaves of their own, numbered from `PIN_BASE`, whose ceilings come from the profile:

    even       every connection at the per-flow cap (the lab without a profile)
    one-slow   to each peer, one of the host's K connections at a third of the per-flow cap (which one: seeded)
    collide    to each peer, the host's connections forced into shared leaves two by two (K/2 leaves for K flows)
    random     every connection's ceiling drawn from the seeded uniform distribution of 0.2 to 1.0 x the cap

A connection is named by (host, peer, k): k is its index among the K connections one contender opened from this
host to that peer (multistream: communicator k; DDP on K gloo devices: the k-th by source port). The ceilings depend
on (profile, seed, host, peer, k) only, so two contenders run on the same leaf ceilings in the same run. Pinning is
done from inside the host (its process is root in its namespace): `pin_commands` gives the `tc -batch` lines,
`established` lists the host's connections from /proc/net/tcp. The profiles themselves (`leaf_for`) live in
lab/flow_profiles.py, where the flow model draws the same networks.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import tempfile
from dataclasses import dataclass

from lab.flow_profiles import PROFILES, leaf_for  # noqa: F401 - the profiles are the model's

PIN_BASE = 0x400  # pinned leaves 1:400..1:5ff; hashed leaves are 1:100..1:1ff
PIN_LEAVES = 512


def _ip(hexaddr: str) -> str:
    return socket.inet_ntoa(struct.pack("<I", int(hexaddr, 16)))


def established(path: str = "/proc/net/tcp") -> set[tuple[int, str, int]]:
    """(local port, remote address, remote port) of every established IPv4 TCP connection of this namespace."""
    out = set()
    with open(path) as f:
        next(f)
        for line in f:
            cols = line.split()
            if cols[3] != "01":  # TCP_ESTABLISHED
                continue
            laddr, lport = cols[1].split(":")
            raddr, rport = cols[2].split(":")
            if _ip(raddr).startswith("127."):
                continue
            out.add((int(lport, 16), _ip(raddr), int(rport, 16)))
    return out


@dataclass(frozen=True)
class Pin:
    """One connection of this host pinned to pinned leaf `leaf` (0..PIN_LEAVES-1) with ceiling `ceil_mbit`."""

    sport: int
    dst: str
    leaf: int
    ceil_mbit: float
    # matched too: one port may serve several connections (a listener's, such as the throughput check's host 0, or
    # the one gloo device the hop ring's groups share)
    dport: int | None = None

    @property
    def classid(self) -> str:
        return f"1:{PIN_BASE + self.leaf:x}"


def pins_for(
    conns: list[list[tuple[int, str, int]]],
    *,
    profile: str,
    seed: int,
    host: int,
    peer_of: dict[str, int],
    flow_mbit: float,
    first_leaf: int = 0,
    one_way: bool = False,
    draws: int | None = None,
    peer_of_conn: dict[tuple[int, str, int], int] | None = None,
) -> list[Pin]:
    """Pins for one contender: `conns[g]` are the connections its g-th process group opened on this host. With one
    group per flow (multistream) connection k to a peer is group k's; with one group of K devices (DDP), the K
    connections to a peer in source-port order. Leaves are numbered from `first_leaf`.

    `one_way`: the contender sends on half its groups and receives on the other half (the hop ring at 2 hosts), so
    its connections to a peer are two sets of K, one per direction: connection k of either set takes the profile's
    draw k of K, on a leaf of its own. This host's data then meets the same K ceilings as a contender whose K
    connections carry both directions, and its ACKs leave through leaves no data of its own waits in.

    `draws`: the profile draws K ceilings per peer and connection k takes draw k (a contender with fewer connections
    than the others' K, Horovod's one per peer: its connection 0 meets the ceiling of everyone's connection 0);
    None: one draw per connection.

    `peer_of_conn`: the peer of each connection by the connection itself, not its address (hosts that run several
    local ranks: `host` and the peers are then ranks, and each pair of ranks on different hosts has its own K draws)."""

    def peer(c: tuple[int, str, int]) -> int:
        return peer_of_conn[c] if peer_of_conn is not None else peer_of[c[1]]

    by_peer: dict[int, list[tuple[int, str, int]]] = {}
    for group in conns:
        per_peer: dict[int, list] = {}
        for c in sorted(group):
            per_peer.setdefault(peer(c), []).append(c)
        for p, cs in per_peer.items():
            by_peer.setdefault(p, []).extend(cs)
    pins, leaf = [], first_leaf
    for p in sorted(by_peer):
        cs = by_peer[p]
        dst = cs[0][1]
        if one_way and len(cs) % 2:
            raise ValueError(f"one-way pins: {len(cs)} connections to {dst}, expected two sets of equal size")
        per_way = len(cs) // 2 if one_way else len(cs)
        if draws is not None and per_way > draws:
            raise ValueError(f"pins: {per_way} connections to {dst}, more than the profile's {draws} draws")
        flows = per_way if draws is None else draws
        slots: dict[tuple[int, int], int] = {}
        for i, (sport, _, dport) in enumerate(cs):
            way, k = divmod(i, per_way)
            spec = leaf_for(profile, seed=seed, host=host, peer=p, k=k, flows=flows, flow_mbit=flow_mbit)
            if (way, spec.slot) not in slots:
                slots[(way, spec.slot)] = leaf
                leaf += 1
            pins.append(Pin(sport, dst, slots[(way, spec.slot)], spec.ceil_mbit, dport))
    if leaf > PIN_LEAVES:
        raise ValueError(f"{leaf} pinned leaves needed, the lab has {PIN_LEAVES}")
    return pins


def burst_words(rate_mbit: float, ceil_mbit: float, burst_ms: float | None, default: str) -> str:
    """An htb class's `burst ... cburst ...`: `default` (e.g. "128k") for both, or `burst_ms` milliseconds of the
    class's rate and of its ceiling (at least two full-size frames). A token bucket lets an idle class send its
    burst at once, so a burst that is large against the messages makes small messages look fast; at a lab's low
    rates the fixed 128 KB is tens of milliseconds, where a real network's buffers are a few."""
    if burst_ms is None:
        return f"burst {default} cburst {default}"

    def size(mbit: float) -> int:
        return max(3028, int(mbit * 1e6 / 8 * burst_ms / 1000))

    return f"burst {size(rate_mbit)}b cburst {size(ceil_mbit)}b"


def quantum_words(packet_segs: int | None) -> str:
    """An htb leaf's DRR quantum: 64 KB (one GSO packet) by default; the largest packet under `packet_segs` (N
    full-size frames), so leaves borrowing the link take turns a packet at a time, as a switch's queue serves flows."""
    return f"quantum {65536 if packet_segs is None else 1514 * packet_segs}"


def _kbit(mbit: float) -> str:
    return f"{max(1, int(round(mbit * 1000)))}kbit"


def pin_commands(
    pins: list[Pin],
    dev: str = "eth0",
    link_mbit: float | None = None,
    burst_ms: float | None = None,
    packet_segs: int | None = None,
) -> list[str]:
    """`tc -batch` lines: each pinned leaf's ceiling (and the lab's burst, `burst_words`), then
    one exact-match filter per connection (ahead of the source-port hash, which keeps every other connection)."""
    rate_mbit = max((link_mbit or 1.0) / (2 * PIN_LEAVES), 0.01)
    lines, seen = [], set()
    for p in pins:
        if p.leaf not in seen:
            seen.add(p.leaf)
            lines.append(
                f"class change dev {dev} parent 1:1 classid {p.classid} htb rate {_kbit(rate_mbit)} "
                f"ceil {_kbit(p.ceil_mbit)} "
                + burst_words(rate_mbit, p.ceil_mbit, burst_ms, "128k")
                + " "
                + quantum_words(packet_segs)
            )
    for p in pins:
        lines.append(
            f"filter add dev {dev} parent 1: prio 1 protocol ip u32 match ip protocol 6 0xff "
            f"match ip sport {p.sport} 0xffff "
            + ("" if p.dport is None else f"match ip dport {p.dport} 0xffff ")
            + f"match ip dst {p.dst}/32 flowid {p.classid}"
        )
    return lines


def clear_pins(dev: str = "eth0") -> None:
    """Remove every pin on this namespace's `dev` (the prio 1 filters; the hash stays): a pin outlives its
    connection, and a later connection that happened to get the same port would otherwise land in its leaf."""
    subprocess.run(["tc", "filter", "del", "dev", dev, "parent", "1:", "prio", "1"], capture_output=True, timeout=60)


def apply_pins(
    pins: list[Pin],
    dev: str = "eth0",
    link_mbit: float | None = None,
    burst_ms: float | None = None,
    packet_segs: int | None = None,
) -> None:
    """Install `pins` on this namespace's `dev` (run inside the lab host, as root)."""
    with tempfile.NamedTemporaryFile("w", suffix=".tc", delete=False) as f:
        f.write("\n".join(pin_commands(pins, dev, link_mbit, burst_ms, packet_segs)) + "\n")
    try:
        r = subprocess.run(["tc", "-batch", f.name], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"tc -batch (pinning {len(pins)} connections) failed: {r.stderr.strip()}")
    finally:
        os.unlink(f.name)


# -- the throughput check, per connection: K streams from host 1 to host 0 under a profile -----------------
# One end of the check's K connections: host 1 connects, and pushes on each for `seconds`; host 0 accepts (both
# ways only: otherwise netlab_procs' sink drains them) and pushes back on each. Each end drains what the other sends
# and prints its own rate per connection: the bytes its socket took over the time it pushed.
_PEER = r"""
import json, socket, sys, threading, time
role, host, port, streams, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
back = sys.argv[6] == "1"
if role == "accept":
    srv = socket.create_server((host, port), backlog=streams)
    print("listening", flush=True)
    conns = [srv.accept()[0] for _ in range(streams)]
    print(json.dumps([c.getpeername()[1] for c in conns]), flush=True)  # each by host 1's port
else:
    conns = [socket.create_connection((host, port)) for _ in range(streams)]
    print(json.dumps([c.getsockname()[1] for c in conns]), flush=True)
sys.stdin.readline()  # the driver pinned them
for c in conns:
    c.settimeout(0.5)  # the other end stops reading when its time is up
buf = b"\0" * (1 << 20); sent = [0] * streams; took = [seconds] * streams
t0 = time.monotonic(); end = t0 + seconds
def push(k):
    while time.monotonic() < end:
        try:
            sent[k] += conns[k].send(buf)
        except TimeoutError:  # the other end is not reading yet, or has stopped: try again until the end
            continue
        except OSError:  # the connection is gone: its rate is what it carried while it was up
            break
    took[k] = time.monotonic() - t0
def drain(k):
    while time.monotonic() < end + 1:
        try:
            if not conns[k].recv(1 << 20):
                return
        except TimeoutError:
            continue
        except OSError:
            return
threads = [threading.Thread(target=push, args=(k,)) for k in range(streams)]
threads += [threading.Thread(target=drain, args=(k,)) for k in range(streams)] if back else []
[t.start() for t in threads]; [t.join() for t in threads[:streams]]
print(json.dumps([s * 8 / t / 1e6 for s, t in zip(sent, took)]), flush=True)
"""


@dataclass(frozen=True)
class FlowRate:
    k: int  # the connection, by host 1's port (the same k both ways)
    sport: int
    leaf: str
    ceil_mbit: float
    mbit: float
    src: int = 1  # the sending host: 1, or 0 for the way back (both ways)


def _pin_host(lab, host: int, pins: list[Pin]) -> None:
    from lab.netlab_procs import NetLabError

    with tempfile.NamedTemporaryFile("w", suffix=".tc", delete=False) as f:
        f.write("\n".join(pin_commands(pins, "eth0", lab.link_mbit, lab.burst_ms, lab.packet_segs)) + "\n")
    try:
        r = subprocess.run(lab.argv(host, ["tc", "-batch", f.name]), capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise NetLabError(f"throughput check: pinning on host {host} failed: {r.stderr.strip()}")
    finally:
        os.unlink(f.name)


def measure_flows(
    lab,
    streams: int,
    *,
    profile: str,
    seed: int,
    flow_mbit: float,
    seconds: float = 3.0,
    port: int = 5202,
    both_ways: bool = False,
) -> list[FlowRate]:
    """Each of `streams` TCP connections from host 1 to host 0, pinned as `profile` says: its leaf and its rate.

    `both_ways`: host 0 sends back on every connection at the same time, its end pinned as the profile says for
    host 0 (by host 1's port, since host 0's ends share one port); the rows for host 0 -> 1 follow (`src` 0). A
    connection whose two directions both carry data has its ACKs of one direction queued with the other
    direction's data, which is what the hop ring avoids at 2 ranks (recipes/comm/hopring.py)."""
    import json
    import sys
    import time

    from lab.netlab_procs import _SINK, NetLabError, _kill_tree

    way = "1" if both_ways else "0"
    if both_ways:
        sink = lab.popen(
            0,
            [sys.executable, "-c", _PEER, "accept", lab.addr(0), str(port), str(streams), str(seconds), way],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
    else:
        sink = lab.popen(
            0,
            [sys.executable, "-c", _SINK, lab.addr(0), str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    src = None
    try:
        if both_ways:
            if sink.stdout.readline().strip() != "listening":
                raise NetLabError("throughput check: the peer on host 0 did not start")
        else:
            deadline = time.monotonic() + 10
            probe = f"import socket; socket.create_connection(({lab.addr(0)!r}, {port}), timeout=1).close()"
            while subprocess.run(lab.argv(1, [sys.executable, "-c", probe]), capture_output=True).returncode != 0:
                if time.monotonic() > deadline:
                    raise NetLabError("throughput check: the sink on host 0 did not start")
                time.sleep(0.1)
        src = lab.popen(
            1,
            [sys.executable, "-c", _PEER, "connect", lab.addr(0), str(port), str(streams), str(seconds), way],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ports = json.loads(src.stdout.readline())
        conns = [(p, lab.addr(0), port) for p in ports]
        pins = pins_for(
            [conns], profile=profile, seed=seed, host=1, peer_of={lab.addr(0): 0}, flow_mbit=flow_mbit, first_leaf=256
        )
        _pin_host(lab, 1, pins)
        back: dict[int, Pin] = {}
        if both_ways:
            accepted = json.loads(sink.stdout.readline())
            ends = [(port, lab.addr(1), p) for p in ports]  # host 0's ends, in the order of host 1's (sorted) pins
            spec = pins_for(
                [ends],
                profile=profile,
                seed=seed,
                host=0,
                peer_of={lab.addr(1): 1},
                flow_mbit=flow_mbit,
                first_leaf=256,
            )
            back = {
                e[2]: Pin(p.sport, p.dst, p.leaf, p.ceil_mbit, dport=e[2])
                for e, p in zip(sorted(ends), spec, strict=True)
            }
            _pin_host(lab, 0, list(back.values()))
        for p in (src, sink) if both_ways else (src,):
            p.stdin.write("go\n")
            p.stdin.flush()
        rates = json.loads(src.stdout.readline())
        by_port = {p.sport: p for p in pins}
        rows = [FlowRate(k, sp, by_port[sp].classid, by_port[sp].ceil_mbit, rates[k]) for k, sp in enumerate(ports)]
        if both_ways:
            got = dict(zip(accepted, json.loads(sink.stdout.readline()), strict=True))
            rows += [
                FlowRate(k, port, back[sp].classid, back[sp].ceil_mbit, got[sp], src=0) for k, sp in enumerate(ports)
            ]
        return rows
    finally:
        if src is not None:
            _kill_tree(src)
        _kill_tree(sink)
