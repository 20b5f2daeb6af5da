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
While measuring, each receive is waited for on a thread of its own (gloo's point-to-point work has no future and
reports completion only from `wait()`), so each connection's time is its own: the seconds from posting the step's
receives to that piece arriving, summed over the step's ring steps. Gloo only: NCCL's point-to-point sends would need
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
        self.seconds = [0.0] * len(groups)  # this step: per connection of the incoming hop (from the right)
        self._error: BaseException | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="multistream-hop-ring", daemon=True)
        self._thread.start()

    # -- the training thread -----------------------------------------------------------------------------
    def begin_step(self, measure: bool) -> None:
        """Before the step's first bucket: whether to time its connections; the step's figures start at zero."""
        self.measure = measure
        self.seconds = [0.0] * len(self.groups)

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
        """The ring itself, on the calling thread (the helper's loop, or a test)."""
        w, r = self.world, self.rank
        if w == 1:
            return
        chunks = split_even(flat.numel(), w)
        while len(chunks) < w:
            chunks.append((flat.numel(), flat.numel()))  # fewer elements than ranks: the last chunks are empty
        longest = max(hi - lo for lo, hi in chunks)
        tmp = torch.empty(longest, dtype=flat.dtype, device=flat.device)
        for s in range(w - 1):  # reduce-scatter
            slo, shi = chunks[(r + s) % w]
            rlo, rhi = chunks[(r + s + 1) % w]
            self._exchange(b, "reduce-scatter", s, flat[slo:shi], tmp[: rhi - rlo])
            flat[rlo:rhi] += tmp[: rhi - rlo]
        for s in range(w - 1):  # all-gather
            slo, shi = chunks[(r - 1 + s) % w]
            rlo, rhi = chunks[(r + s) % w]
            self._exchange(b, "all-gather", s, flat[slo:shi], flat[rlo:rhi])

    def _exchange(self, b: int, phase: str, s: int, send: torch.Tensor, recv: torch.Tensor) -> None:
        """One ring step: `send` to the left cut by this host's shares, `recv` from the right cut by the right
        neighbour's shares, one piece per connection."""
        t0 = time.perf_counter()
        recvs = []
        for k, (lo, hi) in enumerate(split_weighted(recv.numel(), self.table[self.right])):
            if hi > lo:
                recvs.append((k, td.irecv(recv[lo:hi], src=self.right, group=self.groups[k])))
        sends = []
        for k, (lo, hi) in enumerate(split_weighted(send.numel(), self.table[self.rank])):
            if hi > lo:
                sends.append((k, td.isend(send[lo:hi], dst=self.left, group=self.groups[k])))
        try:
            if self.measure and recvs:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(len(self.groups), thread_name_prefix="multistream-hop-wait")
                done = [(k, self._pool.submit(_arrival, work, self.timeout)) for k, work in recvs]
                for k, fut in done:
                    self.seconds[k] += fut.result() - t0
            else:
                for _, work in recvs:
                    work.wait(self.timeout)
            for _, work in sends:
                work.wait(self.timeout)
        except Exception as e:
            raise CommError(
                f"multistream hop ring: bucket {b}, {phase} step {s}, between rank {self.rank} and its neighbours "
                f"{self.left} and {self.right} failed: {e}. A peer died or stalled; point-to-point sends give up "
                f"after dist.timeout_s={self.timeout_s:g} s"
            ) from e


def _arrival(work, timeout: datetime.timedelta) -> float:
    """On a waiter thread: block until one receive is complete, and say when (gloo releases the GIL meanwhile)."""
    work.wait(timeout)
    return time.perf_counter()
