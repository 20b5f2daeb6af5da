"""One rank of a real multi-process allreduce check, launched by the comm tests under torchrun or horovodrun.

    python tests/comm_worker.py SCENARIO OUT_DIR [key=value ...]

Each rank writes OUT_DIR/rank<r>.json with what it saw; the tests compare those files.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as td  # noqa: E402
from support import HOST_DECIDES  # noqa: E402
from torch import nn  # noqa: E402

from base.errors import CommError, ConfigError, PlanMismatchError  # noqa: E402
from recipes.comm import create_allreduce, process_env  # noqa: E402
from recipes.config import load_config  # noqa: E402
from recipes.distributed import setup  # noqa: E402
from recipes.timemodel import calibrated_compute  # noqa: E402


class Net(nn.Module):
    """Odd-sized tensors (so slices come out unequal), a BN layer, optionally a layer that never gets a gradient."""

    def __init__(self, unused: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3, bias=False)
        self.bn = nn.BatchNorm2d(5)
        self.fc1 = nn.Linear(5 * 6 * 6, 37)
        self.fc2 = nn.Linear(37, 7)
        self.unused = nn.Linear(3, 3) if unused else None  # DDP (without find_unused_parameters) cannot have it

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def config(*overrides: str):
    return load_config(
        None, ["run.device=cpu", "dist.backend=gloo", "run.threads=1", "log.tensorboard=false", *overrides]
    )


def batch(rank: int, step: int = 0):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(6, 3, 8, 8, generator=g), torch.randint(0, 7, (6,), generator=g)


def local_grads(model: nn.Module, rank: int, step: int = 0) -> list[torch.Tensor]:
    ref = copy.deepcopy(model)
    x, y = batch(rank, step)
    nn.functional.cross_entropy(ref(x), y).backward()
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in ref.parameters()]


def exact_mean(model: nn.Module, rank: int, world: int, step: int = 0) -> list[torch.Tensor]:
    """The mean over ranks of each rank's local gradients, in float64 (gathered, then summed here)."""
    mine = torch.cat([g.reshape(-1) for g in local_grads(model, rank, step)]).double()
    everyone = [torch.empty_like(mine) for _ in range(world)]
    td.all_gather(everyone, mine)
    flat = (sum(everyone) / world).split([p.numel() for p in model.parameters()])
    return [t.view(p.shape) for t, p in zip(flat, model.parameters(), strict=True)]


def run_backend(cfg, dist, model: nn.Module, steps: int = 2, between=None) -> tuple[list[torch.Tensor], object]:
    """Train `steps` backward passes through the backend (no optimizer step); gradients after the last one.
    `between(backend)` runs after every step but the last (a forced re-plan)."""
    m = copy.deepcopy(model)
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    backend = create_allreduce(cfg.comm, dist, timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name)
    tm, opt = backend.prepare(m, opt)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        x, y = batch(dist.rank, step)
        nn.functional.cross_entropy(tm(x), y).backward()
        backend.on_step_end(step + 1)
        if between is not None and step < steps - 1:
            between(backend)
    return [p.grad.detach().clone() for p in m.parameters()], backend


def max_err(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b, strict=True))


def scenario_equal(out: dict, args: list[str]) -> None:
    """Every backend and setting: gradients after backward vs the exact mean, and multistream vs ddp."""
    tiny = "comm.bucket_mb=0.004"  # ~1000 floats: the test net (13 tensors) becomes several buckets
    cfg = config(*args)
    dist = setup(cfg, env=process_env(cfg.comm))
    torch.manual_seed(0)
    model = Net()
    mean = exact_mean(model, dist.rank, dist.world_size, step=1)
    ddp, _ = run_backend(config("comm.backend=ddp", "comm.bucket_cap_mb=0.002", *args), dist, model)
    out["ddp"] = max_err(ddp, mean)
    grid = [int(v) for v in os.environ.get("KS_GRID", "1,2,3,4").split(",")]
    out["multistream"] = {}
    for k in grid:
        for s in grid:
            g, backend = run_backend(
                config("comm.backend=multistream", tiny, f"comm.streams={k}", f"comm.slices={s}", *args), dist, model
            )
            plan = backend.engine.plan
            lengths = sorted({hi - lo for b in range(len(plan.buckets)) for lo, hi in plan.slice_bounds(b)})
            out["multistream"][f"K{k}S{s}"] = {
                "vs_mean": max_err(g, mean),
                "vs_ddp": max_err(g, ddp),
                "buckets": len(plan.buckets),
                "slice_lengths": lengths,
                "digest": plan.digest(),
            }
    for extra in (
        ["comm.concurrency=serialize", "comm.streams=3", "comm.slices=2"],
        ["comm.compression=fp16", "comm.streams=2", "comm.slices=3"],
        ["comm.compression=bf16", "comm.streams=4", "comm.slices=1"],
    ):
        g, backend = run_backend(config("comm.backend=multistream", tiny, *extra, *args), dist, model)
        out["/".join(extra)] = {
            "vs_mean": max_err(g, mean),
            "vs_ddp": max_err(g, ddp),
            "scale": max(float(t.abs().max()) for t in mean),
        }
    # comm.balance: a re-plan forced between the two steps (unequal shares); the second step must still be exact
    for extra, shares in (
        (["comm.streams=3", "comm.slices=2"], (600, 50, 350)),
        (["comm.compression=fp16", "comm.streams=2", "comm.slices=3"], (850, 150)),
    ):
        g, backend = run_backend(
            config("comm.backend=multistream", tiny, "comm.balance=true", *extra, *args),
            dist,
            model,
            between=lambda b, shares=shares: b.replan(shares),
        )
        plan = backend.engine.plan
        out["replan/" + "/".join(extra)] = {
            "vs_mean": max_err(g, mean),
            "vs_ddp": max_err(g, ddp),
            "scale": max(float(t.abs().max()) for t in mean),
            "shares": list(plan.shares),
            "slice_lengths": [[hi - lo for lo, hi in plan.slice_bounds(b)] for b in range(len(plan.buckets))],
            "replans": backend.stats().settings["balance_replans"],
        }
    torch.manual_seed(0)
    with_unused = Net(unused=True)
    mean = exact_mean(with_unused, dist.rank, dist.world_size, step=1)
    g, _ = run_backend(
        config("comm.backend=multistream", tiny, "comm.streams=2", "comm.slices=2", *args), dist, with_unused
    )
    out["unused"] = {"vs_mean": max_err(g, mean), "grad_is_zero": all(float(t.abs().max()) == 0 for t in g[-2:])}
    out["facts"] = _differing_facts(dist, model, tiny, args)


def _differing_facts(dist, model: nn.Module, tiny: str, args: list[str]) -> dict:
    """The ranks read different facts (rank 1: CUDA_DEVICE_MAX_CONNECTIONS=1, under which NCCL's overlap is not
    safe; rank 0: all good) on hosts of their own names: every rank must run the same mode, and the line names the
    host that differed. The facts stand in for two hosts' NCCL environments; the collectives run on gloo."""
    from recipes.comm import concurrency, multistream

    env = {concurrency.ORDER_ENV: "1", **({"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if dist.rank == 1 else {})}
    facts = concurrency.Facts("nccl", env, (2, 27, 3), 12090, 12090)
    real_probe, real_hostname = concurrency.probe, multistream.socket.gethostname
    concurrency.probe = lambda transport: facts
    multistream.socket.gethostname = lambda: f"host-{dist.rank}"
    try:
        mean = exact_mean(model, dist.rank, dist.world_size, step=1)
        g, backend = run_backend(config("comm.backend=multistream", tiny, *args), dist, model)
    finally:
        concurrency.probe, multistream.socket.gethostname = real_probe, real_hostname
    return {"mode": backend.concurrency.mode, "why": backend.concurrency.why, "vs_mean": max_err(g, mean)}


def scenario_records(out: dict, args: list[str]) -> None:
    """Every backend torchrun starts (base/registry.py), at its defaults with small buckets: gradients after backward
    vs the exact mean, with its record's wire format."""
    from base import registry

    cfg = config(*args)
    dist = setup(cfg, env=process_env(cfg.comm))
    torch.manual_seed(0)
    model = Net()
    mean = exact_mean(model, dist.rank, dist.world_size, step=1)
    out["scale"] = max(float(t.abs().max()) for t in mean)
    for name, rec in registry.ALLREDUCE_BACKENDS.items():
        if rec.launcher == "torchrun":
            g, _ = run_backend(config(f"comm.backend={name}", f"comm.{rec.bucket_key}=0.004", *args), dist, model)
            out[name] = {"vs_mean": max_err(g, mean), "wire": rec.wire(), "digest": float(sum(t.sum() for t in g))}


# comm.balance_level=hop: the rate (MB/s) of each rank's two connections to its left neighbour
PATH_MB_S = ((1.0, 3.0), (2.0, 2.0), (3.0, 1.0))


def _paced(counters, rate: float | None):
    """A connection's real counters, busy for as long as its bytes take at `rate` (None: unchanged)."""
    from recipes.comm.tcpinfo import Counters

    return counters if rate is None else Counters(counters.acked, counters.acked / rate)


def scenario_hop(out: dict, args: list[str]) -> None:
    """comm.balance_level=hop on real gloo ranks: the exact mean with equal shares and after a forced re-plan to a
    table whose every host cuts differently (fp32, fp16); the balancer on each rank's own loopback measurements, the
    same plan on every rank after every step; a resumed backend has the plan."""
    from recipes.comm import tcpinfo
    from recipes.comm.balance import listed

    cfg = config(*args)
    dist = setup(cfg, env=process_env(cfg.comm))
    torch.manual_seed(0)
    model = Net()
    mean = exact_mean(model, dist.rank, dist.world_size, step=1)
    scale = max(float(t.abs().max()) for t in mean)
    hop = ["comm.backend=multistream", "comm.bucket_mb=0.004", "comm.balance=true", "comm.balance_level=hop"]
    g, backend = run_backend(config(*hop, "comm.streams=3", *args), dist, model)
    out["even"] = {"vs_mean": max_err(g, mean), "table": listed(backend.engine.plan.hop_shares)}
    rows = ((600, 50, 350), (100, 300, 600), (334, 333, 333), (20, 20, 960))
    table = tuple(rows[h % len(rows)] for h in range(dist.world_size))
    for extra in (["comm.streams=3"], ["comm.compression=fp16", "comm.streams=3"]):
        g, backend = run_backend(config(*hop, *extra, *args), dist, model, between=lambda b: b.replan(table))
        out["replan/" + "/".join(extra)] = {
            "vs_mean": max_err(g, mean),
            "scale": scale,
            "table": listed(backend.engine.plan.hop_shares),
            "replans": backend.stats().settings["balance_replans"],
        }
    # The balancer on each rank's own counters. Loopback delivers at memory speed, so each connection's busy time is
    # the kernel's bytes at a fixed rate per (rank, connection): what a network of unequal paths reports
    cfg = config(*hop, "comm.streams=2", "comm.balance_window=1", "comm.balance_min_gain=0", *args)
    m = copy.deepcopy(model)
    backend = create_allreduce(cfg.comm, dist, timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name)
    tm, _ = backend.prepare(m, None)
    out["links"] = len(backend.links)
    rates = {link.fd: PATH_MB_S[dist.rank % 3][k] * 1e6 for k, link in enumerate(backend.links)}
    real = tcpinfo.Link.read
    tcpinfo.Link.read = lambda self: _paced(real(self), rates.get(self.fd))
    acked, quick = [], tcpinfo.Link.quickack

    def quickack(link):  # which connections the ring takes out of delayed-ACK mode, in which steps
        acked.append((step, link.fd))
        quick(link)

    tcpinfo.Link.quickack = quickack
    digests, errs = [], []
    for step in range(5):
        x, y = batch(dist.rank, step % 2)
        for p in m.parameters():
            p.grad = None
        nn.functional.cross_entropy(tm(x), y).backward()
        errs.append(max_err([p.grad for p in m.parameters()], exact_mean(model, dist.rank, dist.world_size, step % 2)))
        backend.on_step_end(step + 1)
        table = listed(backend.engine.plan.hop_shares)
        digests.append([backend.balance.version if backend.balance else 0, backend.engine.plan.digest(), table])
    out["digests"] = digests
    out["max_err"] = max(errs)
    out["quickacked"] = {
        "measured": sorted({fd for st, fd in acked if st == 2}),  # step 3 (index 2): the first measured one
        "unmeasured": sorted({fd for st, fd in acked if st == 0}),
        "recv": sorted(link.fd for link in backend.recv_links),
        "send": sorted(link.fd for link in backend.links),
    }
    # a re-plan the step confirmed (its window "before" infinitely long) stays; the paced rates are exact, so the
    # next proportional re-plan predicts nothing and the window after tries a stretched table instead
    b = backend.balance
    b.settled, b.quiet, b.stretches, backend.engine.measure = False, 0, 0, True
    backend.replan(((260, 740), (500, 500), (740, 260)))
    backend._hop_trial = (tuple(tuple(r) for r in listed(b.current)), float("inf"))
    for step in range(5, 7):  # one step left out after the re-plan, one measured: the window
        x, y = batch(dist.rank, 0)
        for p in m.parameters():
            p.grad = None
        nn.functional.cross_entropy(tm(x), y).backward()
        backend.on_step_end(step + 1)
    out["stretched"] = [listed(backend.engine.plan.hop_shares), b.stretches, backend._hop_trial is not None]
    # a re-plan that did not shorten the step goes back: force a trial whose "before" was 0 s, unbeatable
    if backend.balance.settled:
        backend.balance.settled, backend.engine.measure = False, True
    even = tuple(tuple(r) for r in listed(backend.balance.current))
    backend.replan(tuple(tuple(reversed(r)) for r in even))
    backend._hop_trial = (even, 0.0)
    for step in range(7, 10):
        x, y = batch(dist.rank, 0)
        for p in m.parameters():
            p.grad = None
        nn.functional.cross_entropy(tm(x), y).backward()
        backend.on_step_end(step + 1)
    out["reverted"] = [listed(backend.engine.plan.hop_shares) == listed(even), backend.balance.settled]
    # clocks that differ: each rank reads its own step time, (rank + 1) s a step; a trial whose "before" (1.5 s)
    # lies between them is judged on the slowest rank's time (the window's MAX), so every rank takes the same table
    from recipes.comm import balance_steps  # the balancer's clock

    backend.balance.settled, backend.engine.measure = False, True
    backend.replan(tuple(tuple(reversed(r)) for r in even))
    backend._hop_trial = (even, 1.5)
    calls, real_clock = [0], time.perf_counter

    def clock():
        calls[0] += 1
        return real_clock() + calls[0] * (dist.rank + 1)

    balance_steps.time = type("Clock", (), {"perf_counter": staticmethod(clock)})
    try:
        for step in range(10, 13):
            x, y = batch(dist.rank, 0)
            for p in m.parameters():
                p.grad = None
            nn.functional.cross_entropy(tm(x), y).backward()
            backend.on_step_end(step + 1)
    finally:
        balance_steps.time = time
    out["clocks_differ"] = [listed(backend.engine.plan.hop_shares), backend.balance.settled]
    out["stats"] = backend.stats().settings
    state = backend.state_dict()
    resumed = create_allreduce(cfg.comm, dist, timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # as a checkpoint carries it
    resumed.prepare(copy.deepcopy(model), None)
    out["resumed_same"] = resumed.engine.plan.digest() == backend.engine.plan.digest()


def scenario_hop_two(out: dict, args: list[str]) -> None:
    """comm.balance_level=hop at 2 ranks: the exact mean after a re-plan whose two hosts cut differently, and where
    each rank's pieces travel: the ends of the connections it sends and receives on, and the bytes it sent on each
    over two steps (the kernel's counters)."""
    from recipes.comm import tcpinfo
    from recipes.comm.balance import listed

    cfg = config(*args)
    dist = setup(cfg, env=process_env(cfg.comm))
    torch.manual_seed(0)
    model = Net()
    mean = exact_mean(model, dist.rank, dist.world_size, step=1)
    hop = ["comm.backend=multistream", "comm.bucket_mb=0.004", "comm.balance=true", "comm.balance_level=hop"]
    cfg = config(*hop, "comm.streams=2", *args)
    m = copy.deepcopy(model)
    backend = create_allreduce(cfg.comm, dist, timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name)
    tm, _ = backend.prepare(m, None)
    links = backend.links + backend.recv_links
    before = [x.read().acked for x in links]
    for step in range(2):
        for p in m.parameters():
            p.grad = None
        x, y = batch(dist.rank, step)
        nn.functional.cross_entropy(tm(x), y).backward()
        backend.on_step_end(step + 1)
        if step == 0:
            backend.replan(((700, 300), (150, 850)))
    out["sent"] = [b - a for a, b in zip(before, (x.read().acked for x in links), strict=True)]
    out["vs_mean"] = max_err([p.grad for p in m.parameters()], mean)
    out["table"] = listed(backend.engine.plan.hop_shares)
    out["one_way"] = backend.one_way
    out["groups"] = [
        len(backend.groups),
        len(backend.recv_groups),
        len({*map(id, backend.groups + backend.recv_groups)}),
    ]
    ends = [tcpinfo.endpoints(x.fd) for x in links]
    out["ends"] = [[local[1], remote[1]] for local, remote in ends]  # (local port, remote port): sends, then receives


def _as_hosts() -> None:
    """Simulated hosts on one machine: HOST_RANKS=L makes every L consecutive torchrun ranks one host (what
    torchrun sets on a real cluster with --nproc-per-node L)."""
    local = int(os.environ["HOST_RANKS"])
    rank = int(os.environ["RANK"])
    os.environ.update(LOCAL_WORLD_SIZE=str(local), LOCAL_RANK=str(rank % local))


HIER = ("comm.backend=multistream", "comm.bucket_mb=0.004", "comm.balance=true", "comm.balance_level=hop")


def scenario_hier(out: dict, args: list[str]) -> None:
    """comm.hierarchy=host on simulated hosts: the exact mean and DDP's mean with equal shares and after a forced
    re-plan whose every rank's row differs (fp32, fp16 wire); each ring's length; with HIER_BALANCE=1 the balancer on
    paced loopback counters agreeing on every rank, and a resumed backend's table; then DEAD_RANKS leave mid-bucket
    (dist.timeout_s=4)."""
    from recipes.comm import tcpinfo
    from recipes.comm.balance import listed

    _as_hosts()
    cfg = config(*args)
    dist = setup(cfg, env=process_env(cfg.comm))
    torch.manual_seed(0)
    model = Net()
    mean = exact_mean(model, dist.rank, dist.world_size, step=1)
    out["scale"] = max(float(t.abs().max()) for t in mean)
    ddp, _ = run_backend(config("comm.backend=ddp", "comm.bucket_cap_mb=0.002", *args), dist, model)
    hier = [*HIER, "comm.hierarchy=host", "comm.streams=2"]
    g, backend = run_backend(config(*hier, *args), dist, model)
    ring = backend.engine.ring.inner
    out["even"] = {"vs_mean": max_err(g, mean), "vs_ddp": max_err(g, ddp)}
    out["ring"] = [ring.rank, ring.world, ring.left, ring.right, len(backend.groups), len(backend.engine.plan.buckets)]
    rows = ((600, 400), (100, 900), (334, 666), (20, 980), (850, 150), (480, 520))
    table = tuple(rows[r % len(rows)] for r in range(dist.world_size))
    for extra in ([], ["comm.compression=fp16"]):
        g, backend = run_backend(config(*hier, *extra, *args), dist, model, between=lambda b: b.replan(table))
        out["replan/" + "/".join(extra)] = {
            "vs_mean": max_err(g, mean),
            "vs_ddp": max_err(g, ddp),
            "table": listed(backend.engine.plan.hop_shares),
            "ring_rows": listed(backend.engine.ring.inner.table),
        }
    if os.environ.get("HIER_BALANCE") != "1":
        _leave_mid_bucket(out, config(*hier, "dist.timeout_s=4", *args), dist, model)
        return
    # the balancer on each rank's own connections, paced as in scenario_hop: row g delivers PATH_MB_S[g % 3]
    cfg = config(*hier, "comm.balance_window=1", "comm.balance_min_gain=0", *args)
    m = copy.deepcopy(model)
    backend = create_allreduce(cfg.comm, dist, timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name)
    tm, _ = backend.prepare(m, None)
    rates = {link.fd: PATH_MB_S[dist.rank % 3][k] * 1e6 for k, link in enumerate(backend.links)}
    real = tcpinfo.Link.read
    tcpinfo.Link.read = lambda self: _paced(real(self), rates.get(self.fd))
    digests, errs = [], []
    for step in range(4):
        x, y = batch(dist.rank, step % 2)
        for p in m.parameters():
            p.grad = None
        nn.functional.cross_entropy(tm(x), y).backward()
        errs.append(max_err([p.grad for p in m.parameters()], exact_mean(model, dist.rank, dist.world_size, step % 2)))
        backend.on_step_end(step + 1)
        digests.append([backend.balance.version if backend.balance else 0, backend.engine.plan.digest()])
    out["digests"] = digests
    out["max_err"] = max(errs)
    out["table"] = listed(backend.engine.plan.hop_shares)
    state = backend.state_dict()
    resumed = create_allreduce(cfg.comm, dist, timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # as a checkpoint carries it
    resumed.prepare(copy.deepcopy(model), None)
    out["resumed_table"] = listed(resumed.engine.plan.hop_shares)
    out["resumed_rows"] = listed(resumed.engine.ring.inner.table)
    _leave_mid_bucket(out, config(*hier, "dist.timeout_s=4", *args), dist, model)


def _leave_mid_bucket(out: dict, cfg, dist, model: nn.Module) -> None:
    """DEAD_RANKS (a local rank, or a whole host) leave inside their ring's second bucket, after the host's
    reduce-scatter; every other rank records how it stopped."""
    backend = create_allreduce(cfg.comm, dist, timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name)
    tm, _ = backend.prepare(copy.deepcopy(model), None)
    x, y = batch(dist.rank)
    nn.functional.cross_entropy(tm(x), y).backward()  # one good step
    td.barrier()
    if dist.rank in {int(r) for r in os.environ["DEAD_RANKS"].split(",")}:
        ring, path = backend.engine.ring.inner, out.pop("_path")
        whole = ring.allreduce

        def leave(b, flat):
            if b == 0:
                return whole(b, flat)
            Path(path).write_text(json.dumps({**out, "left": True}))
            os._exit(0)

        ring.allreduce = leave
    t0 = time.monotonic()
    try:
        nn.functional.cross_entropy(tm(x), y).backward()
        out["error"] = None
    except Exception as e:  # noqa: BLE001 - the test checks the type and the text
        out["error"] = f"{type(e).__name__}: {e}"
    out["seconds"] = time.monotonic() - t0


def scenario_horovod(out: dict, args: list[str]) -> None:
    cfg = config("comm.backend=horovod", *args)
    # under horovodrun: torch.distributed is bootstrapped from Horovod's environment (the backend's process env)
    dist = setup(cfg, env=process_env(cfg.comm))
    torch.manual_seed(0)
    model = Net()
    mean = exact_mean(model, dist.rank, dist.world_size, step=1)
    g, backend = run_backend(cfg, dist, model)
    out["world"] = dist.world_size
    out["horovod"] = max_err(g, mean)
    g16, _ = run_backend(config("comm.backend=horovod", "comm.compression=fp16", *args), dist, model)
    out["horovod_fp16"] = max_err(g16, mean)
    out["scale"] = max(float(t.abs().max()) for t in mean)


def scenario_accumulate(out: dict, args: list[str]) -> None:
    """`run.accumulate` A through a backend vs one plain step on the global batch, for a few optimizer steps.

    BN is in eval mode (running statistics), so A micro-batches of n images are the same computation as one batch
    of A x n: the weights must agree to float32 rounding on every rank.
    """
    from recipes.rundir.payload import State
    from recipes.steps import StepRunner

    backend_name, accumulate = args[0], int(args[1])
    cfg = config(f"comm.backend={backend_name}", "comm.bucket_mb=0.004", "comm.bucket_cap_mb=0.002", *args[2:])
    dist = setup(cfg, env=process_env(cfg.comm))
    world, per_rank, steps = dist.world_size, 4 * accumulate, 3
    torch.manual_seed(0)
    model = Net().eval()

    def data(rank: int, step: int):
        g = torch.Generator().manual_seed(1000 * rank + step)
        return torch.randn(per_rank, 3, 8, 8, generator=g), torch.randint(0, 7, (per_rank,), generator=g)

    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    ref_norms = []  # the global batch's gradient norm per step: what every rank's step must report
    for step in range(steps):
        xs, ys = zip(*(data(r, step) for r in range(world)), strict=True)
        opt.zero_grad()
        nn.functional.cross_entropy(ref(torch.cat(xs)), torch.cat(ys)).backward()
        ref_norms.append(float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in ref.parameters()))))
        opt.step()

    m = copy.deepcopy(model)
    backend = create_allreduce(
        cfg.comm,
        dist,
        timeout_s=cfg.dist.timeout_s,
        model_name=cfg.model.name,
        compute_start=functools.partial(calibrated_compute, cfg),
    )
    tm, sgd = backend.prepare(m, torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9))
    runner = StepRunner(
        model=m,
        train_model=tm,
        optimizer=sgd,
        optim=HOST_DECIDES,
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        comm=backend,
        criterion=nn.CrossEntropyLoss(),
        device=torch.device("cpu"),
        backend=backend_name,
    )
    st = State()
    norms = [float(runner(*data(dist.rank, step), st, None, accumulate)["grad_norm"]) for step in range(steps)]
    out["grad_norm_err"] = max(abs(a / b - 1) for a, b in zip(norms, ref_norms, strict=True))
    out["vs_one_batch"] = max_err(list(m.parameters()), list(ref.parameters()))
    out["moved"] = max_err(list(m.parameters()), list(model.parameters()))
    stats = backend.stats()
    out["comm_steps"], out["comm_bytes"], out["steps"] = stats.steps, stats.bytes, st.step
    out["param_bytes"] = sum(p.numel() * p.element_size() for p in m.parameters())


def scenario_tune(out: dict, args: list[str]) -> None:
    """Auto-tune, record the settings in force after every step; then a second backend must start from the cache."""
    cfg = config(
        "comm.backend=multistream",
        "comm.autotune=true",
        "comm.bucket_mb=0.004",
        "comm.streams=1",
        "comm.slices=1",
        "comm.tune_bucket_mb=[0.001,0.004]",
        "comm.tune_streams=[1,2]",
        "comm.tune_slices=[1,3]",
        "comm.tune_max_candidates=4",
        "comm.tune_warmup_steps=1",
        "comm.tune_steps_per_window=1",
        "comm.tune_windows=2",
        *args,
    )
    dist = setup(cfg, env=process_env(cfg.comm))
    torch.manual_seed(0)
    model = Net()
    m = copy.deepcopy(model)
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    backend = create_allreduce(cfg.comm, dist, timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name)
    tm, opt = backend.prepare(m, opt)
    seq, balancing = [], []
    mean = exact_mean(model, dist.rank, dist.world_size, step=0)
    errs = []
    for step in range(16):
        opt.zero_grad(set_to_none=True)
        x, y = batch(dist.rank, 0)
        nn.functional.cross_entropy(tm(x), y).backward()
        errs.append(max_err([p.grad for p in m.parameters()], mean))
        backend.on_step_end(step + 1)
        seq.append([backend.settings.bucket_mb, backend.settings.streams, backend.settings.slices])
        # comm.balance (when the test turns it on): no balancer while the tuner measures; its K afterwards
        balancing.append([backend.tuner.done, backend.balance.streams if backend.balance else None])
    out["sequence"] = seq
    out["balancing"] = balancing
    out["max_err"] = max(errs)
    out["trials"] = len(backend.tuner.trials)
    out["done"] = backend.tuner.done
    out["state"] = backend.state_dict()
    second = create_allreduce(cfg.comm, dist, timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name)
    second.prepare(copy.deepcopy(model), torch.optim.SGD(model.parameters(), lr=0.0))
    out["second_tuner"] = second.tuner is not None
    out["second_settings"] = [second.settings.bucket_mb, second.settings.streams, second.settings.slices]


def scenario_model_start(out: dict, args: list[str]) -> None:
    """tune_start=model: where every rank starts (rank 0 ranks and tells the others), or the error each rank raised."""
    cfg = config(
        "comm.backend=multistream",
        "comm.autotune=true",
        "comm.tune_start=model",
        "comm.tune_cache=null",
        "comm.tune_bucket_mb=[0.001,0.004]",
        "comm.tune_streams=[1,2]",
        "comm.tune_slices=[1,3]",
        *args,
    )
    dist = setup(cfg, env=process_env(cfg.comm))
    backend = create_allreduce(
        cfg.comm,
        dist,
        timeout_s=cfg.dist.timeout_s,
        model_name=cfg.model.name,
        compute_start=functools.partial(calibrated_compute, cfg),
    )
    t0 = time.monotonic()
    try:
        backend.prepare(Net(), torch.optim.SGD(Net().parameters(), lr=0.0))
        out["error"] = None
        out["note"] = backend.tuner.start_note
        out["start"] = [backend.settings.bucket_mb, backend.settings.streams, backend.settings.slices]
    except ConfigError as e:
        out["error"] = str(e)
    out["seconds"] = time.monotonic() - t0


# comm.balance's figures as each rank would measure them on a network whose communicators run at these rates
# (elements per second), with noise of its own on every rank: the ranks see different numbers, the plan must agree.
BALANCE_RATES = (1.0, 0.3, 0.8)


def _fake_read_communicators(engine, wait: bool, rank: int, calls: list) -> list[list[float]]:
    import random

    steps, engine.comm_marks[:] = len(engine.comm_marks), []
    plan = engine.plan
    per = [0] * plan.streams
    for b in range(len(plan.buckets)):
        for j, (lo, hi) in enumerate(plan.slice_bounds(b)):
            per[plan.communicator(b, j)] += hi - lo
    out = []
    for _ in range(steps):
        calls.append(1)
        rng = random.Random(f"{rank}/{len(calls)}")
        out.append([per[k] / BALANCE_RATES[k] * 1e-6 * rng.uniform(0.97, 1.03) for k in range(plan.streams)])
    return out


def scenario_balance(out: dict, args: list[str]) -> None:
    """comm.balance with every rank measuring different figures (BALANCE_RATES with noise of its own): the plan after
    every step, which must agree; a call from inside backward must not re-plan; a resumed backend has the plan."""
    from recipes.comm.engine import _Engine

    cfg = config(
        "comm.backend=multistream",
        "comm.bucket_mb=0.004",
        "comm.streams=3",
        "comm.slices=2",
        "comm.balance=true",
        "comm.balance_window=1",
        "comm.balance_min_gain=0.02",
        *args,
    )
    dist = setup(cfg, env=process_env(cfg.comm))
    calls: list = []
    _Engine.read_communicators = lambda self, wait: _fake_read_communicators(self, wait, dist.rank, calls)
    torch.manual_seed(0)
    model = Net()
    m = copy.deepcopy(model)
    backend = create_allreduce(cfg.comm, dist, timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name)
    tm, _ = backend.prepare(m, None)
    inside = []

    def mid_backward(g):  # on_step_end called from inside backward, at every step: the plan must not change there
        before = backend.capture_key()
        backend.on_step_end(0)
        inside.append(before != backend.capture_key())
        return g

    m.fc1.weight.register_hook(mid_backward)
    seq, errs, blockers, keys = [], [], [], []
    for step in range(12):
        mean = exact_mean(model, dist.rank, dist.world_size, step=step % 2)
        x, y = batch(dist.rank, step % 2)
        for p in m.parameters():
            p.grad = None
        nn.functional.cross_entropy(tm(x), y).backward()
        errs.append(max_err([p.grad for p in m.parameters()], mean))
        backend.on_step_end(step + 1)
        seq.append([backend.balance.version if backend.balance else 0, list(backend.engine.plan.shares or [])])
        blockers.append(backend.capture_blocker())
        keys.append(repr(backend.capture_key()))
    out["sequence"] = seq
    out["max_err"] = max(errs)
    out["inside_changed"] = sum(inside)
    out["inside_calls"] = len(inside)
    out["blockers"] = blockers
    out["keys"] = keys
    out["stats"] = backend.stats().settings
    state = backend.state_dict()
    out["state"] = state
    resumed = create_allreduce(cfg.comm, dist, timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # as a checkpoint carries it
    resumed.prepare(copy.deepcopy(model), None)
    out["digest"] = backend.engine.plan.digest()
    out["resumed_digest"] = resumed.engine.plan.digest()
    out["resumed_measuring"] = resumed.capture_blocker()


def scenario_mismatch(out: dict, args: list[str]) -> None:
    cfg = config(*args)
    dist = setup(cfg, env=process_env(cfg.comm))
    slices = 2 if dist.rank == 0 else 3  # rank 1 runs a different config
    model = Net()
    cfg = config("comm.backend=multistream", f"comm.slices={slices}", *args)
    backend = create_allreduce(cfg.comm, dist, timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name)
    t0 = time.monotonic()
    try:
        backend.prepare(model, None)
        out["error"] = None
    except PlanMismatchError as e:
        out["error"] = str(e)
    out["seconds"] = time.monotonic() - t0


def scenario_hop_no_link(out: dict, args: list[str]) -> None:
    """comm.balance_level=hop where rank 1 alone cannot tell which socket leads to its neighbour: every rank stops at
    start-up with rank 1's reason, none waits for a timeout."""
    from recipes.comm import tcpinfo

    cfg = config(*args)
    dist = setup(cfg, env=process_env(cfg.comm))
    if dist.rank == 1:
        tcpinfo.match = lambda mine, peer_locals: None
    cfg = config("comm.backend=multistream", "comm.balance=true", "comm.balance_level=hop", *args)
    backend = create_allreduce(cfg.comm, dist, timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name)
    t0 = time.monotonic()
    try:
        backend.prepare(Net(), None)
        out["error"] = None
    except ConfigError as e:
        out["error"] = str(e)
    out["seconds"] = time.monotonic() - t0


def scenario_dead_peer(out: dict, args: list[str]) -> None:
    """Rank 1 disappears (or stalls, with STALL=1) after the first step; the others must fail fast and clearly."""
    cfg = config("comm.backend=multistream", "comm.bucket_mb=0.004", "comm.streams=2", "comm.slices=2", *args)
    dist = setup(cfg, env=process_env(cfg.comm))
    model = Net()
    backend = create_allreduce(cfg.comm, dist, timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name)
    tm, _ = backend.prepare(copy.deepcopy(model), None)
    x, y = batch(dist.rank)
    nn.functional.cross_entropy(tm(x), y).backward()  # one good step
    td.barrier()
    if dist.rank == 1:
        Path(out["_path"]).write_text(json.dumps({"rank": 1, "left": True}))
        if os.environ.get("STALL") == "1":
            time.sleep(float(os.environ.get("STALL_S", "30")))
        os._exit(0)
    t0 = time.monotonic()
    try:
        nn.functional.cross_entropy(tm(x), y).backward()
        out["error"] = None
    except Exception as e:  # noqa: BLE001 - the test checks the type and the text
        out["error"] = f"{type(e).__name__}: {e}"
        out["is_comm_error"] = isinstance(e, CommError) or "CommError" in str(e)
    out["seconds"] = time.monotonic() - t0


def main() -> None:
    scenario, out_dir, *args = sys.argv[1:]
    rank = int(os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0")))
    path = Path(out_dir) / f"rank{rank}.json"
    out: dict = {"rank": rank, "_path": str(path)}
    code = 0
    try:
        globals()[f"scenario_{scenario}"](out, args)
    except BaseException:
        out["exception"] = traceback.format_exc()
        code = 1
    finally:
        out.pop("_path", None)
        path.write_text(json.dumps(out, indent=1))
        sys.stdout.flush()
        os._exit(code)  # no process-group teardown: after a dead peer it would wait for it


if __name__ == "__main__":
    main()
