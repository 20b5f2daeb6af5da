"""`comm.balance_level: hop`: a ring allreduce of point-to-point sends whose every hop splits its chunk over the
hop's own K connections, in proportion to what each delivers.

A collective over one communicator uses one TCP connection per hop, so a communicator goes at its slowest hop; with
K communicators, each hop's connections are unequal in ways no per-communicator share can follow (the hop from host
3 may have its slow connection on communicator 1, the hop from host 7 on communicator 2). Here each rank runs the
ring itself over the same K process groups (each with its own TCP connection to every peer) and cuts every chunk it
sends into K pieces by its own hop's shares: a hop goes at the sum of its connections, as NCCL Fast Socket balances
its sockets. The step model's name for it is `hop` (recipes/comm/flowrates.py).

The ring (one bucket, W ranks, chunk c = the c-th of W near-equal ranges, data moving from rank r to rank r-1 as in
gloo's ring, so hop h is host h's connections to host h-1):
- reduce-scatter, steps s = 0..W-2: send chunk (r+s) mod W to the left, receive chunk (r+s+1) mod W from the right
  and add it; rank r ends holding the sum of chunk (r-1) mod W;
- all-gather, steps s = 0..W-2: send chunk (r-1+s) mod W to the left, receive chunk (r+s) mod W from the right in
  place.
Every piece's bounds follow from the chunk's length and the sending hop's shares alone (exact integer cuts), so the
receiver cuts the same pieces with no message. The table of shares (one row per sending host) is agreed by the
balancer (recipes/comm/balance.py, `rebalance_hops`) and installed between steps on every rank.

Buckets run on one helper thread, one at a time, in launch order (the same on every rank), while backward goes on.
While measuring, each piece travels as a head and a tail, each receive is waited for on a thread of its own
(gloo's point-to-point work has no future and reports completion only from `wait()`), and a connection's figure is
the seconds between its head and its tail arriving: the tail's transfer on that connection alone, whatever the
sender's lateness (a ring's ranks wait for each other, and at 16 hosts that lateness is larger than the differences
between connections). Every receive of a bucket is posted before its first send, so a receiver is always waiting
when its data comes and both arrivals are live. The step's figure per connection is its median seconds per element
times the elements it carried. Gloo only: NCCL's point-to-point sends would need
their own stream ordering, and no GPU has run this.
"""

from __future__ import annotations

import datetime
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as td

from base.errors import CommError
from recipes.comm.plan import split_even, split_weighted

WHOLE, HEAD, TAIL = 0, 1, 2  # point-to-point tags: a piece sent whole, or while measuring as a head and a tail


class HopRing:
    """The hop-balanced ring over `groups` (K process groups spanning every rank, the same order everywhere)."""

    def __init__(self, groups: list, rank: int, world: int, table: tuple[tuple[int, ...], ...], timeout_s: float):
        if len(table) != world or any(len(row) != len(groups) for row in table):
            raise ValueError(f"hop shares: expected {world} rows of {len(groups)}, got {table}")
        self.groups, self.rank, self.world, self.table = groups, rank, world, table
        self.left, self.right = (rank - 1) % world, (rank + 1) % world
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.timeout_s = timeout_s
        self.measure = False
        self.samples: list[list[float]] = [[] for _ in groups]  # this step: per incoming connection, s per element
        self.carried = [0] * len(groups)  # this step: elements per connection (sent and received alike)
        self._error: BaseException | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="multistream-hop-ring", daemon=True)
        self._thread.start()

    # -- the training thread -----------------------------------------------------------------------------
    def begin_step(self, measure: bool) -> None:
        """Before the step's first bucket: whether to time its connections; the step's figures start at zero."""
        self.measure = measure
        self.samples = [[] for _ in self.groups]
        self.carried = [0] * len(self.groups)

    def submit(self, b: int, flat: torch.Tensor) -> None:
        """Reduce `flat` (bucket b, already divided by the world size) to the sum over ranks, in place, after every
        bucket submitted before it."""
        self._queue.put((b, flat))

    def join(self) -> None:
        """Wait for every submitted bucket; a failed one raises its CommError here."""
        self._queue.join()
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    # -- the helper thread -------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if self._error is None:  # after a failure, drain; join raises it
                    self.allreduce(*item)
            except BaseException as e:  # noqa: BLE001 - handed to the training thread
                self._error = e if isinstance(e, CommError) else CommError(f"multistream hop ring: {e}")
            finally:
                self._queue.task_done()

    def allreduce(self, b: int, flat: torch.Tensor) -> None:
        """The ring itself, on the calling thread (the helper's loop, or a test).

        Every receive of the bucket's 2(W-1) ring steps is posted first (reduce-scatter's into a scratch buffer of
        its own per step, all-gather's in place), so a receiver is always waiting before its data can come; then
        each step posts its sends, waits for its receives and (reduce-scatter) adds. No received data can land on
        a range still being read or added: a chunk's all-gather copy exists only once this rank's contribution to
        it was delivered."""
        w, r = self.world, self.rank
        if w == 1:
            return
        chunks = split_even(flat.numel(), w)
        while len(chunks) < w:
            chunks.append((flat.numel(), flat.numel()))  # fewer elements than ranks: the last chunks are empty
        longest = max(hi - lo for lo, hi in chunks)
        tmp = torch.empty((w - 1, longest), dtype=flat.dtype, device=flat.device)
        steps = []  # (phase, s, send view, receive view, chunk to add the received into or None)
        for s in range(w - 1):
            slo, shi = chunks[(r + s) % w]
            rlo, rhi = chunks[(r + s + 1) % w]
            steps.append(("reduce-scatter", s, flat[slo:shi], tmp[s, : rhi - rlo], flat[rlo:rhi]))
        for s in range(w - 1):
            slo, shi = chunks[(r - 1 + s) % w]
            rlo, rhi = chunks[(r + s) % w]
            steps.append(("all-gather", s, flat[slo:shi], flat[rlo:rhi], None))
        timed = self.measure
        where = "posting the receives"
        try:
            posted = [
                [
                    (k, kind, numel, td.irecv(t, src=self.right, group=self.groups[k], tag=_tag(i, kind)))
                    for k, kind, t, numel in self._pieces(recv, self.table[self.right], timed, count=True)
                ]
                for i, (_, _, _, recv, _) in enumerate(steps)
            ]
            for i, (phase, s, send, _, into) in enumerate(steps):
                where = f"{phase} step {s}"
                sends = [
                    td.isend(t, dst=self.left, group=self.groups[k], tag=_tag(i, kind))
                    for k, kind, t, _ in self._pieces(send, self.table[self.rank], timed, count=False)
                ]
                if timed and posted[i]:
                    self._timed_wait(posted[i])
                else:
                    for _, _, _, work in posted[i]:
                        work.wait(self.timeout)
                if into is not None:
                    into += steps[i][3]
                for work in sends:
                    work.wait(self.timeout)
        except Exception as e:
            raise CommError(
                f"multistream hop ring: bucket {b}, {where}, between rank {self.rank} and its neighbours "
                f"{self.left} and {self.right} failed: {e}. A peer died or stalled; point-to-point sends give up "
                f"after dist.timeout_s={self.timeout_s:g} s"
            ) from e

    def _timed_wait(self, posted: list) -> None:
        """Wait for one step's receives, each on a waiter thread, and add each connection's tail time per element
        to its samples (the receiver was waiting before the sender could send, so the head's and the tail's
        arrivals are both live)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(2 * len(self.groups), thread_name_prefix="multistream-hop-wait")
        done = [(k, kind, numel, self._pool.submit(_arrival, work, self.timeout)) for k, kind, numel, work in posted]
        heads = {k: fut.result() for k, kind, _, fut in done if kind == HEAD}
        for k, kind, numel, fut in done:
            if kind == TAIL:
                self.samples[k].append(max(fut.result() - heads[k], 0.0) / numel)

    def step_seconds(self) -> list[float]:
        """The step's figure per incoming connection: its median seconds per element (over the step's ring steps)
        times the elements it carried in the step; 0 for a connection that carried nothing measurable. A median,
        because a waiter thread that gets the CPU late makes one sample wrong, not the step's."""
        out = []
        for k in range(len(self.groups)):
            xs = sorted(self.samples[k])
            out.append(xs[len(xs) // 2] * self.carried[k] if xs else 0.0)
        return out

    def _pieces(self, flat: torch.Tensor, shares: tuple[int, ...], timed: bool, *, count: bool):
        """(connection, tag kind, tensor, elements) for every non-empty piece of `flat` under `shares`; while timed,
        a piece of 4 elements or more as its head (a quarter) and its tail (sender and receiver cut the same: the
        bounds and the flag are the same on both). `count`: a receive, counted into what its connection carried."""
        for k, (lo, hi) in enumerate(split_weighted(flat.numel(), shares)):
            if hi <= lo:
                continue
            if count:
                self.carried[k] += hi - lo
            if timed and hi - lo >= 4:
                mid = lo + (hi - lo) // 4
                yield k, HEAD, flat[lo:mid], mid - lo
                yield k, TAIL, flat[mid:hi], hi - mid
            else:
                yield k, WHOLE, flat[lo:hi], hi - lo


def _tag(step: int, kind: int) -> int:
    """The point-to-point tag of one piece: its ring step within the bucket and its kind (whole, head, tail)."""
    return 3 * step + kind


def _arrival(work, timeout: datetime.timedelta) -> float:
    """On a waiter thread: block until one receive is complete, and say when (gloo releases the GIL meanwhile)."""
    work.wait(timeout)
    return time.perf_counter()
