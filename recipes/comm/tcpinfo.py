"""What the kernel measures of one TCP connection (Linux `TCP_INFO`): the bytes the peer acknowledged and the time the
connection was busy sending.

`comm.balance_level: hop` needs, per connection, the rate it delivers while it has data to send, free of how late the
peer was to ask for it. Host clocks around a receive hold the sender's lateness (a sender that started late looks like
a slow connection); the kernel's own accounting does not: `tcpi_busy_time` runs only while the socket has data
queued or unacknowledged, and gloo sends a point-to-point message only once the receiver has posted its buffer. So
bytes acknowledged over busy seconds is the connection's rate, whoever was late. Read at step boundaries, a few
microseconds per connection (never per message).

Busy time ends when the last byte is acknowledged, so it holds the receiver's ACK delay. A receiver that sends soon
after it receives (gloo's ready notice before each message) is taken by the kernel for an interactive peer, and its
ACKs wait to ride on its next message or for the delayed-ACK timer (40 ms and up). In a ring that next message comes
when the hop's slowest piece has arrived, so every connection that finished early stayed "busy" until then: at 16 lab
hosts under the `one-slow` profile the fast connections read anywhere from 0.6 to 1.9 MB/s from one step to the next
against a cap of 1.67, and the balancer's tables missed by up to 2x. `Link.quickack` (`TCP_QUICKACK`, one system call)
takes a connection out of that mode, so what arrives next is acknowledged as it is read; the hop ring calls it on each
connection it receives on after posting each ring step's receives, while measuring (recipes/comm/hopring.py).

Gloo's sockets are its own, so they are found by their file descriptors: the sockets a process group opened (those
that appeared while it was created and connected) are matched to peers by address, each rank's socket towards a peer
being the one whose remote end is one of that peer's local ends (`match`). A descriptor is read through a borrowed
socket object that is detached, never closed, and checked against the socket's inode first, so a descriptor gloo
closed and the process reused is never read as the connection.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
from dataclasses import dataclass

# struct tcp_info (include/uapi/linux/tcp.h): the two 64-bit counters used here
_BYTES_ACKED = 120  # tcpi_bytes_acked (Linux 4.1+); counts the SYN as one byte
_BUSY_TIME = 168  # tcpi_busy_time, microseconds (Linux 4.10+): busy, rwnd- and sndbuf-limited time together
_SIZE = 176
_TCP_QUICKACK = getattr(socket, "TCP_QUICKACK", 12)  # include/uapi/linux/tcp.h
_ONE = ctypes.c_int(1)
_libc = None  # the C library's setsockopt, loaded at first use

Endpoint = tuple[str, int]


@dataclass(frozen=True)
class Counters:
    acked: int  # bytes the peer acknowledged since the connection opened
    busy_s: float  # seconds with data queued or in flight (the kernel counts in jiffies: 1-10 ms steps)

    def __sub__(self, other: Counters) -> Counters:
        return Counters(self.acked - other.acked, self.busy_s - other.busy_s)


def sockets() -> dict[int, int]:
    """This process's open sockets: file descriptor -> inode (Linux /proc; empty elsewhere)."""
    out = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in names:
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed meanwhile, or the listing's own descriptor
        if link.startswith("socket:["):
            out[int(name)] = int(link[8:-1])
    return out


def _endpoint(addr) -> Endpoint:
    host = addr[0]
    if host.startswith("::ffff:"):  # an IPv4 peer on an IPv6 socket
        host = host[7:]
    return host, int(addr[1])


def endpoints(fd: int) -> tuple[Endpoint, Endpoint] | None:
    """(local, remote) of a connected TCP socket; None for any other descriptor."""
    try:
        s = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        if s.type != socket.SOCK_STREAM or s.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        return _endpoint(s.getsockname()), _endpoint(s.getpeername())
    except OSError:  # not connected (a listening socket)
        return None
    finally:
        s.detach()  # the descriptor stays gloo's


@dataclass(frozen=True)
class Link:
    """One TCP connection of this process, by descriptor and inode."""

    fd: int
    inode: int

    def read(self) -> Counters:
        """The connection's counters now; OSError if the descriptor no longer holds this socket."""
        self.check()
        s = socket.socket(fileno=self.fd)
        try:
            raw = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _SIZE)
        finally:
            s.detach()
        if len(raw) < _SIZE:
            raise OSError(f"TCP_INFO of {len(raw)} bytes: this kernel does not report busy time (Linux 4.10+)")
        (acked,) = struct.unpack_from("=Q", raw, _BYTES_ACKED)
        (busy_us,) = struct.unpack_from("=Q", raw, _BUSY_TIME)
        return Counters(acked, busy_us / 1e6)

    def check(self) -> None:
        """OSError unless the descriptor still holds this socket (`quickack` trusts it, to stay a single call)."""
        if os.readlink(f"/proc/self/fd/{self.fd}") != f"socket:[{self.inode}]":
            raise OSError(f"file descriptor {self.fd} no longer holds socket {self.inode}")

    def quickack(self) -> None:
        """Take the connection out of delayed-ACK mode now (`TCP_QUICKACK`): what arrives next is acknowledged as
        the process reads it, so the sender's busy time ends with the transfer (the module docstring). One system
        call (a few microseconds): call `check` first, once per step."""
        if _setsockopt()(self.fd, socket.IPPROTO_TCP, _TCP_QUICKACK, ctypes.byref(_ONE), ctypes.sizeof(_ONE)):
            err = ctypes.get_errno()
            raise OSError(err, f"TCP_QUICKACK on file descriptor {self.fd}: {os.strerror(err)}")


def _setsockopt():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True).setsockopt
    return _libc


def opened(before: dict[int, int]) -> dict[int, tuple[Link, Endpoint, Endpoint]]:
    """The connected TCP sockets open now that were not in `before` (a `sockets()` taken earlier): fd -> (link,
    local end, remote end)."""
    out = {}
    for fd, inode in sockets().items():
        if before.get(fd) == inode:
            continue
        ends = endpoints(fd)
        if ends is not None:
            out[fd] = (Link(fd, inode), *ends)
    return out


def match(mine: dict[int, tuple[Link, Endpoint, Endpoint]], peer_locals: list[Endpoint]) -> Link | None:
    """Of `mine` (from `opened`), the one connection whose remote end is one of the peer's local ends; None unless
    exactly one is."""
    ends = set(peer_locals)
    found = [link for link, _, remote in mine.values() if remote in ends]
    return found[0] if len(found) == 1 else None
