#!/usr/bin/env python
"""What comm.balance's measuring costs per step (a benchmark, not a test).

One gloo process (`comm.engage_single_rank`: the real engine, communicators and slice futures), ResNet-50's
gradient list at full size (161 tensors, 102 MB fp32), multistream K=4, S=2, 8 MB buckets. Blocks of steps with the
engine's per-communicator measuring off and on alternate; for each it reports the median step time and the CPU time
of the thread that runs backward and the hooks (where the measuring work is: one chained callback per slice, the
wait for those callbacks, reading the marks), and the difference as a share of the step.

    python -m scripts.bench.bench_balance_cost [--blocks 6 --steps 8]

`--level hop` measures `comm.balance_level: hop` instead: two gloo processes on loopback run the hop-balanced ring
(recipes/comm/hopring.py) over the same gradients, K=4, 8 MB buckets; its measuring work is reading the kernel's
counters of the K connections a rank sends on (recipes/comm/tcpinfo.py) at the step's first gradient and after its
last bucket, and turning delayed ACKs off on the K it receives on once per ring step, timed alone and as the step's
difference with measuring on and off.

    python -m scripts.bench.bench_balance_cost --level hop [--blocks 6 --steps 8]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

# Started as a file, Python puts only scripts/bench/ on the path: the repository goes first, so the imports
# below (the repository's packages) resolve as they do under `python -m`.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.bench import record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=6, help="blocks of each kind, alternated")
    ap.add_argument("--steps", type=int, default=8, help="steps per block")
    ap.add_argument("--fraction", type=float, default=1.0, help="each gradient at this fraction of its size")
    ap.add_argument("--level", choices=("communicator", "hop"), default="communicator", help="comm.balance_level")
    record.add_json_arg(ap)
    args = ap.parse_args(argv)
    record.check_json(args.json)
    if args.level == "hop":
        return _hop_main(args, argv)

    import torch
    import torch.distributed as td

    from recipes.comm.multistream import MultiStreamBackend
    from recipes.config import load_config
    from recipes.distributed import DistInfo
    from scripts.bench.bench_allreduce import _model

    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    td.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=120))
    cfg = load_config(
        None,
        [
            "run.device=cpu",
            "comm.engage_single_rank=true",
            "comm.tune_cache=null",
            f"comm.bucket_mb={8 * args.fraction:g}",
        ],
    )
    backend = MultiStreamBackend(
        cfg.comm, DistInfo(0, 1, 0, 1, torch.device("cpu")), timeout_s=120, model_name=cfg.model.name
    )
    model = _model(args.fraction)
    params = list(model.parameters())
    tm, _ = backend.prepare(model, None)
    one = torch.ones(())
    slices = sum(len(backend.engine.plan.slice_bounds(b)) for b in range(len(backend.engine.plan.buckets)))

    def step(measure: bool) -> tuple[float, float]:
        eng = backend.engine
        eng.measure = measure
        for p in params:
            p.grad = None
        c0, t0 = time.thread_time(), time.perf_counter()
        tm(one).backward()
        if measure:
            eng.read_communicators(wait=True)
        return time.perf_counter() - t0, time.thread_time() - c0

    for _ in range(3):
        step(False)
    res = {False: ([], []), True: ([], [])}
    for b in range(2 * args.blocks):
        measure = (b + b // 2) % 2 == 1  # off, on, on, off, ...: neither kind always goes first
        for _ in range(args.steps):
            wall, cpu = step(measure)
            res[measure][0].append(wall)
            res[measure][1].append(cpu)
    # The measuring work alone, without the step around it: a callback chained on each measured slice's future
    # (completed futures here), waiting for those callbacks, and reading the step's marks.
    eng = backend.engine
    measured = sum(1 for b in range(len(eng.plan.buckets)) if b >= eng._measure_from for _ in eng.slice_views[b])
    done = [torch.futures.Future() for _ in range(measured)]
    for f in done:
        f.set_result(None)
    eng._done_at = [None] * len(eng.groups)
    t0, reps = time.perf_counter(), 2000
    for _ in range(reps):
        children = [f.then(lambda _, k=i % len(eng.groups): eng._slice_done(k)) for i, f in enumerate(done)]
        for c in children:
            c.wait()
        eng.comm_marks.append((eng.clock.mark(), list(eng._done_at)))
        eng.read_communicators(wait=True)
    direct = (time.perf_counter() - t0) / reps
    off_w, on_w = statistics.median(res[False][0]), statistics.median(res[True][0])
    off_c, on_c = statistics.median(res[False][1]), statistics.median(res[True][1])
    print(
        f"comm.balance measuring cost: {backend.engine.plan.describe()}; {slices} slices per step; "
        f"{args.blocks} x {args.steps} steps each, alternated; {os.cpu_count()} cores, load "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; torch {torch.__version__}"
    )
    print("| measuring | median step ms | median CPU ms of the backward thread |")
    print("|---|---:|---:|")
    print(f"| off | {off_w * 1000:.1f} | {off_c * 1000:.2f} |")
    print(f"| on | {on_w * 1000:.1f} | {on_c * 1000:.2f} |")
    print(
        f"the measuring work alone ({measured} callbacks, their wait, reading the marks): {direct * 1e6:.0f} us per "
        f"step, {direct / off_w:.3%} of this step"
    )
    print(
        f"difference: {(on_c - off_c) * 1000:+.2f} ms CPU per step ({(on_c - off_c) / off_w:+.2%} of the step), "
        f"{(on_w - off_w) * 1000:+.1f} ms wall ({(on_w - off_w) / off_w:+.2%}, within the step's noise)"
    )
    record.write_json(
        args.json,
        "scripts.bench.bench_balance_cost",
        argv,
        {
            "plan": backend.engine.plan.describe(),
            "slices": slices,
            "measured_slices": measured,
            "direct_s": direct,
            "steps_each": args.blocks * args.steps,
            "off": {"step_s": res[False][0], "cpu_s": res[False][1]},
            "on": {"step_s": res[True][0], "cpu_s": res[True][1]},
        },
    )
    td.destroy_process_group()
    return 0


def _hop_main(args, argv) -> int:
    import torch.multiprocessing as mp

    port = 29562
    with mp.get_context("spawn").Manager() as manager:
        box = manager.dict()
        mp.spawn(_hop_rank, args=(args, port, box), nprocs=2, join=True)
        res = dict(box)
    off_w, on_w = statistics.median(res["off"]), statistics.median(res["on"])
    print(
        f"comm.balance_level=hop measuring cost: {res['plan']}; 2 gloo ranks on loopback; {args.blocks} x "
        f"{args.steps} steps each, alternated; {os.cpu_count()} cores, load "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; torch {res['torch']}"
    )
    print("| measuring | median step ms (rank 0) |")
    print("|---|---:|")
    print(f"| off | {off_w * 1000:.1f} |")
    print(f"| on | {on_w * 1000:.1f} |")
    work = res["direct_s"] + res["quickack_calls"] * res["quickack_s"]
    print(
        f"the measuring work alone: reading {res['links']} connections' TCP_INFO twice, "
        f"{res['direct_s'] * 1e6:.0f} us, and turning delayed ACKs off {res['quickack_calls']} times (once per ring "
        f"step and receiving connection), {res['quickack_s'] * 1e6:.1f} us each: {work * 1e6:.0f} us per step, "
        f"{work / off_w:.3%} of this step"
    )
    q = statistics.quantiles(res["off"], n=4)
    print(
        f"difference: {(on_w - off_w) * 1000:+.1f} ms wall ({(on_w - off_w) / off_w:+.2%}); the steps without "
        f"measuring spread over {(q[2] - q[0]) * 1000:.1f} ms (interquartile range)"
    )
    record.write_json(
        args.json,
        "scripts.bench.bench_balance_cost",
        argv,
        {
            "level": "hop",
            "plan": res["plan"],
            "links": res["links"],
            "direct_s": res["direct_s"],
            "quickack_calls": res["quickack_calls"],
            "quickack_s": res["quickack_s"],
            "steps_each": args.blocks * args.steps,
            "off": {"step_s": res["off"]},
            "on": {"step_s": res["on"]},
        },
    )
    return 0


def _hop_rank(rank: int, args, port: int, box) -> None:
    """One of the two ranks of `--level hop`; rank 0 leaves its figures in `box`."""
    import torch
    import torch.distributed as td

    from recipes.comm.multistream import MultiStreamBackend
    from recipes.config import load_config
    from recipes.distributed import DistInfo
    from scripts.bench.bench_allreduce import _model

    torch.set_num_threads(1)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"})
    td.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=120))
    cfg = load_config(
        None,
        [
            "run.device=cpu",
            "comm.tune_cache=null",
            "comm.balance=true",
            "comm.balance_level=hop",
            f"comm.bucket_mb={8 * args.fraction:g}",
        ],
    )
    backend = MultiStreamBackend(
        cfg.comm, DistInfo(rank, 2, rank, 2, torch.device("cpu")), timeout_s=120, model_name=cfg.model.name
    )
    model = _model(args.fraction)
    params = list(model.parameters())
    tm, _ = backend.prepare(model, None)
    one = torch.ones(())

    def step(measure: bool) -> float:
        eng = backend.engine
        eng.measure = measure
        for p in params:
            p.grad = None
        t0 = time.perf_counter()
        tm(one).backward()
        eng.read_communicators(wait=True)
        return time.perf_counter() - t0

    for _ in range(3):
        step(False)
    res = {False: [], True: []}
    for b in range(2 * args.blocks):
        measure = (b + b // 2) % 2 == 1  # off, on, on, off, ...: neither kind always goes first
        for _ in range(args.steps):
            res[measure].append(step(measure))
    ring, reps = backend.engine.ring, 2000
    t0 = time.perf_counter()
    for _ in range(reps):  # the measuring work alone: the counters at the first gradient, and after the last bucket
        ring.begin_step(True)
        ring.step_figures()
    direct = (time.perf_counter() - t0) / reps
    # ... and delayed ACKs turned off on every receiving connection that carries a piece, once per ring step
    calls = 2 * (ring.world - 1) * len(backend.engine.plan.buckets) * len(ring.recv_links)
    t0 = time.perf_counter()
    for _ in range(reps):
        ring._quickack(range(len(ring.recv_links)))
    quick = (time.perf_counter() - t0) / reps / len(ring.recv_links)
    ring.begin_step(False)
    if rank == 0:
        box.update(
            plan=backend.engine.plan.describe(),
            links=len(backend.links),
            direct_s=direct,
            quickack_calls=calls,
            quickack_s=quick,
            off=res[False],
            on=res[True],
            torch=torch.__version__,
        )
    td.barrier()
    td.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
