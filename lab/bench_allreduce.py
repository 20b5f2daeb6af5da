#!/usr/bin/env python
"""Allreduce benchmark: ResNet-50's real gradient list (161 tensors, 25.6M parameters) through every backend.

For 2 and 4 ranks (gloo, CPU), on loopback and inside the network lab (lab/netlab.py: one namespace per
rank, link cap per host, per-flow cap of 1/3 of the link), it measures per-step communication time and bus
bandwidth, 2(n-1)/n x bytes / time, for each lab method of lab/lab_methods.py (--help lists them:
per-tensor, the naive baseline; ddp, at one flow and at --flows; multistream at its defaults and tuned; Horovod).
A "step" is backward over a graph that touches every parameter, then the gradient averaging; the same step
without any communication is timed too, and communication time = step time - that compute time.

    python -m lab.bench_allreduce            # 2 and 4 ranks, loopback and lab (the lab needs root)
    python -m lab.bench_allreduce --quick    # 2 ranks, fewer steps and candidates
    python -m lab.bench_allreduce --no-loopback --worlds 8 16 --link-mbit 100 --fraction 0.125 --rounds 3 \
        --json lab.json                          # more hosts: gradients at 1/8 size, contenders alternated
    python -m lab.bench_allreduce --no-loopback --worlds 4 --local-ranks 2 --profile one-slow \
        --contenders ddp-flows,hop-balanced,hier-balanced  # hosts of 2 ranks each, as multi-GPU hosts run

With --local-ranks L every host runs L ranks (torchrun's numbering, LOCAL_RANK and LOCAL_WORLD_SIZE set), which
reach each other inside the host's namespace over loopback (the lab's stand-in for NVLink) and the other hosts over
the shaped link; under --profile each pair of ranks on different hosts has its own K draws of the profile.

Each rank's CPU time per step (getrusage, all threads) is reported beside the step time, to show whether the
run was network-bound; --json keeps every measurement for lab/predict_lab.py: every rank's step times, and
under --profile each contender's connections on every rank, with their ceilings and the bytes each carried per timed
step (which connections each collective ran on: lab/predict_flows.py --fit).

Prints Markdown tables (the measured link beside them) and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# `python lab/bench_allreduce.py` puts lab/ on sys.path, not the repository: the imports below need the root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from base import registry  # noqa: E402
from base.writer import write_output  # noqa: E402
from lab import netlab  # noqa: E402
from lab.lab_methods import LAB_METHODS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODULE = "lab.bench_allreduce"  # ranks and the Horovod rendezvous run it again, from ROOT

LAB = LAB_METHODS
# The methods the lab's own ranks run (--worker), in the tables' order; one with its own launcher (Horovod) runs apart.
METHODS = [name for name, m in LAB.items() if not m.own_launcher]
# The method its backend's own launcher runs (Horovod's horovodrun: --hvd-worker), a top-level entry of the JSON.
(APART,) = [name for name, m in LAB.items() if m.own_launcher]


# ---------------------------------------------------------------------------------------------------------
# One rank.


def shares_label(shares: list) -> str:
    """The balancer's shares in a table cell: a communicator's, or the hop table (each host's row; over 4 hosts, the
    smallest share of each host's row)."""
    if not shares or not isinstance(shares[0], (list, tuple)):
        return "/".join(str(x) for x in shares)
    if len(shares) <= 4:
        return " ".join("/".join(str(x) for x in row) for row in shares)
    return f"hop table, each host's smallest share {' '.join(str(min(row)) for row in shares)}"


def gradient_shapes(fraction: float = 1.0) -> list[tuple[str, tuple[int, ...]]]:
    """ResNet-50's parameters in registration order; with fraction < 1 each becomes a flat tensor of about
    `fraction` of its elements (at least 1), so the bucket plan at bucket size x fraction has the same cuts."""
    import timm
    import torch

    with torch.device("meta"):
        net = timm.create_model("resnet50")
    out = []
    for name, p in net.named_parameters():
        shape = tuple(p.shape) if fraction == 1.0 else (max(1, round(p.numel() * fraction)),)
        out.append((name, shape))
    return out


def _model(fraction: float = 1.0):
    import torch
    from torch import nn

    class GradList(nn.Module):
        """ResNet-50's gradient list; forward touches each parameter once, so backward yields exactly it."""

        def __init__(self):
            super().__init__()
            self.params = nn.ParameterList([nn.Parameter(torch.zeros(s)) for _, s in gradient_shapes(fraction)])

        def forward(self, x):
            return sum(p.sum() for p in self.params) * x

    return GradList()


def _cpu_seconds() -> float:
    """CPU time of this process, all its threads (gloo's and Horovod's included), user + system."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timed(step, warmup: int, steps: int, sync, meter=None) -> tuple[list[float], list[float], dict]:
    """Seconds and CPU seconds of each of `steps` steps, after `warmup` untimed ones (a step ends when its
    averaging is done on this rank, which waits for the others); with `meter` (a function returning counters by
    connection), also what each counter grew by over the timed steps."""
    for _ in range(warmup):
        step()
    sync()
    times, cpu = [], []
    before = meter() if meter else {}
    for _ in range(steps):
        c0, t0 = _cpu_seconds(), time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        cpu.append(_cpu_seconds() - c0)
    sync()  # every rank has received all it was sent: the counters hold the timed steps whole
    grew = {c: n - before[c] for c, n in meter().items() if c in before} if meter else {}
    return times, cpu, grew


def _rounds(contenders: dict, args, sync, meter=None) -> dict:
    """Time every contender in `args.rounds` rounds, the order rotated each round (so drifting load on a shared
    machine falls on all of them alike); per contender: all step times and CPU times, and with `meter` (contender ->
    a function returning counters by connection, or None) what they grew by over its timed steps."""
    names = list(contenders)
    out = {m: {"times": [], "cpu": [], "grew": {}} for m in names}
    for r in range(args.rounds):
        for m in names[r % len(names) :] + names[: r % len(names)]:
            times, cpu, grew = _timed(contenders[m], args.warmup, args.steps, sync, meter and meter(m))
            out[m]["times"] += times
            out[m]["cpu"] += cpu
            for c, n in grew.items():
                out[m]["grew"][c] = out[m]["grew"].get(c, 0) + n
    return out


class _FlowPins:
    """--profile: pins each contender's connections on this host to leaves whose ceilings the profile gives
    (lab/netlab_flows.py), the same ceilings for every contender; `pins` keeps what was pinned, per contender.

    With `local` ranks per host (--local-ranks), the host's ranks share its eth0: local rank 0 clears the pins, each
    rank pins only its own connections to other hosts, on its own range of the pinned leaves, and each pair of ranks
    on different hosts has its own K draws of the profile (`pin`'s `peer_rank`)."""

    def __init__(self, rank: int, world: int, args, local: int = 1, barrier=None):
        from lab import netlab_flows

        self.rank, self.args, self.local = rank, args, local
        self.peer_of = {f"{netlab.SUBNET}.{i + 1}": i for i in range(world)}
        if rank % local == 0:  # an earlier launch's pins (the throughput check's, the torch contenders')
            netlab_flows.clear_pins("eth0")
        if barrier is not None:
            barrier()  # no local rank pins before they are cleared
        span = netlab_flows.PIN_LEAVES // local
        self.next_leaf, self.last_leaf = (rank % local) * span, (rank % local + 1) * span
        self.pins: dict[str, list] = {}
        self.conns: dict[str, list[tuple[int, str, int]]] = {}  # per contender: (local port, peer, peer port)

    def pin(
        self, method: str, groups: list, one_way: bool = False, draws: int | None = None, peer_rank: dict | None = None
    ) -> None:
        """`peer_rank`: each connection's peer rank (None: the peer host, by address); connections to a rank of this
        host (its local ranks', over loopback) are not pinned."""
        from lab import netlab_flows

        if peer_rank is not None:
            host = self.rank // self.local
            groups = [[c for c in g if c in peer_rank and peer_rank[c] // self.local != host] for g in groups]
        pins = netlab_flows.pins_for(
            groups,
            profile=self.args.profile,
            seed=self.args.seed,
            host=self.rank,
            peer_of=self.peer_of,
            flow_mbit=self.args.flow_mbit,
            first_leaf=self.next_leaf,
            one_way=one_way,
            draws=draws,
            peer_of_conn=peer_rank,
        )
        self.next_leaf = max([self.next_leaf - 1, *(p.leaf for p in pins)]) + 1
        if self.next_leaf > self.last_leaf:
            raise ValueError(f"{method}: pinned leaves up to {self.next_leaf}, past this rank's {self.last_leaf}")
        netlab_flows.apply_pins(pins, "eth0", self.args.link_mbit, self.args.burst_ms, self.args.packet_segs)
        self.pins[method] = [[p.sport, p.dst, p.classid, round(p.ceil_mbit, 3), p.dport] for p in pins]
        self.conns[method] = sorted({c for g in groups for c in g})

    def meter(self, method: str):
        """A function returning the bytes `method`'s connections on this host have had acknowledged so far (None
        for a contender without pinned connections)."""
        if not self.conns.get(method):
            return None
        from recipes.comm import tcpinfo

        links = {}
        for fd, inode in tcpinfo.sockets().items():
            ends = tcpinfo.endpoints(fd)
            if ends is not None:
                (_, lport), (raddr, rport) = ends
                links[(lport, raddr, rport)] = tcpinfo.Link(fd, inode)
        mine = {c: links[c] for c in self.conns[method] if c in links}
        return lambda: {c: link.read().acked for c, link in mine.items()}

    def carried(self, method: str, grew: dict, steps: int) -> list[list]:
        """Each of `method`'s connections on this host: [local port, peer, peer port, ceiling Mbit/s, bytes sent per
        timed step] (the ceiling its pin set), so a model can tell which connections each collective ran on."""
        ceil = {(p[0], p[1], p[4]): p[3] for p in self.pins[method]}
        return [[*c, ceil.get(c), round(grew[c] / steps)] for c in self.conns[method] if c in grew]


@contextlib.contextmanager
def _groups_of(method: str, flows: _FlowPins | None, one_way: bool = False):
    """Records the TCP connections each process group created inside the block opened (one list per group),
    then pins them as the flow profile says (`one_way`: half the groups send, half receive; netlab_flows.pins_for)."""
    if flows is None:
        yield
        return
    import torch.distributed as td

    from lab import netlab_flows

    groups, original = [], td.new_group

    def tracked(*a, **kw):
        before = netlab_flows.established()
        g = original(*a, **kw)
        td.barrier(group=g)  # every connection of the group is up
        groups.append(sorted(netlab_flows.established() - before))
        return g

    td.new_group = tracked
    try:
        yield
    finally:
        td.new_group = original
    # This process's own connections only (the host's other local ranks open theirs in the same namespace at the
    # same time), each with its peer's rank: the rank whose end it is, from every rank's local ports.
    mine = _own_connections()
    everyone = [None] * td.get_world_size()
    td.all_gather_object(everyone, (_own_addr(), sorted({c[0] for c in mine})))
    owner = {(addr, port): r for r, (addr, ports) in enumerate(everyone) for port in ports}
    peer_rank = {c: owner[c[1], c[2]] for c in mine if (c[1], c[2]) in owner}
    flows.pin(method, [[c for c in g if c in mine] for g in groups], one_way, peer_rank=peer_rank)


def _own_connections() -> set[tuple[int, str, int]]:
    """(local port, peer address, peer port) of this process's established TCP connections (its own descriptors)."""
    from recipes.comm import tcpinfo

    out = set()
    for fd in tcpinfo.sockets():
        ends = tcpinfo.endpoints(fd)
        if ends is not None:
            (_, lport), (raddr, rport) = ends
            out.add((lport, raddr, rport))
    return out


def _own_addr() -> str:
    """This lab host's address (eth0's): the peers' view of its connections' ends."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((f"{netlab.SUBNET}.254", 9))  # no packet is sent: the route picks eth0's address
        return s.getsockname()[0]


class _Notes:
    """The log a backend's on_step_end writes to (its re-plans, where it settled), kept for the JSON."""

    def __init__(self):
        self.lines: list[str] = []
        self.steps = 0

    def info(self, msg: str) -> None:
        self.lines.append(msg)


def per_tensor(model, params, one, world):
    """The lab-only baseline (lab_methods.LAB_METHODS per-tensor): one blocking allreduce per gradient after backward;
    (step, its settings label)."""
    import torch.distributed as td

    def step():
        _zero(params)
        model(one).backward()
        for p in params[::-1]:  # gradient-ready order
            td.all_reduce(p.grad)
            p.grad.div_(world)

    return step, f"{len(params)} allreduces"


def _zero(params) -> None:
    for p in params:
        p.grad = None


# The tuner's search space in the lab (tuned methods), bucket sizes at the lab's fraction.
TUNE_BUCKETS_MB = (4, 8, 16, 32)


def lab_overrides(method: str, args) -> list[str]:
    """The config of `method`'s backend in the lab: its record's backend at the config's bucket size x --fraction,
    on --flows gloo devices for a flows method, tuned in the same process for a tuned one, and its own overrides."""
    from recipes.config.schema import CommConfig

    lab, f = LAB[method], args.fraction
    rec = registry.ALLREDUCE_BACKENDS[lab.backend]
    bucket = lab.bucket_mb if lab.bucket_mb is not None else getattr(CommConfig(backend=rec.name), rec.bucket_key)
    over = [
        "run.device=cpu",
        f"dist.timeout_s={args.timeout}",
        f"comm.backend={rec.name}",
        "comm.tune_cache=null",
        f"comm.{rec.bucket_key}={bucket * f:g}",
    ]
    if lab.flows:
        over.append(f"comm.gloo_devices={args.flows}")
    if lab.tuned:
        over += [
            "comm.autotune=true",
            f"comm.tune_max_candidates={args.candidates}",
            f"comm.tune_bucket_mb=[{','.join(f'{b * f:g}' for b in TUNE_BUCKETS_MB)}]",
            "comm.tune_streams=[1,2,3,4]",
            "comm.tune_slices=[1,2,4]",
            "comm.tune_warmup_steps=1",
            "comm.tune_steps_per_window=1",
            "comm.tune_windows=2",
            *args.tune_over,
        ]
    over += lab.overrides
    if any(o.startswith("comm.balance=") and not o.endswith("=false") for o in lab.overrides):
        over.append(f"comm.balance_window={args.balance_window}")
    if "comm.tune_start=model" in lab.overrides:  # the model's ranking for this lab, and half the candidates
        over += [
            f"comm.link_gbit={args.link_mbit / 1000}",
            f"comm.flow_gbit={args.flow_mbit / 1000}",
            f"comm.latency_us={args.latency_us}",
            f"comm.tune_max_candidates={max(1, args.candidates // 2)}",
        ]
    return over


def worker(args) -> None:
    import torch
    import torch.distributed as td

    from recipes.comm import create_allreduce
    from recipes.comm import stepmodel as sm
    from recipes.config import load_config
    from recipes.distributed import DistInfo, teardown

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    td.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    flows = _FlowPins(rank, world, args, local, td.barrier) if args.profile else None
    one = torch.ones(())
    f = args.fraction
    out: dict = {"world": world, "local_ranks": local, "fraction": f, "rounds": args.rounds}

    def fresh():
        m = _model(f)
        return m, list(m.parameters())

    model, params = fresh()
    out["bytes"], out["tensors"] = sum(p.numel() * p.element_size() for p in params), len(params)

    def compute():
        _zero(params)
        model(one).backward()

    contenders, settings, tuning, balancing = {"compute": compute}, {"compute": "no communication"}, {}, {}
    backends = {}
    for method in args.methods:
        lab = LAB[method]
        if not lab.backend:  # lab-only: its own builder
            contenders[method], settings[method] = registry.resolve(lab.build)(model, params, one, world)
            continue
        cfg = load_config(None, lab_overrides(method, args))
        backend = create_allreduce(
            cfg.comm,
            DistInfo(rank, world, local_rank, local, torch.device("cpu")),
            timeout_s=cfg.dist.timeout_s,
            model_name=cfg.model.name,
        )
        m, ps = fresh()
        with _groups_of(method, flows, getattr(backend, "one_way", False)):
            tm, _ = backend.prepare(m, None)

        notes = _Notes()

        def step(tm=tm, ps=ps, backend=backend, notes=notes):
            _zero(ps)
            tm(one).backward()
            notes.steps += 1
            backend.on_step_end(notes.steps, notes)

        # A backend that tunes or balances itself (multistream) is timed once it settled.
        tuner = getattr(backend, "tuner", None)
        t_tune = time.perf_counter()
        while tuner is not None and not tuner.done:
            step()
        t_balance, balance_steps = time.perf_counter(), 0
        balancing_now = getattr(backend, "_balancing", None)  # a backend with a balancer: until it settles
        while balancing_now is not None and balancing_now() and balance_steps < 60:
            step()
            balance_steps += 1
        if getattr(backend, "balance", None) is not None:
            b = backend.balance
            balancing[method] = {
                "seconds": time.perf_counter() - t_balance,
                "steps": balance_steps,
                "replans": b.replans,
                "settled": b.settled,
                "shares": list(b.current),
                "log": notes.lines,  # the balancer's own lines: each re-plan, its test, where it settled
            }
        if tuner is not None:
            tuning[method] = {
                "seconds": time.perf_counter() - t_tune,
                "candidates": tuner.table(),
                "start": tuner.summary(),
            }
        contenders[method], backends[method] = step, backend
        # Its settings as it runs them (the tuner's winner), described by its step model: predict_lab reads them back.
        live = backend.stats().settings
        settings[method] = sm.settings_label(lab.backend, len(ps), sm.pattern(lab.backend).settings(live))
        if lab.flows:
            settings[method] += f", {args.flows} flows"
        if method in balancing:
            b = balancing[method]
            shares = shares_label(b["shares"])
            settled = "settled" if b["settled"] else "not settled"
            settings[method] += (
                f", {b['replans']} re-plans, {settled} after {b['steps']} steps ({b['seconds']:.0f} s), shares {shares}"
            )
    res = _rounds(contenders, args, td.barrier, flows and flows.meter)
    if flows is not None:
        out["pins"] = flows.pins
        carried = [None] * world
        td.all_gather_object(
            carried, {m: flows.carried(m, res[m]["grew"], args.rounds * args.steps) for m in flows.conns}
        )
        out["connections"] = {m: [c[m] for c in carried] for m in flows.conns}  # per contender, per rank
    times = [None] * world
    td.all_gather_object(times, {m: r["times"] for m, r in res.items()})
    cpu = [None] * world
    td.all_gather_object(cpu, {m: statistics.median(r["cpu"]) for m, r in res.items()})
    out["compute_s"] = statistics.median(res["compute"]["times"])
    out["compute_times"] = res["compute"]["times"]
    out["compute_cpu"] = [c["compute"] for c in cpu]
    for m in args.methods:
        out[m] = {
            "step_s": statistics.median(res[m]["times"]),
            "times": res[m]["times"],
            "rank_times": [t[m] for t in times],  # every rank's: a ring's ranks finish a step at different times
            "settings": settings[m],
            "cpu_s": [c[m] for c in cpu],
        }
    for method, t in tuning.items():
        out[method]["tuning"] = t
    for method, b in balancing.items():
        out[method]["balancing"] = b
    if rank == 0:
        Path(args.out).write_text(json.dumps(out, indent=1))
    td.barrier()
    teardown()  # waits for gloo's workers too: see recipes.distributed.teardown


def hvd_worker(args) -> None:
    import horovod.torch as hvd
    import torch

    torch.set_num_threads(1)
    hvd.init()
    one = torch.ones(())
    model = _model(args.fraction)
    params = list(model.parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.0), named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def barrier():
        hvd.allreduce(torch.zeros(1), name="barrier")

    flows = None
    # The lab's flow profile: Horovod's connections to each peer (4 in the lab, of which its ring uses one) take the
    # profile's K draws as every contender's do, connection k draw k (pins_for); more than K: one draw each
    if args.profile:
        from lab import netlab_flows

        barrier()  # every connection is up
        flows = _FlowPins(hvd.rank(), hvd.size(), args)
        rendezvous = int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"])
        mine = f"{netlab.SUBNET}.{hvd.rank() + 1}"
        conns = [c for c in netlab_flows.established() if c[1] in flows.peer_of and c[1] != mine and rendezvous != c[2]]
        most = max([sum(1 for c in conns if c[1] == peer) for peer in flows.peer_of] or [0])
        flows.pin(APART, [conns], draws=args.flows if most <= args.flows else None)

    def step():
        for p in params:
            p.grad = None
        model(one).backward()
        opt.synchronize()  # the averaged gradients are in .grad now (optimizer.step() would do this first)

    res = _rounds({APART: step}, args, barrier, flows and flows.meter)[APART]
    cpu = hvd.allgather_object(statistics.median(res["cpu"]))
    fusion = int(os.environ.get("HOROVOD_FUSION_THRESHOLD", 128 * 2**20)) / 2**20
    out = {
        "step_s": statistics.median(res["times"]),
        "times": res["times"],
        "settings": f"fusion {fusion:g} MB",
        "cpu_s": list(cpu),
        "rank_times": hvd.allgather_object(res["times"]),
    }
    if flows is not None:  # as the torch contenders' (worker): its pins and each connection's bytes, per rank
        out["pins"] = hvd.allgather_object(flows.pins[APART])
        out["connections"] = hvd.allgather_object(flows.carried(APART, res["grew"], args.rounds * args.steps))
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
    cmd = [
        sys.executable,
        "-m",
        MODULE,
        kind,
        "--out",
        str(out),
        "--warmup",
        str(args.warmup),
        "--steps",
        str(steps),
        "--rounds",
        str(args.rounds),
        "--candidates",
        str(args.candidates),
        "--timeout",
        str(args.timeout),
        "--fraction",
        repr(args.fraction),
        "--link-mbit",
        str(args.link_mbit),
        "--flow-ratio",
        str(args.flow_ratio),
        "--latency-us",
        str(args.latency_us),
        "--flows",
        str(args.flows),
        "--seed",
        str(args.seed),
        "--balance-window",
        str(args.balance_window),
        "--local-ranks",
        str(args.local_ranks),
    ]
    if args.profile:
        cmd += ["--profile", args.profile]
    if args.burst_ms is not None:
        cmd += ["--burst-ms", repr(args.burst_ms)]
    if args.packet_segs is not None:
        cmd += ["--packet-segs", str(args.packet_segs)]
    if kind == "--worker":
        cmd += ["--methods", ",".join(m for m in args.contenders if not LAB[m].own_launcher)]
        cmd += [f"--tune-over={o}" for o in args.tune_over]
    return cmd


def _launch(
    n: int, argv: list[str], env_for, lab: netlab.NetLab | None, timeout: float, per_host: int = 1
) -> list[tuple[int, str]]:
    """Run the workers of n hosts, `per_host` on each; RuntimeError if they ran past `timeout` and were stopped
    (whoever was stopped first looks like a dead peer to the others, so their tracebacks say nothing of the
    timeout)."""
    start = time.monotonic()
    res = _run_workers(n, argv, env_for, lab, timeout, per_host)
    if time.monotonic() - start >= timeout and any(rc != 0 for rc, _ in res):
        raise RuntimeError(
            f"benchmark workers ran past --timeout {timeout:g} s and were stopped: give a longer --timeout (the "
            "first worker stopped looks like a dead peer to the others). Their output:\n"
            + "\n".join(o[-1000:] for _, o in res)
        )
    return res


def _run_workers(n: int, argv: list[str], env_for, lab: netlab.NetLab | None, timeout: float, per_host: int = 1):
    if lab is not None:
        return lab.run_all(lambda i: argv, env_for, timeout=timeout, cwd=str(ROOT), per_host=per_host)
    procs, files = [], []
    for i in range(n * per_host):
        f = tempfile.TemporaryFile("w+")
        procs.append(
            subprocess.Popen(
                argv,
                env={**os.environ, **env_for(i)},
                stdout=f,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                start_new_session=True,
            )
        )
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
    """The torch contenders on n hosts of --local-ranks ranks each (torchrun's numbering: rank = host x L + local
    rank; on loopback every rank is on the one machine all the same)."""
    out = tmp / f"torch-{n}-{'lab' if lab else 'lo'}.json"
    master = lab.addr(0) if lab else "127.0.0.1"
    iface = "eth0" if lab else "lo"
    port = "29500" if lab else str(_free_port())
    local = args.local_ranks

    def env(i):
        return {
            "RANK": str(i),
            "WORLD_SIZE": str(n * local),
            "LOCAL_RANK": str(i % local),
            "LOCAL_WORLD_SIZE": str(local),
            "MASTER_ADDR": master,
            "MASTER_PORT": port,
            "GLOO_SOCKET_IFNAME": iface,
            "OMP_NUM_THREADS": "1",
        }

    res = _launch(n, _worker_cmd("--worker", out, args, lab), env, lab, args.timeout, local)
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
    rdv_cmd = [
        sys.executable,
        "-m",
        MODULE,
        "--hvd-rendezvous",
        "--hosts",
        hosts,
        "--np",
        str(n),
        "--timeout",
        str(args.timeout),
    ]
    rdv = (
        lab.popen(0, rdv_cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        if lab
        else subprocess.Popen(rdv_cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
    )
    try:
        port = int(rdv.stdout.readline())
        server = lab.addr(0) if lab else "127.0.0.1"
        slots = get_host_assignments(parse_hosts(hosts), n)

        def env(i):
            e = {**create_slot_env_vars(slots[i]), **create_run_env_vars(server, {iface}, port)}
            fusion = str(int(128 * 2**20 * args.fraction))  # Horovod's default threshold, x fraction
            e = {**e, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HOROVOD_FUSION_THRESHOLD": fusion}
            return {k: str(v) for k, v in e.items()}

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
    sink = subprocess.Popen(
        [sys.executable, "-c", netlab._SINK, "127.0.0.1", str(port)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(1.0)
        r = subprocess.run(
            [sys.executable, "-c", netlab._SOURCE, "127.0.0.1", str(port), str(streams), str(seconds)],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
        )
        return float(r.stdout.strip())
    finally:
        netlab._kill_tree(sink)


def _table(title: str, n: int, res: dict, hvd, link_mbit: float | None) -> list[str]:
    frac = f", {res['fraction']:g} of each tensor" if res.get("fraction", 1.0) != 1.0 else ""
    local = f" x {res['local_ranks']} local ranks" if res.get("local_ranks", 1) > 1 else ""
    rows = [
        f"\n**{title}, {n} hosts{local}** ({res['tensors']} tensors{frac}, {res['bytes'] / 1e6:.1f} MB fp32 per step; "
        f"compute-only step {res['compute_s'] * 1000:.0f} ms; medians of {res.get('rounds', 1)} x "
        f"{len(res['compute_times']) // res.get('rounds', 1)} steps)\n",
        "| hosts | method | settings | step ms | comm ms | bus bw Gbit/s | % of link cap | speed vs ddp "
        "| vs ddp (N flows) | CPU ms/step (busiest rank) | CPU load |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    entries = [(m, res[m]) for m in METHODS if m in res] + [(APART, hvd)]
    comm, ref = {}, float("nan")
    for m, r in entries:
        if isinstance(r, dict):
            comm[m] = max(r["step_s"] - res["compute_s"], 1e-6)
    ref = comm.get(registry.REFERENCE_BACKEND, float("nan"))
    ref_n = comm.get("ddp-flows", float("nan"))
    for m, r in entries:
        if not isinstance(r, dict):
            rows.append(f"| {n} | {m} | {r} | | | | | | | | |")
            continue
        bus = 2 * (n - 1) / n * res["bytes"] * 8 / comm[m] / 1e9
        pct = f"{100 * bus * 1000 / link_mbit:.0f}%" if link_mbit else "-"
        load = sum(r["cpu_s"]) / ((os.cpu_count() or 1) * r["step_s"])
        rows.append(
            f"| {n} | {m} | {r['settings']} | {r['step_s'] * 1000:.0f} | {comm[m] * 1000:.0f} | "
            f"{bus:.2f} | {pct} | {ref / comm[m]:.2f}x | {ref_n / comm[m]:.2f}x | {max(r['cpu_s']) * 1000:.0f} | "
            f"{100 * load:.0f}% |"
        )
    for m in [name for name, lab in LAB.items() if lab.tuned]:
        tuning = res.get(m, {}).get("tuning")
        if not tuning:
            continue
        cands = ", ".join(
            f"{c['bucket_mb']:g}/{c['streams']}/{c['slices']}: {c['median_step_s'] * 1000:.0f}"
            + (f" (predicted {c['predicted_s'] * 1000:.0f})" if "predicted_s" in c else "")
            for c in tuning["candidates"]
        )
        rows.append(
            f"\n{m}: auto-tuner, {len(tuning['candidates'])} candidates in {tuning['seconds']:.0f} s; "
            f"{tuning['start']} (bucket MB/K/S: median backward+sync ms): {cands}"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    methods = "\n".join(f"  {name:<12} {m.what}" for name, m in LAB.items())
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=f"lab methods (--contenders):\n{methods}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--quick", action="store_true", help="2 ranks only, fewer timed steps, 4 tuner candidates")
    ap.add_argument("--worlds", type=int, nargs="+", default=None, help="rank counts (default 2 4)")
    ap.add_argument("--link-mbit", type=float, default=1000.0, help="lab: link cap per host (Mbit/s)")
    ap.add_argument("--flow-ratio", type=float, default=3.0, help="lab: per-flow cap = link / this")
    ap.add_argument("--latency-us", type=float, default=50.0, help="tuned-model: per-message latency it assumes")
    ap.add_argument("--flows", type=int, default=4, help="ddp-flows: gloo devices (TCP flows per peer) of DDP's group")
    ap.add_argument(
        "--profile",
        default="",
        help="lab: a flow profile (lab/netlab_flows.py: even, one-slow, collide, random): every contender's "
        "connections pinned to leaves with the profile's ceilings",
    )
    ap.add_argument("--seed", type=int, default=0, help="--profile: the seed of one-slow's and random's draws")
    ap.add_argument(
        "--burst-ms",
        type=float,
        default=None,
        help="lab: each shaping class's token-bucket burst in milliseconds of its rate (lab/netlab.py; default: "
        "fixed 128-256 KB)",
    )
    ap.add_argument(
        "--packet-segs",
        type=int,
        default=None,
        metavar="N",
        help="lab: packets of at most N MSS through the shapers, so connections sharing the link interleave as at a "
        "switch (lab/netlab.py; default: the kernel's 64 KB GSO packets)",
    )
    ap.add_argument("--balance-window", type=int, default=2, help="balanced: comm.balance_window")
    ap.add_argument(
        "--local-ranks",
        type=int,
        default=1,
        metavar="L",
        help="ranks per host (a multi-GPU host's local ranks): each lab host runs L processes in its namespace, "
        "numbered as torchrun numbers them, reaching each other over loopback and the other hosts over the shaped "
        "link; the tables' hosts are hosts, not ranks",
    )
    ap.add_argument("--no-lab", action="store_true", help="loopback only")
    ap.add_argument("--no-loopback", action="store_true", help="lab only")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps before each contender's timed steps")
    ap.add_argument("--rounds", type=int, default=1, help="rounds over all contenders, order rotated each round")
    ap.add_argument(
        "--fraction",
        type=float,
        default=1.0,
        help="each gradient at this fraction of its size, bucket sizes scaled alike (same bucket cuts)",
    )
    ap.add_argument("--json", default="", help="also write all measurements to this JSON file (scripts/predict.py)")
    ap.add_argument("--tune-over", action="append", default=[], help="extra config overrides for the tuned run")
    ap.add_argument("--steps", type=int, default=None, help="lab: timed steps per round (default 5; quick 3)")
    ap.add_argument("--loopback-steps", type=int, default=None, help="loopback: timed steps (default 15; quick 8)")
    ap.add_argument("--candidates", type=int, default=None, help="tuner candidates (default 8; quick 4)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds before a stuck run is killed")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hvd-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hvd-rendezvous", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--contenders",
        default=",".join(name for name, m in LAB.items() if m.default),
        help=f"comma-separated, some of {','.join(LAB)} (ddp: the speed column's reference)",
    )
    ap.add_argument("--methods", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    ap.add_argument("--hosts", default="", help=argparse.SUPPRESS)
    ap.add_argument("--np", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.steps = args.steps or (3 if args.quick else 5)
    args.loopback_steps = args.loopback_steps or (8 if args.quick else 15)
    args.candidates = args.candidates or (4 if args.quick else 8)
    args.contenders = args.contenders.split(",")
    args.flow_mbit = args.link_mbit / args.flow_ratio
    if args.profile and args.profile not in netlab.netlab_flows.PROFILES:
        ap.error(f"--profile: expected one of {', '.join(netlab.netlab_flows.PROFILES)}, got {args.profile!r}")
    unknown = set(args.contenders) - set(LAB)
    if unknown:
        ap.error(f"--contenders: unknown {', '.join(sorted(unknown))}; expected some of {', '.join(LAB)}")
    if args.local_ranks < 1:
        ap.error(f"--local-ranks: expected 1 or more, got {args.local_ranks}")
    if args.local_ranks > 1 and APART in args.contenders and not args.worker:
        ap.error(f"--local-ranks {args.local_ranks}: {APART} runs under its own launcher with one rank per host")
    hop = [m for m in args.contenders if "comm.balance_level=hop" in LAB[m].overrides]
    if hop and not args.no_lab and not args.profile:
        ap.error(
            f"--contenders {hop[0]} in the lab needs --profile (even for equal flows): the hop ring's groups share "
            "one listening port, and the lab's unpinned leaves hash the source port alone, so a host's connections "
            "accepted from one peer would all share one leaf"
        )
    try:  # the lab's own checks of its shaping (NetLab only validates here; nothing is created)
        netlab.NetLab(2, args.link_mbit, args.flow_mbit, burst_ms=args.burst_ms, packet_segs=args.packet_segs)
    except ValueError as e:
        ap.error(str(e))
    if args.worker:
        args.methods = [m for m in args.methods.split(",") if m]
        worker(args)
        return 0
    if args.hvd_worker:
        hvd_worker(args)
        return 0
    if args.hvd_rendezvous:
        hvd_rendezvous(args)
        return 0

    worlds = args.worlds or ([2] if args.quick else [2, 4])
    flow = args.flow_mbit
    lines = [
        "## Allreduce benchmark (lab/bench_allreduce.py)",
        "",
        f"command: `python -m lab.bench_allreduce {' '.join(argv if argv is not None else sys.argv[1:])}`; "
        f"gloo on CPU, {os.cpu_count()} cores, torch threads 1 per rank",
    ]
    record: list[dict] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if not args.no_loopback:
            lines.append(
                f"\nloopback TCP measured: 1 stream {_loopback_mbit(1):.0f} Mbit/s, "
                f"4 streams {_loopback_mbit(4):.0f} Mbit/s"
            )
            for n in worlds:
                res = _run_torch(n, None, args, tmp)
                hvd = _run_horovod(n, None, args, tmp) if APART in args.contenders else "not run"
                lines += _table("Loopback", n, res, hvd, None)
                print("\n".join(lines), file=sys.stderr, flush=True)
        reason = None if args.no_lab else netlab.available()
        if reason:
            lines.append(f"\nnetwork lab skipped: {reason}")
        elif not args.no_lab:
            for n in worlds:
                with netlab.NetLab(
                    n, args.link_mbit, flow, burst_ms=args.burst_ms, packet_segs=args.packet_segs
                ) as lab:
                    one, four = netlab.measure_mbit(lab, 1, 2.0), netlab.measure_mbit(lab, 4, 2.0)
                    lines.append(
                        f"\nnetwork lab, {n} hosts: link cap {args.link_mbit:g} Mbit/s per host and "
                        f"direction, per-flow cap {flow:.0f} Mbit/s"
                        + ("" if args.burst_ms is None else f", bursts of {args.burst_ms:g} ms")
                        + ("" if args.packet_segs is None else f", packets of at most {args.packet_segs} MSS")
                        + "; measured TCP host 1 -> 0: 1 flow "
                        f"{one:.0f} Mbit/s, 4 flows {four:.0f} Mbit/s"
                    )
                    checked = []
                    if args.profile:  # the profile's leaves for host 1's first peer, each connection measured
                        checked = netlab.print_flows(lab, args.profile, args.seed, flow, args.flows)
                        lines.append(
                            f"{args.profile} (seed {args.seed}), host 1 -> 0, per connection (leaf, ceiling, "
                            "measured Mbit/s): "
                            + ", ".join(f"{r.leaf} {r.ceil_mbit:.1f} {r.mbit:.1f}" for r in checked)
                        )
                    res = _run_torch(n, lab, args, tmp)
                    hvd = _run_horovod(n, lab, args, tmp) if APART in args.contenders else "not run"
                record.append(
                    {
                        "hosts": n,
                        "local_ranks": args.local_ranks,
                        "link_mbit": args.link_mbit,
                        "flow_mbit": flow,
                        "burst_ms": args.burst_ms,
                        "packet_segs": args.packet_segs,
                        "measured_1flow_mbit": one,
                        "measured_4flows_mbit": four,
                        "profile": args.profile or "even",
                        "seed": args.seed,
                        "measured_flows": [[r.leaf, r.ceil_mbit, r.mbit] for r in checked],
                        "cpus": os.cpu_count(),
                        "torch": res,
                        APART: hvd,
                    }
                )
                if args.json:
                    write_output(args.json, json.dumps(record, indent=1) + "\n", "--json")
                lines += _table(
                    f"Network lab ({args.link_mbit:g} Mbit/s link, {flow:.0f} Mbit/s per flow)",
                    n,
                    res,
                    hvd,
                    args.link_mbit,
                )
                print("\n".join(lines), file=sys.stderr, flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
