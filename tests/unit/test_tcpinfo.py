"""recipes/comm/tcpinfo.py on real loopback sockets: the kernel's byte and busy-time counters, finding a connection by
address, and a descriptor that no longer holds its socket."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from recipes.comm import tcpinfo


def _pair():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    client = socket.create_connection(srv.getsockname())
    server, _ = srv.accept()
    srv.close()
    return client, server


def test_counters_are_the_bytes_acknowledged_and_the_time_spent_sending_to_a_slow_reader():
    before = tcpinfo.sockets()
    client, server = _pair()
    try:
        opened = tcpinfo.opened(before)
        assert sorted(opened) == sorted([client.fileno(), server.fileno()])
        link, local, remote = opened[client.fileno()]
        assert (local, remote) == (client.getsockname(), client.getpeername())
        start = link.read()
        n = 4 << 20

        def slow_reader():  # 4 MiB in 64 KiB reads, 4 ms apart: the sender is busy for about 0.25 s
            got = 0
            while got < n:
                got += len(server.recv(1 << 16))
                time.sleep(0.004)

        t = threading.Thread(target=slow_reader)
        t.start()
        client.sendall(b"x" * n)
        t.join()
        time.sleep(0.05)  # the last ACK
        done = link.read() - start
        assert done.acked == n
        assert 0.15 <= done.busy_s <= 2.0
        idle = link.read()
        time.sleep(0.1)
        assert link.read() == idle  # nothing to send: not busy
    finally:
        client.close()
        server.close()


def test_match_finds_the_connection_whose_remote_end_is_the_peers_local_end():
    before = tcpinfo.sockets()
    a, b = _pair()
    c, d = _pair()
    try:
        mine = tcpinfo.opened(before)
        peer_locals = [b.getsockname()]  # the peer's end of a-b
        assert tcpinfo.match(mine, peer_locals).fd == a.fileno()
        assert tcpinfo.match(mine, [("127.0.0.1", 1)]) is None  # none
        assert tcpinfo.match(mine, [b.getsockname(), d.getsockname()]) is None  # two: ambiguous
    finally:
        for s in (a, b, c, d):
            s.close()


def test_a_descriptor_that_now_holds_another_socket_is_refused():
    a, b = _pair()
    link = tcpinfo.opened({})[a.fileno()][0]
    fd = a.fileno()
    a.close()
    b.close()
    c, d = _pair()  # the lowest free descriptors: the closed ones come back
    try:
        assert fd in (c.fileno(), d.fileno())
        with pytest.raises(OSError, match=f"file descriptor {fd} no longer holds socket {link.inode}"):
            link.read()
    finally:
        c.close()
        d.close()
