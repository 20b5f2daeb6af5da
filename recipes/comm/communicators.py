"""multistream's K communicators: created once, in the same order on every rank, each checked with a sum of ones;
under comm.balance_level=hop also the TCP connection each one's ring sends and receives on.

With NCCL each communicator has its own CUDA stream, with gloo its own TCP connections (so K flows on the wire);
the hop-balanced ring's are gloo groups on the host's CPU (recipes/comm/hopring.py), under comm.hierarchy=host
between the hosts only (recipes/comm/hierarchy.py). recipes/comm/multistream.py asks for them at start-up.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field

import torch
import torch.distributed as td

from base.errors import CommError, ConfigError
from recipes.comm import hopring, tcpinfo
from recipes.distributed import all_gather_object, collective_guard


@dataclass
class Communicators:
    """The groups this rank sends on and receives on (the same ones, except under `one_way`), and under hop level
    each one's TCP connection: to the left neighbour (measured) and from the right one (delayed ACKs off)."""

    groups: list = field(default_factory=list)
    recv_groups: list = field(default_factory=list)
    links: list[tcpinfo.Link] = field(default_factory=list)
    recv_links: list[tcpinfo.Link] = field(default_factory=list)


def ring_of(dist, hierarchy) -> tuple[int, int, int, int]:
    """This rank's ring under hop level: (its place, length, left and right neighbours' global ranks); every rank
    without a hierarchy, local rank l of every host under comm.hierarchy=host."""
    if hierarchy is not None:
        lay = hierarchy.layout
        return (lay.host, lay.hosts, *lay.neighbours())
    r, w = dist.rank, dist.world_size
    return r, w, (r - 1) % w, (r + 1) % w


def one_way(dist, hierarchy, *, hop: bool) -> bool:
    """Each connection carries data one way: the hop-balanced ring at 2 ranks, whose one neighbour is both left
    and right, sends on K groups and receives on K others (recipes/comm/hopring.py says why)."""
    return hop and ring_of(dist, hierarchy)[1] == 2


def connect(k: int, *, dist, timeout_s: float, hop: bool, hierarchy) -> Communicators:
    """K communicators (2K when `one_way`), connected and checked now, one at a time, instead of lazily
    mid-backward; under `hop` with their TCP connections found."""
    timeout = datetime.timedelta(seconds=timeout_s)
    # Each sums its own ones (int32, so the check is exact: every entry must be the world size, whatever W and K are).
    both = one_way(dist, hierarchy, hop=hop)
    n = 2 * k if both else k
    # the hop ring's groups are gloo on the host's CPU, also under comm.hierarchy=host on GPUs
    probe = torch.ones(n, dtype=torch.int32, device="cpu" if hop else dist.device)
    groups, opened = [], []
    with collective_guard("multistream: communicator check"):
        for i in range(n):
            before = tcpinfo.sockets() if hop else {}
            if hierarchy is not None:
                groups.append(hierarchy.new_ring_group(timeout))
            else:
                groups.append(hopring.new_group(timeout) if hop else td.new_group(timeout=timeout))
            td.all_reduce(probe[i : i + 1], group=groups[i])
            if hop:  # the TCP connections this communicator opened (recipes/comm/tcpinfo.py)
                opened.append(tcpinfo.opened(before))
    # one way: rank 0 sends on the first K and receives on the other K, rank 1 the other way round
    place, size = ring_of(dist, hierarchy)[:2] if hop else (dist.rank, dist.world_size)
    sends = list(range(k, n)) if both and place == 1 else list(range(k))
    recvs = list(range(k)) if both and place == 1 else list(range(n - k, n))
    out = Communicators([groups[i] for i in sends], [groups[i] for i in recvs])
    got = probe.tolist()
    bad = [i for i, v in enumerate(got) if v != size]
    if bad:
        raise CommError(
            f"multistream: communicator check: communicator {bad[0]} summed {got[bad[0]]} ones, expected "
            f"its size {size}"
        )
    if hop:
        out.links, out.recv_links = _find_links(opened, sends, recvs, dist=dist, hierarchy=hierarchy)
    return out


def _find_links(
    opened: list[dict], sends: list[int], recvs: list[int], *, dist, hierarchy
) -> tuple[list[tcpinfo.Link], list[tcpinfo.Link]]:
    """comm.balance_level=hop: this rank's TCP connections to its left neighbour on the communicators it sends
    on (`sends`, indices into `opened`: measured) and from its right neighbour on those it receives on (`recvs`:
    delayed ACKs turned off while measuring), found by address: one all-gather of every rank's local ends per
    communicator."""
    _, size, left, right = ring_of(dist, hierarchy)
    if size == 1:
        return [], []
    mine = [sorted({local for _, local, _ in conns.values()}) for conns in opened]
    everyone = all_gather_object(mine, dist)
    # per side: (the neighbour, {communicator: its connection to that neighbour}); at 2 ranks both sides are rank
    # 1 - rank, on different communicators when one way
    send, recv = (
        (peer, {i: tcpinfo.match(opened[i], everyone[peer][i]) for i in which})
        for peer, which in ((left, sends), (right, recvs))
    )
    error = ""
    missing = [(peer, i) for peer, found in (send, recv) for i, link in found.items() if link is None]
    if missing:
        peer, i = missing[0]
        error = (
            f"found no single TCP connection to rank {peer} on communicator {i} of {len(opened)} (it opened "
            f"{len(opened[i])} here)"
        )
    else:
        try:
            send[1][sends[0]].read()
            recv[1][recvs[0]].quickack()
        except OSError as e:
            error = str(e)
    errors = all_gather_object(error, dist)  # every rank stops, with the first rank's reason
    bad = [r for r, e in enumerate(errors) if e]
    if bad:
        raise ConfigError(
            f"comm.balance_level=hop measures each connection with the kernel's TCP_INFO (Linux, gloo's TCP "
            f"transport): rank {bad[0]}: {errors[bad[0]]}. Use comm.balance_level=communicator"
        )
    return [send[1][i] for i in sends], [recv[1][i] for i in recvs]
