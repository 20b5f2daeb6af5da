"""recipes/comm/tcpinfo.py on real loopback sockets: the kernel's byte and busy-time counters, finding a connection by
address, and a descriptor that no longer holds its socket."""

from __future__ import annotations

import os
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


@pytest.mark.parametrize("quick", [False, True], ids=["delayed-acks", "quickack"])
def test_quickack_ends_the_senders_busy_time_with_the_transfer(quick):
    """The ring's exchange on loopback: the receiver sends a ready notice, reads a 20 KB message, then spends 30 ms on
    the rest of its step. Sending right after receiving makes the kernel delay its ACKs (interactive mode), so the
    message's last bytes stay unacknowledged and the sender 'busy' until the next notice, about 30 ms a message;
    `Link.quickack` after each notice acknowledges them as they are read."""
    before = tcpinfo.sockets()
    client, server = _pair()
    try:
        opened = tcpinfo.opened(before)
        link, receiving = opened[client.fileno()][0], opened[server.fileno()][0]
        n, size = 10, 20001

        def receiver():
            for _ in range(n):
                server.sendall(b"r")
                if quick:
                    receiving.quickack()
                got = 0
                while got < size:
                    got += len(server.recv(1 << 16))
                time.sleep(0.03)

        t = threading.Thread(target=receiver)
        t.start()
        start = link.read()
        for _ in range(n):
            assert client.recv(1) == b"r"
            client.sendall(b"x" * size)
        t.join()
        time.sleep(0.1)  # the last ACK, delayed or not
        busy = (link.read() - start).busy_s / n
        if quick:
            assert busy < 0.008  # 0.2 ms measured; the kernel counts busy time in 1-10 ms jiffies
        else:
            assert busy > 0.02  # 28 ms measured
    finally:
        client.close()
        server.close()


def test_quickack_on_a_descriptor_that_is_not_a_socket_is_an_os_error():
    r, w = os.pipe()
    try:
        with pytest.raises(OSError, match=rf"TCP_QUICKACK on file descriptor {r}: Socket operation on non-socket"):
            tcpinfo.Link(r, 0).quickack()
    finally:
        os.close(r)
        os.close(w)
