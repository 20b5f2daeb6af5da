"""`comm.hierarchy: host`: the hop-balanced ring between hosts, NCCL (or gloo) inside each host.

On hosts with several GPUs a flat ring over every rank would cross the slow network once per GPU; Horovod's
hierarchical allreduce (`HOROVOD_HIERARCHICAL_ALLREDUCE`) reduces inside the host first. Per bucket (already divided
by the world size, in the wire format):

1. a reduce-scatter among the host's L local ranks over the host's own process group (the default backend: NCCL
   on GPUs, over NVLink; gloo on CPU): local rank l ends holding the host's sum of shard l, 1/L of the bucket;
2. local rank l runs the hop-balanced ring (recipes/comm/hopring.py) on its shard across the hosts: one ring per
   local rank index, whose members are local rank l of every host, so its length is the number of hosts, over
   its own K gloo groups; on CUDA the shard is staged through a pinned host copy;
3. an all-gather among the local ranks puts every shard back into the bucket.

The balancer is the ring's own (recipes/comm/balance.py): the hop table keeps one row per rank (row g: rank g's K
connections to its ring's left neighbour, the same shape as without a hierarchy), each ring reads the rows of its
members, and the agreement, re-plans, revert and resume are those of `comm.balance_level: hop`. A re-plan is decided
over every ring's rows together, as the step waits for the slowest ring: its all-gather needs every shard.

Order: collectives on one process group must be issued in the same order on every rank. The reduce-scatters are
issued from the training thread as the buckets launch (plan order, as every rank launches them), the rings run on
the ring's lanes, and the all-gathers are issued in bucket order at the end of backward (`join`). Buckets still
overlap backward: a bucket's reduce-scatter and ring run while later gradients are computed.

CUDA: the reduce-scatter, the device-to-pinned copy, the copy back and the all-gather run on a side stream of their
own, ordered after backward's stream by `wait_stream` and before the ring by an event that the ring's lane thread
(never the training thread) waits for; backward's stream waits for the side stream only once the all-gathers are
issued. The step is never captured in a CUDA graph while this ring runs (multistream's `capture_blocker`).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as td

from base.errors import CommError, ConfigError
from recipes.comm import hopring


@dataclass(frozen=True)
class Layout:
    """Where this rank sits: `hosts` hosts of `local` ranks each, torchrun's numbering (rank = host x local + local
    rank)."""

    hosts: int
    local: int
    host: int
    local_rank: int

    def ring_ranks(self, local_rank: int) -> list[int]:
        """The global ranks of local rank `local_rank`'s ring, in ring order (host 0, 1, ...)."""
        return [h * self.local + local_rank for h in range(self.hosts)]

    def host_ranks(self, host: int) -> list[int]:
        return list(range(host * self.local, (host + 1) * self.local))

    def neighbours(self) -> tuple[int, int]:
        """The global ranks of this rank's left and right neighbours in its ring."""
        return tuple(((self.host + d) % self.hosts) * self.local + self.local_rank for d in (-1, 1))

    def rows(self, table: tuple) -> tuple:
        """This ring's rows of the hop table (a row per rank): its members' rows, by host."""
        return tuple(table[g] for g in self.ring_ranks(self.local_rank))


def layout_of(rank: int, world: int, local_rank: int, local_world: int, everyone: list[tuple[int, int]]) -> Layout:
    """The host layout from torchrun's LOCAL_RANK/LOCAL_WORLD_SIZE, as every rank reported it (`everyone`: (local rank,
    local world size) per rank); ConfigError unless every host runs the same number of ranks, numbered by host."""
    sizes = sorted({lw for _, lw in everyone})
    if len(sizes) != 1 or world % sizes[0]:
        raise ConfigError(
            f"comm.hierarchy=host: every host must run the same number of ranks (torchrun --nproc-per-node), got "
            f"LOCAL_WORLD_SIZE {'/'.join(map(str, sizes))} over {world} ranks"
        )
    local = sizes[0]
    bad = [r for r, (lr, _) in enumerate(everyone) if lr != r % local]
    if bad:
        raise ConfigError(
            f"comm.hierarchy=host: rank {bad[0]} has LOCAL_RANK {everyone[bad[0]][0]}, expected {bad[0] % local} "
            f"(ranks numbered host by host, as torchrun numbers them)"
        )
    return Layout(world // local, local, rank // local, local_rank)


class Hierarchy:
    """This rank's place in the hierarchy and its host's process group (made once, at start-up)."""

    def __init__(self, layout: Layout, timeout_s: float, device: torch.device, *, local_backend: str | None = None):
        """`local_backend`: the host's group's backend (None: the default group's, NCCL on GPUs; the GPU check names
        nccl under a gloo default group, as two processes on one GPU cannot share an NCCL communicator)."""
        self.layout, self.timeout_s, self.device = layout, timeout_s, device
        timeout = datetime.timedelta(seconds=timeout_s)
        self.local_group = None
        for h in range(layout.hosts):  # every rank makes every host's group, in the same order (new_group's rule)
            group = td.new_group(ranks=layout.host_ranks(h), timeout=timeout, backend=local_backend)
            if h == layout.host:
                self.local_group = group

    def new_ring_group(self, timeout: datetime.timedelta):
        """One of this rank's K ring communicators: a gloo group over its ring's members (every rank makes every
        local rank's group, in the same order)."""
        mine = None
        for lr in range(self.layout.local):
            group = hopring.new_group(timeout, ranks=self.layout.ring_ranks(lr))
            if lr == self.layout.local_rank:
                mine = group
        return mine

    def ring(self, groups: list, table: tuple, timeout_s: float, **links) -> HierRing:
        """The hierarchical ring for one plan: the hop ring over this rank's ring groups, cut by its rows of
        `table`."""
        lay = self.layout
        ring = hopring.HopRing(
            groups,
            lay.host,
            lay.hosts,
            lay.rows(table),
            timeout_s,
            label=f"multistream hierarchical ring of local rank {lay.local_rank}",
            member="host",
            **links,
        )
        return HierRing(ring, self.local_group, lay, timeout_s, self.device)


class _Bucket:
    """One bucket's scratch: the padded input (the bucket itself when L divides it), the shard, its host copy."""

    def __init__(self, flat: torch.Tensor, local: int, cuda: bool):
        n = flat.numel()
        m = -(-n // local)
        self.n, self.flat = n, flat
        self.inp = flat if m * local == n else torch.zeros(m * local, dtype=flat.dtype, device=flat.device)
        self.shard = torch.empty(m, dtype=flat.dtype, device=flat.device)
        self.host = torch.empty(m, dtype=flat.dtype, pin_memory=True) if cuda else self.shard
        self.work = None  # gloo: the reduce-scatter in flight
        self.ready = None  # CUDA: the event after the shard's copy to the host


class HierRing:
    """The hop ring's interface (begin_step, submit, join, step_figures, close) for the engine, with the host's
    reduce-scatter before and all-gather after each bucket's ring."""

    def __init__(self, ring: hopring.HopRing, local_group, layout: Layout, timeout_s: float, device: torch.device):
        self.inner, self.local_group, self.layout = ring, local_group, layout
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.timeout_s = timeout_s
        self.cuda = device.type == "cuda"
        self.side = torch.cuda.Stream(device) if self.cuda else None
        self._buckets: dict[int, _Bucket] = {}
        self._launched: list[tuple[int, torch.Tensor]] = []

    @property
    def measure(self) -> bool:
        return self.inner.measure

    def begin_step(self, measure: bool) -> None:
        self._launched = []
        self.inner.begin_step(measure)

    def step_figures(self) -> list[float]:
        return self.inner.step_figures()

    def _error(self, b: int, what: str, e: BaseException) -> CommError:
        return CommError(
            f"multistream hierarchy: bucket {b}, the {what} among host {self.layout.host}'s local ranks failed: {e}. "
            f"A local rank died or stalled; collectives give up after dist.timeout_s={self.timeout_s:g} s"
        )

    def submit(self, b: int, flat: torch.Tensor) -> None:
        """On the training thread, in launch order: start bucket b's reduce-scatter inside the host, then hand the
        shard to the ring's lane, which waits for it."""
        s = self._buckets.get(b)
        if s is None or s.flat is not flat:
            s = self._buckets[b] = _Bucket(flat, self.layout.local, self.cuda)
        self._launched.append((b, flat))
        if self.cuda:
            current = torch.cuda.current_stream(flat.device)
            self.side.wait_stream(current)  # the bucket is averaged and cast on backward's stream
            with torch.cuda.stream(self.side):
                if s.inp is not flat:
                    s.inp[: s.n].copy_(flat)
                td.reduce_scatter_tensor(s.shard, s.inp, group=self.local_group, async_op=True).wait()
                s.host.copy_(s.shard, non_blocking=True)
                s.ready = torch.cuda.Event()
                s.ready.record(self.side)
            self.inner.submit(b, s.host, before=s.ready.synchronize)  # the lane thread waits, not backward
            return
        if s.inp is not flat:
            s.inp[: s.n].copy_(flat)
        try:
            s.work = td.reduce_scatter_tensor(s.shard, s.inp, group=self.local_group, async_op=True)
        except Exception as e:
            raise self._error(b, "reduce-scatter", e) from e
        self.inner.submit(b, s.host, before=lambda: self._wait_scatter(b, s))

    def _wait_scatter(self, b: int, s: _Bucket) -> None:
        try:
            s.work.wait(self.timeout)
        except Exception as e:
            raise self._error(b, "reduce-scatter", e) from e

    def join(self) -> None:
        """End of backward: wait for every bucket's ring, then gather the shards inside the host, in bucket order."""
        self.inner.join()
        launched, self._launched = self._launched, []
        if self.cuda:
            with torch.cuda.stream(self.side):
                for b, flat in launched:
                    s = self._buckets[b]
                    s.shard.copy_(s.host, non_blocking=True)
                    td.all_gather_into_tensor(s.inp, s.shard, group=self.local_group, async_op=True).wait()
                    if s.inp is not flat:
                        flat.copy_(s.inp[: s.n])
            torch.cuda.current_stream(self.side.device).wait_stream(self.side)
            return
        works = []
        for b, _ in launched:
            s = self._buckets[b]
            try:
                works.append(td.all_gather_into_tensor(s.inp, s.shard, group=self.local_group, async_op=True))
            except Exception as e:
                raise self._error(b, "all-gather", e) from e
        for (b, flat), work in zip(launched, works, strict=True):
            try:
                work.wait(self.timeout)
            except Exception as e:
                raise self._error(b, "all-gather", e) from e
            s = self._buckets[b]
            if s.inp is not flat:
                flat.copy_(s.inp[: s.n])

    def close(self) -> None:
        self.inner.close()
