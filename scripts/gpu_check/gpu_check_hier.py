"""The capture probe's `hierarchy` case: comm.hierarchy=host's GPU-only part (recipes/comm/hierarchy.py) on one GPU.

Two processes on cuda:0, each its own "host" of one local rank: the host's group is a one-rank NCCL group (two
processes cannot share an NCCL communicator on one GPU, so the default group is gloo), and the hop-balanced ring
between them runs over gloo on pinned host copies of CUDA buckets, with the reduce-scatter, the device<->pinned copies
and the all-gather on the ring's side stream. Three buckets (one of odd length) over two steps, under a hop table
whose two hosts cut differently, must equal DDP's mean (a gloo allreduce of the same buckets) within fp32 rounding.

    python -m scripts.gpu_check.gpu_check_capture --cases hierarchy          # on the GPU
    python -m scripts.gpu_check.gpu_check_capture --smoke --cases hierarchy  # its CPU twin: gloo inside the host too
"""

from __future__ import annotations

import datetime
import socket
import tempfile
from pathlib import Path

from base.reader import read_json
from base.writer import write_json
from scripts.gpu_check.gpu_check_rows import judged

SIZES = (1001, 4096, 77)  # elements per bucket: one odd, one small
STEPS, STREAMS = 2, 2
TABLE = ((700, 300), (250, 750))  # host 0 and host 1 cut their pieces differently
MAX_ERR = 1e-6  # fp32: two addends per element, the same in either order: rounding only
TIMEOUT_S = 60.0


def _rank(rank: int, port: int, cuda: bool, out: str) -> None:
    """One "host": the hierarchical ring against a gloo allreduce of the same buckets."""
    import torch
    import torch.distributed as td

    from recipes.comm.hierarchy import Hierarchy, Layout

    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    td.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timeout)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    hier = Hierarchy(Layout(2, 1, rank, 0), TIMEOUT_S, device, local_backend="nccl" if cuda else None)
    groups = [hier.new_ring_group(timeout) for _ in range(STREAMS)]
    ring = hier.ring(groups, TABLE, TIMEOUT_S)
    gen = torch.Generator().manual_seed(1234 + rank)
    err, scale = 0.0, 0.0
    try:
        for _ in range(STEPS):
            ring.begin_step(False)
            host = [torch.randn(n, generator=gen) / 2 for n in SIZES]  # already divided by the world size
            flats = [h.to(device, copy=True) for h in host]  # a copy on the CPU twin too: `host` is the reference
            for b, flat in enumerate(flats):
                ring.submit(b, flat)
            ring.join()  # backward's stream now waits for the side stream
            for ref in host:
                td.all_reduce(ref)  # DDP's mean of the same buckets
            got = [f.to("cpu", copy=True) for f in flats]  # on the current stream: after the all-gathers
            err = max([err] + [float((g - r).abs().max()) for g, r in zip(got, host, strict=True)])
            scale = max([scale] + [float(r.abs().max()) for r in host])
    finally:
        ring.close()
    write_json(Path(out, f"rank{rank}.json"), {"err": err, "scale": scale})
    td.destroy_process_group()


def run(cuda: bool) -> tuple[float, float]:
    """Both processes' largest difference from DDP's mean, and the largest mean, over every bucket and step."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_rank, args=(port, cuda, out), nprocs=2, start_method="spawn")
        found = [read_json(Path(out, f"rank{r}.json"), what="the hierarchy case's rank result") for r in range(2)]
    return max(f["err"] for f in found), max(f["scale"] for f in found)


def case_hierarchy(rows: list[dict], probe) -> None:
    err, scale = run(probe.cuda)
    where = "CUDA buckets staged through pinned memory, one-rank NCCL groups" if probe.cuda else "CPU twin, gloo"
    rows.append(
        judged(
            f"capture hierarchy: 2 processes each its own host, the hop ring between them over gloo ({where}): "
            "largest difference from DDP's mean",
            err,
            "",
            at_most=MAX_ERR * max(scale, 1.0),
            reference="DDP's mean (gloo allreduce) of the same buckets",
        )
    )
