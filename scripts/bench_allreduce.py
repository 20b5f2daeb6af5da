#!/usr/bin/env python
"""Allreduce benchmark: ResNet-50's real gradient list (161 tensors, 25.6M parameters) through every backend.

For 2 and 4 ranks (gloo, CPU), on loopback and inside the network lab (scripts/netlab.py: one namespace per
rank, link cap per host, per-flow cap of 1/3 of the link), it measures per-step communication time and bus
bandwidth, 2(n-1)/n x bytes / time, for:
    per-tensor   one blocking allreduce per gradient after backward (the naive baseline)
    ddp          PyTorch DistributedDataParallel, bucket_cap_mb 25 (its default)
    multistream  our backend at the config defaults (comm.bucket_mb/streams/slices)
    tuned        our backend after its auto-tuner ran in the same process (the winner's settings are shown)
    horovod      real horovod.torch DistributedOptimizer, Horovod's defaults (gloo)
A "step" is backward over a graph that touches every parameter, then the gradient averaging; the same step
without any communication is timed too, and communication time = step time - that compute time.

    python scripts/bench_allreduce.py            # 2 and 4 ranks, loopback and lab (the lab needs root)
    python scripts/bench_allreduce.py --quick    # 2 ranks, fewer steps and candidates

Prints Markdown tables (the measured link beside them) and exits 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import netlab  # noqa: E402

METHODS = ["per-tensor", "ddp", "multistream", "tuned"]


# ---------------------------------------------------------------------------------------------------------
# One rank.


def _model():
    import timm
    import torch
    from torch import nn

    class GradList(nn.Module):
        """ResNet-50's parameters; forward touches each once, so backward yields exactly its gradient list."""

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = timm.create_model("resnet50")

        def forward(self, x):
            return sum(p.sum() for p in self.net.parameters()) * x

    return GradList()


def _timed(step, warmup: int, steps: int, sync) -> float:
    """Median seconds per step (a step ends when its averaging is done on this rank, which waits for the others)."""
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    sync()
    return statistics.median(times)


def worker(args) -> None:
    import torch
    import torch.distributed as td
    from torch.nn.parallel import DistributedDataParallel

    from recipes.comm.multistream import MultiStreamBackend
    from recipes.config import load_config
    from recipes.distributed import DistInfo

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    td.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    one = torch.ones(())
    out: dict = {"world": world}

    def barrier():
        td.barrier()

    def fresh():
        m = _model()
        return m, [p for p in m.parameters()]

    def zero(params):
        for p in params:
            p.grad = None

    model, params = fresh()
    nbytes = sum(p.numel() * p.element_size() for p in params)
    out["bytes"], out["tensors"] = nbytes, len(params)

    def compute():
        zero(params)
        model(one).backward()

    out["compute_s"] = _timed(compute, args.warmup, args.steps, barrier)
    ready_order = params[::-1]

    for method in args.methods:
        if method == "per-tensor":

            def step():
                compute()
                for p in ready_order:
                    td.all_reduce(p.grad)
                    p.grad.div_(world)

            out[method] = {"step_s": _timed(step, args.warmup, args.steps, barrier), "settings": "161 allreduces"}
        elif method == "ddp":
            m, ps = fresh()
            ddp = DistributedDataParallel(m, bucket_cap_mb=25, broadcast_buffers=False)

            def step(ddp=ddp, ps=ps):
                zero(ps)
                ddp(one).backward()

            out[method] = {"step_s": _timed(step, args.warmup, args.steps, barrier), "settings": "bucket_cap_mb 25"}
        elif method in ("multistream", "tuned"):
            over = ["run.device=cpu", f"dist.timeout_s={args.timeout}", "comm.tune_cache=null"]
            if method == "tuned":
                over += ["comm.autotune=true", f"comm.tune_max_candidates={args.candidates}",
                         "comm.tune_bucket_mb=[4,8,16,32]", "comm.tune_streams=[1,2,3,4]", "comm.tune_slices=[1,2,4]",
                         "comm.tune_warmup_steps=1", "comm.tune_steps_per_window=1", "comm.tune_windows=2"]  # fmt: skip
            cfg = load_config(None, over)
            backend = MultiStreamBackend(cfg, DistInfo(rank, world, 0, 1, torch.device("cpu")))
            m, ps = fresh()
            tm, _ = backend.prepare(m, None)

            def step(tm=tm, ps=ps, backend=backend):
                zero(ps)
                tm(one).backward()
                backend.on_step_end(0)

            t_tune = time.perf_counter()
            while backend.tuner is not None and not backend.tuner.done:
                step()
            tune_s = time.perf_counter() - t_tune
            out[method] = {"step_s": _timed(step, args.warmup, args.steps, barrier),
                           "settings": backend.settings.label().replace("bucket ", "")}  # fmt: skip
            if backend.tuner is not None:
                out[method]["tuning"] = {"seconds": tune_s, "candidates": backend.tuner.table()}
        else:
            raise SystemExit(f"unknown method {method}")
    if rank == 0:
        Path(args.out).write_text(json.dumps(out, indent=1))
    td.barrier()
    td.destroy_process_group()


def hvd_worker(args) -> None:
    import horovod.torch as hvd
    import torch

    torch.set_num_threads(1)
    hvd.init()
    one = torch.ones(())
    model = _model()
    params = list(model.parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.0), named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def barrier():
        hvd.allreduce(torch.zeros(1), name="barrier")

    def step():
        for p in params:
            p.grad = None
        model(one).backward()
        opt.synchronize()  # the averaged gradients are in .grad now (optimizer.step() would do this first)

    fusion = int(os.environ.get("HOROVOD_FUSION_THRESHOLD", 128 * 2**20)) / 2**20
    out = {"step_s": _timed(step, args.warmup, args.steps, barrier), "settings": f"fusion {fusion:g} MB"}
    if hvd.rank() == 0:
        Path(args.out).write_text(json.dumps(out, indent=1))
    barrier()
    hvd.shutdown()


def hvd_rendezvous(args) -> None:
    """Horovod's own rendezvous server (what horovodrun --gloo starts on the launching host); prints its port."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer()
    port = server.start()
    server.init(get_host_assignments(parse_hosts(args.hosts), args.np))
    print(port, flush=True)
    time.sleep(args.timeout)


# ---------------------------------------------------------------------------------------------------------
# The driver.


def _worker_cmd(kind: str, out: Path, args, lab) -> list[str]:
    steps = args.steps if lab else args.loopback_steps
    cmd = [sys.executable, str(Path(__file__).resolve()), kind, "--out", str(out), "--warmup", str(args.warmup),
           "--steps", str(steps), "--candidates", str(args.candidates), "--timeout", str(args.timeout)]  # fmt: skip
    if kind == "--worker":
        cmd += ["--methods", ",".join(METHODS)]
    return cmd


def _launch(n: int, argv: list[str], env_for, lab: netlab.NetLab | None, timeout: float) -> list[tuple[int, str]]:
    if lab is not None:
        return lab.run_all(lambda i: argv, env_for, timeout=timeout, cwd=str(ROOT))
    procs, files = [], []
    for i in range(n):
        f = tempfile.TemporaryFile("w+")
        procs.append(subprocess.Popen(argv, env={**os.environ, **env_for(i)}, stdout=f, stderr=subprocess.STDOUT,
                                      cwd=ROOT, start_new_session=True))  # fmt: skip
        files.append(f)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                netlab._kill_tree(q)
    res = []
    for p, f in zip(procs, files, strict=True):
        p.wait()
        f.seek(0)
        res.append((p.returncode, f.read()))
    return res


def _run_torch(n: int, lab, args, tmp: Path) -> dict:
    out = tmp / f"torch-{n}-{'lab' if lab else 'lo'}.json"
    master = lab.addr(0) if lab else "127.0.0.1"
    iface = "eth0" if lab else "lo"
    port = "29500" if lab else str(_free_port())

    def env(i):
        return {"RANK": str(i), "WORLD_SIZE": str(n), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": master, "MASTER_PORT": port, "GLOO_SOCKET_IFNAME": iface,
                "OMP_NUM_THREADS": "1"}  # fmt: skip

    res = _launch(n, _worker_cmd("--worker", out, args, lab), env, lab, args.timeout)
    if any(rc != 0 for rc, _ in res) or not out.is_file():
        raise RuntimeError("benchmark workers failed:\n" + "\n".join(o[-3000:] for _, o in res))
    return json.loads(out.read_text())


def _run_horovod(n: int, lab, args, tmp: Path) -> dict | str:
    try:
        import horovod.torch  # noqa: F401
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars
    except ImportError as e:
        return f"not installed ({e}); `make horovod`"
    out = tmp / f"hvd-{n}-{'lab' if lab else 'lo'}.json"
    hosts = ",".join(f"{lab.addr(i)}:1" for i in range(n)) if lab else f"localhost:{n}"
    iface = "eth0" if lab else "lo"
    rdv_cmd = [sys.executable, str(Path(__file__).resolve()), "--hvd-rendezvous", "--hosts", hosts, "--np", str(n),
               "--timeout", str(args.timeout)]  # fmt: skip
    rdv = lab.popen(0, rdv_cmd, stdout=subprocess.PIPE, text=True) if lab else subprocess.Popen(
        rdv_cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        port = int(rdv.stdout.readline())
        server = lab.addr(0) if lab else "127.0.0.1"
        slots = get_host_assignments(parse_hosts(hosts), n)

        def env(i):
            e = {**create_slot_env_vars(slots[i]), **create_run_env_vars(server, {iface}, port)}
            return {**{k: str(v) for k, v in e.items()}, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

        res = _launch(n, _worker_cmd("--hvd-worker", out, args, lab), env, lab, args.timeout)
    finally:
        netlab._kill_tree(rdv)
    if any(rc != 0 for rc, _ in res) or not out.is_file():
        return "failed: " + " | ".join(o.strip().splitlines()[-1] if o.strip() else f"rc {rc}" for rc, o in res)
    return json.loads(out.read_text())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loopback_mbit(streams: int, seconds: float = 2.0) -> float:
    port = _free_port()
    sink = subprocess.Popen([sys.executable, "-c", netlab._SINK, "127.0.0.1", str(port)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        time.sleep(1.0)
        r = subprocess.run([sys.executable, "-c", netlab._SOURCE, "127.0.0.1", str(port), str(streams), str(seconds)],
                           capture_output=True, text=True, timeout=seconds + 60)  # fmt: skip
        return float(r.stdout.strip())
    finally:
        netlab._kill_tree(sink)


def _table(title: str, n: int, res: dict, hvd, link_mbit: float | None) -> list[str]:
    rows = [f"\n**{title}, {n} ranks** ({res['tensors']} tensors, {res['bytes'] / 1e6:.1f} MB fp32 per step; "
            f"compute-only step {res['compute_s'] * 1000:.0f} ms)\n",
            "| method | settings | step ms | comm ms | bus bw Gbit/s | % of link cap | speed vs ddp |",
            "|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    entries = [(m, res[m]) for m in METHODS] + [("horovod", hvd)]
    comm = {}
    for m, r in entries:
        if isinstance(r, dict):
            comm[m] = max(r["step_s"] - res["compute_s"], 1e-6)
    for m, r in entries:
        if not isinstance(r, dict):
            rows.append(f"| {m} | {r} | | | | | |")
            continue
        bus = 2 * (n - 1) / n * res["bytes"] * 8 / comm[m] / 1e9
        pct = f"{100 * bus * 1000 / link_mbit:.0f}%" if link_mbit else "-"
        rows.append(f"| {m} | {r['settings']} | {r['step_s'] * 1000:.0f} | {comm[m] * 1000:.0f} | {bus:.2f} | {pct} | "
                    f"{comm['ddp'] / comm[m]:.2f}x |")  # fmt: skip
    tuning = res.get("tuned", {}).get("tuning")
    if tuning:
        cands = ", ".join(f"{c['bucket_mb']:g}/{c['streams']}/{c['slices']}: {c['median_step_s'] * 1000:.0f}"
                          for c in tuning["candidates"])  # fmt: skip
        rows.append(f"\nauto-tuner ({len(tuning['candidates'])} candidates in {tuning['seconds']:.0f} s; "
                    f"bucket MB/K/S: median backward+sync ms): {cands}")  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 ranks only, fewer timed steps, 4 tuner candidates")
    ap.add_argument("--worlds", type=int, nargs="+", default=None, help="rank counts (default 2 4)")
    ap.add_argument("--link-mbit", type=float, default=1000.0, help="lab: link cap per host (Mbit/s)")
    ap.add_argument("--flow-ratio", type=float, default=3.0, help="lab: per-flow cap = link / this")
    ap.add_argument("--no-lab", action="store_true", help="loopback only")
    ap.add_argument("--no-loopback", action="store_true", help="lab only")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=None, help="lab: timed steps per method (default 5; quick 3)")
    ap.add_argument("--loopback-steps", type=int, default=None, help="loopback: timed steps (default 15; quick 8)")
    ap.add_argument("--candidates", type=int, default=None, help="tuner candidates (default 8; quick 4)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds before a stuck run is killed")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hvd-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hvd-rendezvous", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--methods", default=",".join(METHODS), help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    ap.add_argument("--hosts", default="", help=argparse.SUPPRESS)
    ap.add_argument("--np", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.steps = args.steps or (3 if args.quick else 5)
    args.loopback_steps = args.loopback_steps or (8 if args.quick else 15)
    args.candidates = args.candidates or (4 if args.quick else 8)
    if args.worker:
        args.methods = args.methods.split(",")
        worker(args)
        return 0
    if args.hvd_worker:
        hvd_worker(args)
        return 0
    if args.hvd_rendezvous:
        hvd_rendezvous(args)
        return 0

    worlds = args.worlds or ([2] if args.quick else [2, 4])
    flow = args.link_mbit / args.flow_ratio
    lines = ["## Allreduce benchmark (scripts/bench_allreduce.py)", "",
             f"command: `python scripts/bench_allreduce.py {' '.join(argv if argv is not None else sys.argv[1:])}`; "
             f"gloo on CPU, {os.cpu_count()} cores, torch threads 1 per rank"]  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if not args.no_loopback:
            lines.append(f"\nloopback TCP measured: 1 stream {_loopback_mbit(1):.0f} Mbit/s, "
                         f"4 streams {_loopback_mbit(4):.0f} Mbit/s")  # fmt: skip
            for n in worlds:
                res = _run_torch(n, None, args, tmp)
                lines += _table("Loopback", n, res, _run_horovod(n, None, args, tmp), None)
                print("\n".join(lines), file=sys.stderr, flush=True)
        reason = None if args.no_lab else netlab.available()
        if reason:
            lines.append(f"\nnetwork lab skipped: {reason}")
        elif not args.no_lab:
            for n in worlds:
                with netlab.NetLab(n, args.link_mbit, flow) as lab:
                    one, four = netlab.measure_mbit(lab, 1, 2.0), netlab.measure_mbit(lab, 4, 2.0)
                    lines.append(f"\nnetwork lab, {n} hosts: link cap {args.link_mbit:g} Mbit/s per host and "
                                 f"direction, per-flow cap {flow:.0f} Mbit/s; measured TCP host 1 -> 0: 1 flow "
                                 f"{one:.0f} Mbit/s, 4 flows {four:.0f} Mbit/s")  # fmt: skip
                    res = _run_torch(n, lab, args, tmp)
                    hvd = _run_horovod(n, lab, args, tmp)
                lines += _table(f"Network lab ({args.link_mbit:g} Mbit/s link, {flow:.0f} Mbit/s per flow)", n, res,
                                hvd, args.link_mbit)  # fmt: skip
                print("\n".join(lines), file=sys.stderr, flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
