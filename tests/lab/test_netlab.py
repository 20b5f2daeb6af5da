"""The network lab: namespaces, shaping (link cap and per-flow cap), clean-up; multistream across its hosts."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from support import ROOT

from lab import netlab

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(netlab.available() is not None, reason=str(netlab.available())),
]


def lab_namespaces(tag: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(tag + "-")]


def test_link_cap_and_per_flow_cap():
    link, flow = 200.0, 200.0 / 3
    with netlab.NetLab(2, link_mbit=link, flow_mbit=flow) as lab:
        one = netlab.measure_mbit(lab, 1, seconds=2)
        four = netlab.measure_mbit(lab, 4, seconds=2)
    assert 0.75 * flow < one < 1.15 * flow  # one TCP connection: held to the per-flow cap
    assert 0.8 * link < four < 1.1 * link  # several connections fill the link, and no more


def test_a_flow_profile_pins_each_connection_to_its_leaf():
    """one-slow: of 4 connections host 1 -> 0, the one the profile slows runs well below the others, each in a leaf
    of its own (lab/netlab_flows.py)."""
    link, flow = 40.0, 40.0 / 3
    with netlab.NetLab(2, link_mbit=link, flow_mbit=flow) as lab:
        rates = netlab.netlab_flows.measure_flows(lab, 4, profile="one-slow", seed=1, flow_mbit=flow, seconds=4)
    assert len({r.leaf for r in rates}) == 4 and all(r.leaf.startswith("1:5") for r in rates)
    slow = [r for r in rates if r.ceil_mbit < flow]
    fast = [r for r in rates if r.ceil_mbit == flow]
    assert len(slow) == 1 and slow[0].ceil_mbit == pytest.approx(flow / 3)
    # the sender counts what its socket took, so the slow one reads above its 4.4 Mbit/s by its buffer
    assert slow[0].mbit < 0.75 * min(r.mbit for r in fast)


def test_both_ways_pins_each_end_by_its_own_hosts_draws():
    """--both-ways: host 0 sends back on the same 4 connections, its ends pinned by host 0's draws (one-slow seed 0:
    host 1's slow connection is the 4th by its port, host 0's the 2nd); each direction's slow one runs well below
    that direction's fastest."""
    link, flow = 1000.0, 1000.0 / 3
    with netlab.NetLab(2, link_mbit=link, flow_mbit=flow) as lab:
        rates = netlab.netlab_flows.measure_flows(lab, 4, profile="one-slow", seed=0, flow_mbit=flow, both_ways=True)
    there, back = [r for r in rates if r.src == 1], [r for r in rates if r.src == 0]
    assert [r.k for r in there] == [r.k for r in back] == [0, 1, 2, 3]
    assert {r.sport for r in back} == {5202} and len({r.leaf for r in back}) == len({r.leaf for r in there}) == 4
    by_port = sorted(there, key=lambda r: r.sport)  # the draws index the connections by host 1's port
    slow_there = [i for i, r in enumerate(by_port) if r.ceil_mbit < flow]
    slow_back = [i for i, r in enumerate(by_port) if back[r.k].ceil_mbit < flow]
    assert slow_there == [3] and slow_back == [1]
    for rows in (there, back):
        slow = min(rows, key=lambda r: r.ceil_mbit)
        assert slow.ceil_mbit == pytest.approx(flow / 3, rel=0.01)
        assert slow.mbit < 0.5 * max(r.mbit for r in rows)


# 4 connections host 0 -> host 1; in each round the receiver asks every connection for MSG bytes at once, as a ring
# step does; the sender prints each connection's bytes over its busy time (recipes/comm/tcpinfo.py)
_ROUNDS = """
import os, socket, sys, threading
from recipes.comm import tcpinfo
K, MSG, ROUNDS = 4, 20000, 25
if sys.argv[1] == "recv":
    ls = socket.create_server(("0.0.0.0", 5555), backlog=K)
    conns = [ls.accept()[0] for _ in range(K)]
    def take(c):
        got = 0
        while got < MSG:
            got += len(c.recv(MSG - got))
    for _ in range(ROUNDS):
        for c in conns:
            c.sendall(b"?")
        ts = [threading.Thread(target=take, args=(c,)) for c in conns]
        [t.start() for t in ts]
        [t.join() for t in ts]
    [c.sendall(b"!") for c in conns]
else:
    conns = [socket.create_connection((sys.argv[2], 5555), source_address=("0.0.0.0", 41000 + k)) for k in range(K)]
    links = [tcpinfo.Link(c.fileno(), os.fstat(c.fileno()).st_ino) for c in conns]
    before = [link.read() for link in links]
    def give(c):
        c.recv(1)
        c.sendall(bytes(MSG))
    for _ in range(ROUNDS):
        ts = [threading.Thread(target=give, args=(c,)) for c in conns]
        [t.start() for t in ts]
        [t.join() for t in ts]
    [c.recv(1) for c in conns]
    print(" ".join(str(d.acked / d.busy_s / 1e6) for d in (link.read() - b for link, b in zip(links, before))))
"""


def test_small_packets_serve_connections_sharing_the_link_alike():
    """--packet-segs 4: 4 connections sending 20 KB at once over a 40 Mbit/s link (5 MB/s) each deliver about a
    quarter of it over their busy time, as at a switch (with GSO bursts the first leaf served read 4.6 MB/s)."""
    with netlab.NetLab(2, link_mbit=40, flow_mbit=40 / 3, burst_ms=2, packet_segs=4) as lab:
        recv = lab.popen(1, [sys.executable, "-c", _ROUNDS, "recv"], cwd=ROOT)
        time.sleep(0.5)
        send = lab.popen(0, [sys.executable, "-c", _ROUNDS, "send", lab.addr(1)], cwd=ROOT, stdout=subprocess.PIPE)
        out = send.communicate(timeout=60)[0]
        assert recv.wait(timeout=10) == 0 and send.returncode == 0
    rates = [float(x) for x in out.split()]
    assert len(rates) == 4
    assert max(rates) < 1.5 * min(rates), rates  # MB/s per connection
    assert 0.8 < min(rates) and max(rates) < 1.8, rates  # 5 MB/s shared by 4; a leaf's own ceiling is 1.67 MB/s


def test_namespaces_are_removed_on_exception_and_on_sigterm(tmp_path):
    lab = netlab.NetLab(2, link_mbit=100, flow_mbit=30, tag="dbntest1")
    with pytest.raises(RuntimeError, match="boom"), lab:
        assert len(lab_namespaces("dbntest1")) == 3  # two hosts and the switch
        raise RuntimeError("boom")
    assert lab_namespaces("dbntest1") == []
    # a lab run as a command, killed with SIGTERM while its hosts are busy
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lab.netlab",
            "--hosts",
            "2",
            "--link-mbit",
            "100",
            "--",
            "sleep",
            "60",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    tag = f"dbn{p.pid}"
    deadline = time.monotonic() + 30
    while len(lab_namespaces(tag)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(lab_namespaces(tag)) == 3
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)
    assert lab_namespaces(tag) == []


def test_run_all_stops_the_others_when_one_host_fails():
    with netlab.NetLab(2) as lab:
        t0 = time.monotonic()
        results = lab.run_all(lambda i: ["sh", "-c", "sleep 60" if i == 0 else "echo failing; exit 3"], timeout=60)
        assert time.monotonic() - t0 < 15
    assert results[1] == (3, "failing\n")
    assert results[0][0] != 0  # killed, not left running


def test_multistream_is_exact_across_lab_hosts(tmp_path):
    """Two hosts on a shaped link, one process each (as two machines would run), K and S in {1, 4}."""
    with netlab.NetLab(2, link_mbit=500, flow_mbit=170) as lab:
        env = lambda i: {
            "RANK": str(i),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",  # noqa: E731
            "MASTER_ADDR": lab.addr(0),
            "MASTER_PORT": "29500",
            "GLOO_SOCKET_IFNAME": "eth0",
            "KS_GRID": "1,4",
            "OMP_NUM_THREADS": "1",
        }
        results = lab.run_all(
            lambda i: [sys.executable, str(ROOT / "tests" / "comm_worker.py"), "equal", str(tmp_path)],
            env,
            timeout=300,
            cwd=str(ROOT),
        )
    for rc, out in results:
        assert rc == 0, out[-3000:]
    for r in range(2):
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert sorted(res["multistream"]) == ["K1S1", "K1S4", "K4S1", "K4S4"]
        assert all(m["vs_mean"] < 1e-6 and m["vs_ddp"] <= 1e-7 for m in res["multistream"].values())


def test_each_host_resolves_the_hostname_to_its_own_address():
    code = "import socket; print(socket.gethostbyname(socket.gethostname()))"
    with netlab.NetLab(2) as lab:
        results = lab.run_all(lambda i: [sys.executable, "-c", code], timeout=60)
        names = list(lab.names)
    assert [out.strip() for _, out in results] == ["10.250.0.1", "10.250.0.2"]
    assert not any((netlab.ETC_NETNS / n).exists() for n in names)  # its /etc/netns entries are gone too


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except FileNotFoundError:
        return False


def _wait(cond, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.1)
    return cond()


def test_teardown_ends_processes_that_left_the_process_group():
    """A process in its own session (as torchrun's workers are) is ended with the lab, not left in a nameless
    namespace."""
    with netlab.NetLab(1, tag="dbnt13a") as lab:
        p = lab.popen(0, ["sh", "-c", "setsid sleep 300 & echo $!; sleep 300"], stdout=subprocess.PIPE, text=True)
        escaped = int(p.stdout.readline())
        assert _alive(escaped) and escaped in netlab.namespace_pids("dbnt13a-h0")
    assert _wait(lambda: not _alive(escaped), 10)
    assert lab_namespaces("dbnt13a") == []


def test_cleanup_after_sigkill_removes_namespaces_etc_entries_and_processes():
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lab.netlab",
            "--hosts",
            "2",
            "--",
            "sh",
            "-c",
            "setsid sleep 300 & sleep 300",
        ],
        stdout=subprocess.PIPE,
        cwd=ROOT,
    )
    tag = f"dbn{p.pid}"
    assert _wait(lambda: len(lab_namespaces(tag)) == 3 and all(netlab.namespace_pids(f"{tag}-h{i}") for i in (0, 1)))
    assert _wait(lambda: all(len(netlab.namespace_pids(f"{tag}-h{i}")) >= 2 for i in (0, 1)))
    inside = [pid for i in (0, 1) for pid in netlab.namespace_pids(f"{tag}-h{i}")]
    p.kill()  # SIGKILL: no teardown at all
    p.wait(timeout=30)
    assert len(lab_namespaces(tag)) == 3 and (netlab.ETC_NETNS / f"{tag}-h0").is_dir()
    with netlab.NetLab(1, tag="dbnt13b"):  # a live lab: never touched by a clean-up
        assert netlab.cleanup_stale("dbnt13b") == []
        removed = netlab.cleanup_stale(tag)
        assert sorted(lab_namespaces("dbnt13b")) == ["dbnt13b-h0", "dbnt13b-sw"]
    assert sorted(removed) == sorted([f"{tag}-sw", f"{tag}-h0", f"{tag}-h1"])
    assert lab_namespaces(tag) == [] and not (netlab.ETC_NETNS / f"{tag}-h0").exists()
    assert _wait(lambda: not any(_alive(pid) for pid in inside), 10)


def test_braces_in_a_lab_command_and_bad_rates():
    code = "d = {'a': 1}; print(d['a'], '{rank} of {world} {x}')"
    p = subprocess.run(
        [sys.executable, "-m", "lab.netlab", "--hosts", "2", "--", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["[host 0] 1 0 of 2 {x}", "[host 1] 1 1 of 2 {x}"]
    for rate in ("nan", "inf", "0.00001", "-5"):
        p = subprocess.run(
            [sys.executable, "-m", "lab.netlab", "--link-mbit", rate, "--", "true"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
        assert p.stderr.strip().splitlines() == [
            f"netlab: error: link_mbit: expected a rate from 0.1 to 1e+06 Mbit/s, got {float(rate)}"
        ]
    p = subprocess.run(
        [sys.executable, "-m", "lab.netlab", "--link-mbit", "40", "--packet-segs", "0", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert (
        p.returncode == 2 and p.stderr.strip() == "netlab: error: packet_segs: expected 1 to 64 MSS per packet, got 0"
    )


_LOCAL_RANKS = """
import json, os, torch, torch.distributed as td
from lab.bench_allreduce import _own_addr, _own_connections
td.init_process_group("gloo")
x = torch.tensor([float(td.get_rank())])
td.all_reduce(x)
print(json.dumps({
    "rank": td.get_rank(), "local": [int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])],
    "netns": os.readlink("/proc/self/ns/net"), "addr": _own_addr(), "sum": x.item(),
    "peers": sorted({c[1] for c in _own_connections()}),
}))
td.destroy_process_group()
"""


def test_hosts_of_two_local_ranks_share_a_namespace_and_reach_each_other_inside_it():
    """run_all(per_host=2): ranks numbered as torchrun numbers them, a host's two processes in its namespace, one
    gloo group over all four (an allreduce), and the connection between a host's local ranks stays inside it (its
    peer is the host's own address, over loopback) while the other hosts are reached over the lab's link."""
    with netlab.NetLab(2, link_mbit=200, flow_mbit=70) as lab:

        def env(r):
            return {
                "RANK": str(r),
                "WORLD_SIZE": "4",
                "LOCAL_RANK": str(r % 2),
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": lab.addr(0),
                "MASTER_PORT": "29500",
                "GLOO_SOCKET_IFNAME": "eth0",
                "OMP_NUM_THREADS": "1",
            }

        results = lab.run_all(
            lambda r: [sys.executable, "-c", _LOCAL_RANKS], env, timeout=120, cwd=str(ROOT), per_host=2
        )
    for rc, out in results:
        assert rc == 0, out[-3000:]
    got = [json.loads(out.strip().splitlines()[-1]) for _, out in results]
    assert [g["rank"] for g in got] == [0, 1, 2, 3] and [g["local"] for g in got] == [[0, 2], [1, 2]] * 2
    assert [g["addr"] for g in got] == ["10.250.0.1", "10.250.0.1", "10.250.0.2", "10.250.0.2"]
    assert got[0]["netns"] == got[1]["netns"] != got[2]["netns"] == got[3]["netns"]
    assert all(g["sum"] == 6.0 for g in got)
    for g in got:  # its local rank on its own address, the other host's two on theirs
        assert g["peers"] == ["10.250.0.1", "10.250.0.2"], g
