"""`comm.balance_level: hop`: a ring allreduce of point-to-point sends whose every hop splits its chunk over the
hop's own K connections, in proportion to what each delivers.

A collective over one communicator uses one TCP connection per hop, so a communicator goes at its slowest hop; with
K communicators, each hop's connections are unequal in ways no per-communicator share can follow (the hop from host
3 may have its slow connection on communicator 1, the hop from host 7 on communicator 2). Here each rank runs the
ring itself over the same K process groups (each with its own TCP connection to every peer) and cuts every chunk it
sends into K pieces by its own hop's shares: a hop goes at the sum of its connections, as NCCL Fast Socket balances
its sockets. The step model's name for it is `hop` (recipes/comm/flowrates.py).

At 2 ranks the left and right neighbour are the same host, and a connection of a group would carry pieces both ways.
A connection's ACKs for one direction leave through the same queue as its data in the other direction, so where that
direction is the slow one, the fast direction waits for its ACKs: in the network lab (`python -m lab.netlab
--hosts 2 --link-mbit 1000 --flow-mbit 333 --check --profile one-slow --both-ways`), the fast direction of each
connection that is slow the other way carried 215 and 225 Mbit/s against 317-320 on the others. So at 2 ranks the
backend opens 2K groups and each rank sends on K of them and receives on the other K (`recv_groups`), as NCCL gives
each direction its own sockets: every connection carries data one way, as every hop of a longer ring does.

The ring (one bucket, W ranks, chunk c = the c-th of W near-equal ranges, data moving from rank r to rank r-1 as in
gloo's ring, so hop h is host h's connections to host h-1):
- reduce-scatter, steps s = 0..W-2: send chunk (r+s) mod W to the left, receive chunk (r+s+1) mod W from the right
  and add it; rank r ends holding the sum of chunk (r-1) mod W;
- all-gather, steps s = 0..W-2: send chunk (r-1+s) mod W to the left, receive chunk (r+s) mod W from the right in
  place.
Every piece's bounds follow from the chunk's length and the sending hop's shares alone (exact integer cuts), so the
receiver cuts the same pieces with no message. The table of shares (one row per sending host) is agreed by the
balancer (recipes/comm/balance.py, `rebalance_hops`) and installed between steps on every rank.

Buckets run on `LANES` helper threads while backward goes on: bucket b on lane b mod LANES, each lane's buckets in
launch order (the same on every rank), its messages tagged with b so two buckets' rings never take each other's
pieces. With two lanes one bucket's ring sends while the other's waits for its slowest piece, as DDP keeps several
buckets in flight.
While measuring, the step reads the kernel's counters of the K connections it sends on (recipes/comm/tcpinfo.py) at
its first gradient and after its last bucket: per connection, the seconds it was busy sending and the bytes the left
neighbour acknowledged. Gloo sends a point-to-point message only once the receiver has posted it, so a late neighbour
does not count against a connection; and after posting each ring step's receives, the rank turns delayed ACKs off on
the K connections it receives on, so a piece that arrived early is acknowledged at once instead of when the step's
slowest piece lets the rank go on (recipes/comm/tcpinfo.py). Gloo only: NCCL's point-to-point sends would need their
own stream ordering, and no GPU has run this.

The ring's cost is per piece: K times the messages of a gloo ring on one connection, each a receive posted, a
ready notice back, the data, and a wake-up on both hosts. Where many ranks share few cores (16 lab hosts on 2 cores)
that CPU is the step. So the K groups share one gloo device (`new_group`): one event loop per process serves all K
connections to a peer, where K devices would each run their own; each piece is posted with the group's own
`send`/`recv`, not through `torch.distributed.isend`'s checks; and each ring step's receives are posted while the
step before it runs, so the neighbour finds their ready notices waiting instead of a round trip later. Buckets K
times a one-connection collective's keep the pieces as large and as few as its messages (docs/allreduce.md,
*Sixteen hosts on two cores*).
"""

from __future__ import annotations

import datetime
import os
import queue
import threading

import torch
import torch.distributed as td

from base.errors import CommError
from recipes.comm.plan import split_even, split_weighted
from recipes.comm.tcpinfo import Counters, Link

LANES = 2  # buckets in flight at once
BACKEND = "gloo_hop"  # the process-group backend of the ring's groups: gloo on this process's one shared device
_DEVICE: list = []  # that device, made by the first group


def _shared_device():
    """This process's gloo TCP device for the hop ring's groups: on the first interface GLOO_SOCKET_IFNAME names,
    else where the hostname resolves, as ProcessGroupGloo picks its own."""
    if not _DEVICE:
        name = next((n for n in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n), None)
        gloo = td.ProcessGroupGloo
        _DEVICE.append(gloo.create_device(interface=name) if name else gloo.create_default_device())
    return _DEVICE[0]


def _create_backend(store, rank: int, size: int, timeout: datetime.timedelta):
    opts = td.ProcessGroupGloo._Options()
    opts._devices = [_shared_device()]
    opts._timeout = timeout
    return td.ProcessGroupGloo(store, rank, size, opts)


def new_group(timeout: datetime.timedelta, ranks: list[int] | None = None):
    """A gloo process group over every rank (or `ranks`: one host's ring under comm.hierarchy=host), for the ring: its
    own TCP connection to every peer, but on the one device (one event loop thread) that every group made here
    shares. Every rank calls it for every group, in the same order, as torch.distributed.new_group requires."""
    if not hasattr(td.Backend, BACKEND.upper()):  # registering sets Backend.GLOO_HOP
        td.Backend.register_backend(BACKEND, _create_backend, devices=["cpu"])
    return td.new_group(ranks=ranks, backend=BACKEND, timeout=timeout)


class HopRing:
    """The hop-balanced ring over `groups` (K process groups spanning every rank, the same order everywhere): it sends
    on `groups` and receives on `recv_groups` (the same groups unless there are 2 ranks)."""

    def __init__(
        self,
        groups: list,
        rank: int,
        world: int,
        table: tuple[tuple[int, ...], ...],
        timeout_s: float,
        *,
        links: list[Link] | None = None,
        recv_links: list[Link] | None = None,
        recv_groups: list | None = None,
        label: str = "multistream hop ring",
        member: str = "rank",
    ):
        if len(table) != world or any(len(row) != len(groups) for row in table):
            raise ValueError(f"hop shares: expected {world} rows of {len(groups)}, got {table}")
        self.groups, self.rank, self.world, self.table = groups, rank, world, table
        # the K groups whose connections bring the right neighbour's pieces: the same as `groups` but at 2 ranks
        self.recv_groups = list(recv_groups) if recv_groups is not None else groups
        if len(self.recv_groups) != len(groups):
            raise ValueError(f"hop ring: {len(groups)} groups to send on but {len(self.recv_groups)} to receive on")
        self.left, self.right = (rank - 1) % world, (rank + 1) % world
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.timeout_s = timeout_s
        # how errors name the ring and its members (comm.hierarchy=host: a local rank's ring between hosts)
        self.label, self.member = label, member
        self.links = list(links or [])  # per communicator, the connection to the left neighbour (measuring needs it)
        self.recv_links = list(recv_links or [])  # per communicator, the connection from the right neighbour
        self.measure = False
        self._start: list[Counters] = []
        self._quick: list[Link] = []  # while measuring: the connections whose delayed ACKs each ring step turns off
        self._error: BaseException | None = None
        self._queues: list[queue.Queue] = [queue.Queue() for _ in range(LANES)]
        self._threads = [
            threading.Thread(target=self._loop, args=(q,), name=f"multistream-hop-ring-{i}", daemon=True)
            for i, q in enumerate(self._queues)
        ]
        for t in self._threads:
            t.start()

    # -- the training thread -----------------------------------------------------------------------------
    def begin_step(self, measure: bool) -> None:
        """Before the step's first bucket: whether to measure its connections (their counters now)."""
        self.measure = measure and len(self.links) == len(self.groups)
        if self.measure:
            self._start = self._read()
            self._quick = self.recv_links if len(self.recv_links) == len(self.groups) else []
            try:
                for link in self._quick:
                    link.check()
            except OSError as e:
                raise CommError(f"multistream hop ring: a connection from rank {self.right}: {e}") from e

    def step_figures(self) -> list[float]:
        """After `join`, for a measured step: per connection the seconds it was busy sending, then per connection the
        bytes it delivered, since `begin_step`."""
        done = [b - a for a, b in zip(self._start, self._read(), strict=True)]
        return [d.busy_s for d in done] + [float(d.acked) for d in done]

    def _read(self) -> list[Counters]:
        try:
            return [link.read() for link in self.links]
        except OSError as e:
            raise CommError(f"multistream hop ring: reading a connection's TCP counters failed: {e}") from e

    def submit(self, b: int, flat: torch.Tensor, before=None) -> None:
        """Reduce `flat` (bucket b, already divided by the world size) to the sum over ranks, in place, after every
        bucket submitted before it; `before()`, if given, runs first on the lane's thread (comm.hierarchy=host: wait
        for the host's reduce-scatter that fills `flat`)."""
        self._queues[b % LANES].put((b, flat, before))

    def join(self) -> None:
        """Wait for every submitted bucket; a failed one raises its CommError here."""
        for q in self._queues:
            q.join()
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def close(self) -> None:
        for q in self._queues:
            q.put(None)
        for t in self._threads:
            t.join(timeout=5)

    # -- the helper thread -------------------------------------------------------------------------------
    def _loop(self, lane: queue.Queue) -> None:
        while True:
            item = lane.get()
            try:
                if item is None:
                    return
                if self._error is None:  # after a failure, drain; join raises it
                    b, flat, before = item
                    if before is not None:
                        before()
                    self.allreduce(b, flat)
            except BaseException as e:  # noqa: BLE001 - handed to the training thread
                self._error = e if isinstance(e, CommError) else CommError(f"{self.label}: {e}")
            finally:
                lane.task_done()

    def allreduce(self, b: int, flat: torch.Tensor) -> None:
        """The ring itself, on the calling thread (the helper's loop, or a test). Each step's receives are posted
        while the step before it still runs, so their ready notices are at the right neighbour before it has the
        data: it sends at once instead of a notice's round trip later. The reduce-scatter therefore takes turns
        between two scratch buffers."""
        w, r = self.world, self.rank
        if w == 1:
            return
        chunks = split_even(flat.numel(), w)
        while len(chunks) < w:
            chunks.append((flat.numel(), flat.numel()))  # fewer elements than ranks: the last chunks are empty
        longest = max(hi - lo for lo, hi in chunks)
        tmp = [torch.empty(longest, dtype=flat.dtype, device=flat.device) for _ in range(2)]
        steps: list[_Step] = []
        for s in range(w - 1):  # reduce-scatter: chunk r+s goes left, chunk r+s+1 comes from the right, added
            slo, shi = chunks[(r + s) % w]
            rlo, rhi = chunks[(r + s + 1) % w]
            steps.append(_Step("reduce-scatter", s, flat[slo:shi], tmp[s % 2][: rhi - rlo], flat[rlo:rhi]))
        for s in range(w - 1):  # all-gather: chunk r-1+s goes left, chunk r+s comes from the right in place
            slo, shi = chunks[(r - 1 + s) % w]
            rlo, rhi = chunks[(r + s) % w]
            steps.append(_Step("all-gather", s, flat[slo:shi], flat[rlo:rhi], None))
        step = steps[0]
        try:
            posted = self._post_recvs(b, step)
            for i, step in enumerate(steps):
                sends = self._post_sends(b, step)
                after = steps[i + 1] if i + 1 < len(steps) else None
                # the next step's receives, unless they would land where this step still reads or writes (the
                # all-gather's first receive at 2 ranks is the chunk the reduce-scatter sends)
                early = self._post_recvs(b, after) if after is not None and after.clear_of(step) else None
                for work in posted + sends:
                    work.wait(self.timeout)
                if step.into is not None:
                    step.into += step.recv
                if after is not None:
                    posted = early if early is not None else self._post_recvs(b, after)
        except CommError:
            raise
        except Exception as e:
            raise CommError(
                f"{self.label}: bucket {b}, {step.phase} step {step.s}, between {self.member} {self.rank} and its "
                f"neighbours {self.left} and {self.right} failed: {e}. A peer died or stalled; point-to-point sends "
                f"give up after dist.timeout_s={self.timeout_s:g} s"
            ) from e

    def _quickack(self, carrying: list[int]) -> None:
        """While measuring, after posting a step's receives: the connections `carrying` a piece leave the delayed-ACK
        mode that gloo's ready notices, just sent on them, put them in (recipes/comm/tcpinfo.py)."""
        try:
            for k in carrying:
                self._quick[k].quickack()
        except OSError as e:
            raise CommError(f"multistream hop ring: a connection from rank {self.right}: {e}") from e

    def _post_recvs(self, b: int, step: _Step) -> list:
        """`step`'s receives from the right, cut by the right neighbour's shares, one piece per connection. The
        groups span every rank in the same order, so a rank's number in them is its global one."""
        cuts = [(k, lo, hi) for k, (lo, hi) in enumerate(split_weighted(step.recv.numel(), self.table[self.right]))]
        works = [self.recv_groups[k].recv([step.recv[lo:hi]], self.right, b) for k, lo, hi in cuts if hi > lo]
        if self.measure and self._quick:
            self._quickack([k for k, lo, hi in cuts if hi > lo])
        return works

    def _post_sends(self, b: int, step: _Step) -> list:
        """`step`'s sends to the left, cut by this host's shares."""
        return [
            self.groups[k].send([step.send[lo:hi]], self.left, b)
            for k, (lo, hi) in enumerate(split_weighted(step.send.numel(), self.table[self.rank]))
            if hi > lo
        ]


class _Step:
    """One ring step: `send` goes left, `recv` comes from the right and is added into `into` (reduce-scatter) or
    lands in place (all-gather, `into` None)."""

    def __init__(self, phase: str, s: int, send: torch.Tensor, recv: torch.Tensor, into: torch.Tensor | None):
        self.phase, self.s, self.send, self.recv, self.into = phase, s, send, recv, into

    def clear_of(self, running: _Step) -> bool:
        """Whether this step's receive buffer shares no byte with what the `running` step sends, receives or adds
        into, so it may be posted while that step runs."""
        return all(_disjoint(self.recv, t) for t in (running.send, running.recv, running.into) if t is not None)


def _disjoint(a: torch.Tensor, b: torch.Tensor) -> bool:
    a_lo, b_lo = a.data_ptr(), b.data_ptr()
    return a_lo + a.numel() * a.element_size() <= b_lo or b_lo + b.numel() * b.element_size() <= a_lo
