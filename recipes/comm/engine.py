"""The per-step engine of `comm.backend: multistream`: launches, waits for and writes back one FusionPlan's buckets.

How a step goes (see plan.py for the plan itself):
- the gradients end in the buckets: every parameter has a view into its bucket's flat buffer, with the
  parameter's own shape and strides (channels_last stays channels_last), built once;
- every parameter has a post-accumulate-grad hook; when all gradients of bucket b are ready (and all buckets
  before it were launched, so every rank issues collectives in the same order), the bucket's gradients are
  copied into it by one multi-tensor copy (`_foreach_copy_`, not one `copy_` per parameter) and each `.grad`
  becomes its view, the bucket is divided by the world size in fp32, optionally cast to the fp16/bf16 wire
  format, and its S slices are allreduced asynchronously, slice j on communicator (b*S + j) mod K, while
  backward goes on. A gradient that already is its view (`.grad` was not set to None since the last step, so
  autograd accumulated into the bucket in place) is not copied;
- a callback queued on the autograd engine runs when backward ends: it launches any bucket not launched yet
  (unused parameters count as zeros), waits for every slice, and casts compressed buckets back (one copy per
  bucket). `loss.backward()` returns with averaged gradients in `.grad`, views into the buckets as with DDP's
  `gradient_as_bucket_view`, and the optimizer step needs nothing. Nothing is copied out of the buckets.

Why copy in rather than let autograd accumulate into the views: with `.grad` set to None before backward (the
trainer's `zero_grad(set_to_none=True)`), autograd hands over each fresh gradient without a kernel, and the copy is
one kernel per bucket; gradients kept as views would cost a zeroing per bucket plus one `add_` per parameter.

Concurrency (recipes/comm/concurrency.py decides which, docs/allreduce.md states the rule): `overlap` issues
every slice at once from the thread that runs the hooks, in plan order on every rank; `serialize` hands them to
one helper thread that issues each only after the previous one completed on the device (at most one collective
in flight over all communicators, NCCL's rule without implicit launch ordering). On a GPU the helper works on a
side stream of its own: the slice waits there for the bucket's copy (an event, not the host), and the helper
blocks on that side stream only, so backward's stream never waits for communication before the end of backward.
"""

from __future__ import annotations

import queue
import threading

import torch
import torch.distributed as td
from torch import nn

from base.errors import CommError
from recipes.comm.hopring import HopRing
from recipes.comm.plan import WIRE_DTYPES, FusionPlan
from recipes.comm.timing import Stopwatch
from recipes.lars import strided_view


class _Engine:
    """Runs one FusionPlan over the given communicators for every backward pass."""

    def __init__(
        self,
        plan: FusionPlan,
        params: list[nn.Parameter],
        groups: list,
        world: int,
        serialize: bool,
        timeout_s: float,
        *,
        rank: int = 0,
        links: list | None = None,
        recv_links: list | None = None,
        recv_groups: list | None = None,
        hierarchy=None,
    ):
        self.plan, self.params, self.groups, self.world = plan, params, groups, world
        self.timeout_s = timeout_s
        self.bucket_of, self.offset = {}, {}
        for b, idxs in enumerate(plan.buckets):
            off = 0
            for i in idxs:
                self.bucket_of[i], self.offset[i] = b, off
                off += plan.tensors[i].numel
        first = params[plan.buckets[0][0]]
        self.device = first.device
        self.buffers = [
            torch.empty(plan.bucket_numel(b), dtype=params[plan.buckets[b][0]].dtype, device=self.device)
            for b in range(len(plan.buckets))
        ]
        wire = WIRE_DTYPES[plan.compression]
        self.wire = [buf if wire is None else torch.empty_like(buf, dtype=wire) for buf in self.buffers]
        self.slices = [plan.slice_bounds(b) for b in range(len(plan.buckets))]
        # built once: the slices' views of the wire buffers and every parameter's gradient view into its bucket
        self.slice_views = [[w[lo:hi] for lo, hi in bounds] for w, bounds in zip(self.wire, self.slices, strict=True)]
        self.views = [
            strided_view(self.buffers[self.bucket_of[i]], p, self.offset[i]) if i in self.bucket_of else None
            for i, p in enumerate(params)
        ]
        self.counts = [len(idxs) for idxs in plan.buckets]
        self.active = False
        # Per step, three marks (first gradient, backward ended, averages written back): CUDA events on the
        # backward's stream, reached only when communication is done, or host times on CPU (recipes/comm/timing.py).
        self.clock = Stopwatch(self.device)
        self.marks: list[tuple] = []  # steps not yet read, oldest first
        self.timing = True  # False once the step is a CUDA graph: a replay runs no Python, so it marks nothing
        # comm.balance (recipes/comm/balance.py): while True, each step also marks when every communicator finished
        # its last slice (a callback on each slice's future on gloo, an event on a stream of its own on a GPU)
        self.measure = False
        # On gloo only the buckets from the first one that holds some communicator's last slice on get a callback
        # (ResNet-50, K=4, S=2: 2 of 12 buckets): a callback takes the GIL from backward's thread, and the end of a
        # communicator's work is its last slice.
        last = {}
        for b in range(len(plan.buckets)):
            for j, (lo, hi) in enumerate(self.slices[b]):
                if hi > lo:
                    last[plan.communicator(b, j)] = b
        self._measure_from = min(last.values(), default=0)
        self.comm_marks: list[tuple] = []  # steps not yet read: (start mark, [done mark per communicator])
        self.joined = None  # on a GPU: a mark after the newest measured step's communicators, on backward's stream
        self._meas_streams = None
        self.serialize = serialize
        self._queue: queue.Queue | None = None
        self._error: BaseException | None = None
        # serialize on a GPU: the helper thread's stream (never backward's, so backward keeps running)
        self._side = torch.cuda.Stream(self.device) if serialize and self.device.type == "cuda" else None
        # comm.balance_level=hop: every bucket goes whole to the hop-balanced ring (recipes/comm/hopring.py), whose
        # own thread runs the buckets in launch order; while measuring, each step reads the kernel's counters of the
        # K connections it sends on (`links`, recipes/comm/tcpinfo.py) and turns delayed ACKs off on the K it receives
        # on (`recv_links`); under comm.hierarchy=host (`hierarchy`, recipes/comm/hierarchy.py) the ring runs between
        # hosts on each bucket's shard, between a reduce-scatter and an all-gather inside the host
        ring_links = {"links": links, "recv_links": recv_links, "recv_groups": recv_groups}
        self.ring = None
        if plan.hop_shares is not None and hierarchy is not None:
            self.ring = hierarchy.ring(groups, plan.hop_shares, timeout_s, **ring_links)
        elif plan.hop_shares is not None:
            self.ring = HopRing(groups, rank, world, plan.hop_shares, timeout_s, **ring_links)
        self.hop_seconds: list[list[float]] = []  # steps not yet read: per outgoing connection, busy s then bytes
        if serialize and self.ring is None:
            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._serial_loop, name="multistream-serial", daemon=True)
            self._thread.start()

    # -- during backward --------------------------------------------------------------------------------
    def grad_ready(self, i: int) -> None:
        if not self.active:
            self.active = True
            self.t_start = self.clock.mark() if self.timing else None
            self.pending = list(self.counts)
            self.next_bucket = 0
            self.works = []
            self._done_at = [None] * len(self.groups)  # measure, host clocks: the last slice's completion
            self._children = []
            if self.ring is not None:
                self.ring.begin_step(self.measure and self.timing)
            torch.autograd.Variable._execution_engine.queue_callback(self.finalize)
        b = self.bucket_of[i]
        self.pending[b] -= 1
        while self.next_bucket < len(self.pending) and self.pending[self.next_bucket] == 0:
            self._launch(self.next_bucket)
            self.next_bucket += 1

    def _launch(self, b: int) -> None:
        buf = self.buffers[b]
        dst, src = [], []
        for i in self.plan.buckets[b]:
            p, view = self.params[i], self.views[i]
            g = p.grad
            if g is None:
                view.zero_()  # an unused parameter contributes zeros, as in DDP
            elif g is not view:
                dst.append(view)
                src.append(g)
            p.grad = view
        if dst:
            torch._foreach_copy_(dst, src)
        buf.div_(self.world)  # average in the gradients' own precision, before any cast to the wire format
        wire = self.wire[b]
        if wire is not buf:
            wire.copy_(buf)
        if self.ring is not None:
            self.ring.submit(b, wire)
            return
        event = None
        if self.serialize and wire.is_cuda:
            event = torch.cuda.Event()
            event.record()
        for j, part in enumerate(self.slice_views[b]):
            if part.numel() == 0:
                continue  # a tiny bucket under shares: every rank skips the same empty slice
            k = self.plan.communicator(b, j)
            if self.serialize:
                self._queue.put((b, j, k, part, event))
            else:
                work = td.all_reduce(part, group=self.groups[k], async_op=True)
                self.works.append((b, j, k, work))
                if self.measure and not part.is_cuda and b >= self._measure_from:
                    self._children.append(work.get_future().then(lambda _, k=k: self._slice_done(k)))

    def _slice_done(self, k: int) -> None:
        # a gloo thread, when communicator k finished a slice; its slices finish in order, so the last one wins
        self._done_at[k] = self.clock.mark()

    def _serial_loop(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                b, j, k, tensor, event = item
                if self._error is not None:
                    continue  # drain after a failure; finalize raises it
                self._serial_one(k, tensor, event)
            except BaseException as e:  # noqa: BLE001 - handed to the training thread
                self._error = self._comm_error(b, j, k, e)
            finally:
                self._queue.task_done()

    def _serial_one(self, k: int, tensor: torch.Tensor, event) -> None:
        """One slice, returning only once it completed on the device (the helper thread's only blocking point).

        On a GPU everything happens on the side stream: it waits for the bucket's copy (`event`, recorded on
        backward's stream), the collective is issued from it (ProcessGroupNCCL makes its own stream wait for the
        issuing one), `work.wait()` makes the side stream wait for the collective, and only the side stream is
        synchronised. Backward's stream is never made to wait, and the host thread that runs backward never blocks.
        """
        side = self._side
        if side is None:  # gloo: wait() returns when the collective is done
            td.all_reduce(tensor, group=self.groups[k], async_op=True).wait()
            return
        with torch.cuda.stream(side):
            if event is not None:
                side.wait_event(event)
            work = td.all_reduce(tensor, group=self.groups[k], async_op=True)
            work.wait()
        side.synchronize()

    def _comm_error(self, b: int, j: int, k: int, e: BaseException) -> CommError:
        return CommError(
            f"multistream: allreduce of bucket {b} slice {j} on communicator {k} failed: {e}. A peer died or "
            f"stalled; collectives give up after dist.timeout_s={self.timeout_s:g} s"
        )

    def finalize(self) -> None:
        """End of backward: launch what is left, wait for every slice; compressed buckets cast back into `.grad`."""
        try:
            while self.next_bucket < len(self.pending):
                self._launch(self.next_bucket)
                self.next_bucket += 1
            t_wait = self.clock.mark() if self.timing else None
            if self.ring is not None:
                self.ring.join()
                if self.ring.measure:
                    self.hop_seconds.append(self.ring.step_figures())
            elif self.serialize:
                self._queue.join()
                if self._error is not None:
                    err, self._error = self._error, None
                    raise err
                if self._side is not None:  # done on the device already; this orders the copy-back after it
                    torch.cuda.current_stream(self.device).wait_stream(self._side)
            elif self.measure and self.timing and self.device.type == "cuda":
                self._wait_per_communicator()
            else:
                for b, j, k, work in self.works:
                    try:
                        work.wait()
                    except Exception as e:
                        raise self._comm_error(b, j, k, e) from e
                if self.measure and self.timing:
                    for child in self._children:
                        child.wait()  # the callbacks that marked each communicator's end have run
                    self.comm_marks.append((self.t_start, list(self._done_at)))
            for buf, wire in zip(self.buffers, self.wire, strict=True):
                if wire is not buf:  # the fp16/bf16 wire copy holds the averages: back into the gradients' buffer
                    buf.copy_(wire)
            # after the copy-back, which the current stream runs only once it waited for every communicator
            if self.timing:
                self.marks.append((self.t_start, t_wait, self.clock.mark()))
        finally:
            self.works = []
            self.active = False

    def _wait_per_communicator(self) -> None:
        """On a GPU, while measuring: each communicator's slices are waited for on a stream of its own, where an
        event then marks when that communicator was done; backward's stream waits for all of those streams. A
        measuring stream does not wait for backward's first: a communicator done before backward ends reads its own
        time, not backward's (a communicator that carried nothing this step reads 0)."""
        if self._meas_streams is None:
            self._meas_streams = [torch.cuda.Stream(self.device) for _ in self.groups]
        current = torch.cuda.current_stream(self.device)
        done = [None] * len(self.groups)
        for k, side in enumerate(self._meas_streams):
            mine = [(b, j, work) for b, j, kk, work in self.works if kk == k]
            if not mine:
                continue
            with torch.cuda.stream(side):
                for b, j, work in mine:
                    try:
                        work.wait()
                    except Exception as e:
                        raise self._comm_error(b, j, k, e) from e
                done[k] = self.clock.mark()
            current.wait_stream(side)
        self.comm_marks.append((self.t_start, done))
        self.joined = self.clock.mark()  # reached once every communicator of every step marked so far is done

    def read_communicators(self, wait: bool) -> list[list[float]]:
        """Per finished step (oldest first), the seconds from its first gradient to each communicator's last slice
        being done (0 for a communicator that carried nothing); `wait`: of every step marked so far. Under the hop
        ring: per finished step, the seconds each connection to the left neighbour was busy sending, then the bytes
        it delivered (2K figures)."""
        if self.ring is not None:
            out, self.hop_seconds = self.hop_seconds, []
            return out
        if wait and self.joined is not None and self.comm_marks:
            self.clock.wait(self.joined)  # one host wait for them all, not one per communicator and step
        out = []
        while self.comm_marks:
            start, done = self.comm_marks[0]
            secs = [0.0 if d is None else self.clock.seconds(start, d, wait) for d in done]
            if any(x is None for x in secs):
                break
            out.append(secs)
            self.comm_marks.pop(0)
        return out

    def read_window(self, left: int) -> list[list[float]]:
        """`read_communicators` for the balancer, counting on the host: without a wait while fewer than `left`
        steps (what the window still needs) are marked, so the host waits once per window, at its last step."""
        return self.read_communicators(wait=len(self.comm_marks) >= left)

    def read(self, wait: bool) -> list[tuple[float, float]]:
        """(backward + sync, of which waiting) seconds of finished steps, oldest first; `wait`: of every step."""
        out = []
        while self.marks:
            start, t_wait, end = self.marks[0]
            step = self.clock.seconds(start, end, wait)
            if step is None:
                break  # the GPU has not got there yet; read it at a later step
            out.append((step, self.clock.seconds(t_wait, end)))
            self.marks.pop(0)
        return out

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
        if self._queue is not None:
            self._queue.put(None)
            self._thread.join(timeout=5)
