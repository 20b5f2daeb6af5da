"""A step-time model of data-parallel training: backward compute, the fusion plan, and a shaped network.

One step is forward, then backward, during which gradients become ready in gradient-ready order; each backend
turns them into messages (allreduces) with a ready time and a communicator:
    ddp          DDP's buckets (first bucket 1 MB, then `bucket_cap_mb`), one communicator
    multistream  the repository's own fusion plan (recipes/comm/plan.py: balanced buckets, S slices each, slice j
                 of bucket b on communicator (b*S+j) mod K), K communicators at once
    horovod      a negotiation cycle: tensors ready within a cycle are fused up to the fusion threshold, after a
                 coordination round through rank 0 that grows with the number of ranks; one communicator
    per-tensor   one blocking allreduce per gradient after backward
A communicator opens `flows` TCP flows to its ring neighbour (Network.flows_per_comm, or predict_step's `flows` per
backend): NCCL's socket transport splits every message over NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD sockets
per channel (NCCL_DEFAULT_FLOWS: NCCL's own choice per NIC), gloo over its devices; so a communicator's data part
is held to `flows` x the per-flow cap. A communicator runs its messages one at a time, in order, each starting when
it is ready and the previous one is done. A message of m bytes costs a latency part, 2(H-1) ring steps of
`latency_s` plus the intra-host stage (reduce-scatter and all-gather over G GPUs at `intra_gbyte` GB/s, 2(G-1)/G
m), and a data part, 2(H-1)/H m bytes over the host's link. Data parts in flight at the same time share the link
fairly, each communicator's flows held to the per-flow cap: a fluid simulation, so K streams on a capped link, a
per-flow cap that does not bind and the overlap with backward all come out of the same arithmetic. The step ends
when backward and every message are done, plus the optimizer step; communication after backward's end is exposed,
the rest hidden.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from base import registry
from recipes.comm.plan import Settings, TensorSpec, build_plan

WIRE_BYTES = {"none": None, "fp16": 2, "bf16": 2}
DDP_FIRST_BUCKET_MB = 1.0  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES
# What predict_step models: every registered allreduce backend (base/registry.py; its record's `step_model` points
# at its StepPattern below) and the baselines no backend runs (BASELINES: per-tensor, one allreduce per gradient,
# which the network lab measures, lab/lab_methods.py).
BASELINE_NAMES = ("per-tensor",)
BACKENDS = (*registry.ALLREDUCE_BACKENDS, *BASELINE_NAMES)
# TCP flows per peer that one NCCL communicator opens by default (NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD,
# per channel), by NIC: NCCL's src/transport/net_socket.cc picks 2 x 8 on AWS ENA and 4 x 1 on GCP gVNIC, 1 x 1
# elsewhere. Pass one of these (or a preset's product, base/registry.py NCCL_PRESETS) as `flows`.
NCCL_DEFAULT_FLOWS = {"generic": 1, "aws-ena": 16, "gcp-gvnic": 4}


@dataclass(frozen=True)
class Network:
    """The cluster: hosts x GPUs per host, each host's link, the per-flow cap and the per-message latency."""

    hosts: int
    gpus_per_host: int = 1
    link_gbit: float = 32.0  # per host and direction
    flow_gbit: float | None = 10.0  # one TCP flow's ceiling; None: no per-flow cap
    latency_s: float = 50e-6  # per ring step of one message
    intra_gbyte: float = 150.0  # intra-host stage (NVLink on a V100 DGX-1 class machine; PCIe 3 x16: ~12)
    efficiency: float = 1.0  # goodput / cap (TCP and framing overhead), fitted on the lab
    flows_per_comm: int = 1  # TCP flows one communicator opens to its ring neighbour


@dataclass(frozen=True)
class Compute:
    """Per-GPU compute of one step: forward, backward (gradient i ready at ready[i] x backward), optimizer."""

    forward_s: float
    backward_s: float
    ready: tuple[float, ...]  # fraction of backward elapsed when each gradient (gradient-ready order) is ready
    optimizer_s: float = 0.0


@dataclass(frozen=True)
class Horovod:
    fusion_mb: float = 128.0  # HOROVOD_FUSION_THRESHOLD default (MB)
    cycle_s: float = 1e-3  # HOROVOD_CYCLE_TIME default
    negotiation_s_per_rank: float = 20e-6  # coordination through rank 0, per rank per fused response (fitted)


@dataclass(frozen=True)
class Message:
    ready_s: float  # since the start of backward
    nbytes: int  # on the wire, per rank
    comm: int


@dataclass
class StepPrediction:
    backend: str
    settings: str
    forward_s: float
    backward_s: float
    comm_busy_s: float  # time during which at least one message was in flight
    hidden_s: float  # the part of comm_busy_s before backward ended
    exposed_s: float  # from backward's end to the last message's end
    optimizer_s: float
    messages: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def step_s(self) -> float:
        return self.forward_s + self.backward_s + self.exposed_s + self.optimizer_s


# ---------------------------------------------------------------------------------------------------------
# Messages per backend.


def _ready_times(compute: Compute, n: int) -> list[float]:
    if len(compute.ready) != n:
        raise ValueError(f"compute.ready has {len(compute.ready)} entries for {n} gradients")
    return [f * compute.backward_s for f in compute.ready]


def _wire(spec: TensorSpec, compression: str) -> int:
    size = WIRE_BYTES.get(compression)
    return spec.nbytes if size is None else spec.numel * size


def ddp_buckets(specs: list[TensorSpec], bucket_cap_mb: float) -> list[list[int]]:
    """DDP's bucket assignment (reducer.cpp): tensors in ready order, a bucket closed once it reaches its limit,
    the first limit 1 MB and `bucket_cap_mb` after it; a dtype change starts a new bucket."""
    buckets, cur, size, limit, dtype = [], [], 0, DDP_FIRST_BUCKET_MB * 2**20, None
    for i, s in enumerate(specs):
        if cur and s.dtype != dtype:
            buckets.append(cur)
            cur, size = [], 0
        cur.append(i)
        dtype = s.dtype
        size += s.nbytes
        if size >= limit:
            buckets.append(cur)
            cur, size, limit = [], 0, bucket_cap_mb * 2**20
    if cur:
        buckets.append(cur)
    return buckets


def _per_tensor(specs, compute, ready, compression, **_) -> list[Message]:
    """One blocking allreduce per gradient after backward (the lab's naive baseline)."""
    return [Message(compute.backward_s, _wire(s, compression), 0) for s in specs]


def _ddp(specs, compute, ready, compression, *, bucket_cap_mb, **_) -> list[Message]:
    """DDP's buckets, each reduced once its last gradient is ready, on one communicator."""
    return [
        Message(max(ready[i] for i in b), sum(_wire(specs[i], compression) for i in b), 0)
        for b in ddp_buckets(specs, bucket_cap_mb)
    ]


def _multistream(specs, compute, ready, compression, *, settings, serial=False, **_) -> list[Message]:
    """The fusion plan's buckets, launched in order, each cut in S slices over K communicators; `serial`
    (comm.concurrency=serialize, asked for or where auto falls back to it, e.g. a driver older than R545): one
    collective in flight over all communicators, so the slices go one after another, as on one communicator."""
    plan = build_plan(specs, settings or Settings(8.0, 4, 2), compression)
    out, launched = [], 0.0
    size = WIRE_BYTES.get(compression)
    for b, idx in enumerate(plan.buckets):
        launched = max(launched, max(ready[i] for i in idx))  # buckets launch in order
        for j, (lo, hi) in enumerate(plan.slice_bounds(b)):
            elem = plan.bucket_bytes(b) // max(plan.bucket_numel(b), 1) if size is None else size
            out.append(Message(launched, (hi - lo) * elem, 0 if serial else plan.communicator(b, j)))
    return out


def _horovod(specs, compute, ready, compression, *, horovod, ranks, **_) -> list[Message]:
    """Horovod's negotiation cycles: tensors ready within a cycle fused up to the threshold, after a coordination
    round through rank 0, on one communicator."""
    out, cur, cur_bytes, cur_cycle = [], 0.0, 0, None
    limit = horovod.fusion_mb * 2**20
    negotiation = horovod.negotiation_s_per_rank * max(ranks - 1, 0)
    for i, s in enumerate(specs):
        cycle = math.floor(ready[i] / horovod.cycle_s) + 1  # picked up at the end of its cycle
        w = _wire(s, compression)
        if cur_cycle is not None and (cycle != cur_cycle or cur_bytes + w > limit):
            out.append(Message(cur, cur_bytes, 0))
            cur_bytes = 0
        if cur_bytes == 0:
            cur_cycle, cur = cycle, cycle * horovod.cycle_s + negotiation
        cur_bytes += w
    if cur_bytes:
        out.append(Message(cur, cur_bytes, 0))
    return out


def _number(label: str, pattern: str) -> float | None:
    m = re.search(pattern, label)
    return float(m.group(1)) if m else None


@dataclass(frozen=True)
class StepPattern:
    """How a family of backends turns a step's gradients into messages: what a registry record's `step_model`
    points at (registry.Allreduce; BASELINES for the lab's per-tensor). Its functions take the settings by the comm.*
    keys a config or a backend's CommStats.settings names them with, so no caller asks which backend it has."""

    issue: Callable[..., list[Message]]  # (specs, compute, ready, compression, **predict_step's settings)
    # predict_step's settings from a mapping of comm.* keys (a config's comm section as a dict, a backend's
    # CommStats.settings, or what `parse` read); a key it lacks takes the config's default
    settings: Callable[[Mapping], dict]
    label: Callable[[int, dict], str]  # (gradients, predict_step's settings) -> "bucket_cap_mb 25"
    parse: Callable[[str], dict] = lambda label: {}  # the comm.* keys of a label (the lab's JSON) it wrote
    # Its messages wait for a coordination round through rank 0 whose cost grows with the ranks (Horovod): the lab's
    # fit finds that cost apart, from these backends only (lab/predict_lab.py).
    negotiates: bool = False


def _keys(**found) -> dict:
    """The comm.* keys a label gave (those it did not are left to the defaults)."""
    return {k: v for k, v in found.items() if v is not None}


def _per_tensor_label(n: int, kw: dict) -> str:
    return f"{n} allreduces"


def _ddp_settings(c: Mapping) -> dict:
    return {"bucket_cap_mb": float(c.get("bucket_cap_mb", 25.0))}


def _ddp_label(n: int, kw: dict) -> str:
    return f"bucket_cap_mb {kw.get('bucket_cap_mb', 25.0):g}"


def _ddp_parse(label: str) -> dict:
    """'bucket_cap_mb 1.25' (the lab's DDP, with ', 4 flows' on a gloo group of 4 devices) -> its comm.* keys."""
    return _keys(bucket_cap_mb=_number(label, r"bucket_cap_mb ([\d.e+-]+)"))


def _ms_settings(c: Mapping) -> dict:
    settings = Settings(float(c.get("bucket_mb", 8.0)), int(c.get("streams", 4)), int(c.get("slices", 2)))
    return {"settings": settings, **({"serial": True} if c.get("concurrency") == "serialize" else {})}


def _ms_label(n: int, kw: dict) -> str:
    label = (kw.get("settings") or Settings(8.0, 4, 2)).label().replace("bucket ", "")
    return label + (", serialized" if kw.get("serial") else "")


def _ms_parse(label: str) -> dict:
    """'1 MB, K=4, S=2' (Settings.label without 'bucket') -> its comm.* keys."""
    mb, k, s = _number(label, r"([\d.e+-]+) MB"), _number(label, r"K=(\d+)"), _number(label, r"S=(\d+)")
    return {} if None in (mb, k, s) else {"bucket_mb": mb, "streams": int(k), "slices": int(s)}


def _hvd_settings(c: Mapping) -> dict:
    """Horovod at its defaults (its 128 MB fusion threshold) but for what the mapping gives: `fusion_mb` (the lab's)
    and `negotiation_s_per_rank` (the lab's fit)."""
    return {"horovod": Horovod(**{k: float(c[k]) for k in ("fusion_mb", "negotiation_s_per_rank") if k in c})}


def _hvd_label(n: int, kw: dict) -> str:
    h = kw.get("horovod") or Horovod()
    return f"fusion {h.fusion_mb:g} MB, cycle {h.cycle_s * 1000:g} ms"


def _hvd_parse(label: str) -> dict:
    """'fusion 16 MB' (the lab's JSON) -> its fusion threshold."""
    return _keys(fusion_mb=_number(label, r"fusion ([\d.e+-]+) MB"))


PER_TENSOR = StepPattern(_per_tensor, lambda c: {}, _per_tensor_label)
DDP = StepPattern(_ddp, _ddp_settings, _ddp_label, _ddp_parse)
MULTISTREAM = StepPattern(_multistream, _ms_settings, _ms_label, _ms_parse)
HOROVOD = StepPattern(_horovod, _hvd_settings, _hvd_label, _hvd_parse, negotiates=True)
BASELINES = dict(zip(BASELINE_NAMES, (PER_TENSOR,), strict=True))


def messages(
    backend: str,
    specs: list[TensorSpec],
    compute: Compute,
    *,
    settings: Settings | None = None,
    compression: str = "none",
    bucket_cap_mb: float = 25.0,
    horovod: Horovod = Horovod(),
    ranks: int = 1,
    serial: bool = False,
) -> list[Message]:
    """The allreduces one step issues under `backend` (its record's step model), in issue order."""
    ready = _ready_times(compute, len(specs))
    return pattern(backend).issue(
        specs,
        compute,
        ready,
        wire_format(backend, compression),
        settings=settings,
        bucket_cap_mb=bucket_cap_mb,
        horovod=horovod,
        ranks=ranks,
        serial=serial,
    )


@functools.lru_cache(maxsize=1024)
def _messages(backend, specs, compute, **settings) -> list[Message]:
    """messages(), remembered: a fit or a search asks for the same plan under many network parameters (`settings`:
    messages()'s keywords, all given, so that one plan is one cache entry)."""
    return messages(backend, list(specs), compute, **settings)


# ---------------------------------------------------------------------------------------------------------
# The network: a fluid simulation of communicators sharing a host's link.


def simulate(msgs: list[Message], net: Network) -> tuple[float, float, list[tuple[float, float]]]:
    """(time the last message ends, busy time, [(start, end)] per message); times since the start of backward."""
    h, g = net.hosts, net.gpus_per_host
    if not msgs or h * g == 1:
        return 0.0, 0.0, [(m.ready_s, m.ready_s) for m in msgs]
    link = net.link_gbit * 1e9 / 8 * net.efficiency  # bytes/s
    flow = math.inf if net.flow_gbit is None else net.flow_gbit * 1e9 / 8 * net.efficiency * net.flows_per_comm
    intra = net.intra_gbyte * 1e9

    def fixed(m: Message) -> float:
        lat = 2 * (h - 1) * net.latency_s + (2 * (g - 1) * net.latency_s if g > 1 else 0.0)
        return lat + (2 * (g - 1) / g * m.nbytes / intra if g > 1 else 0.0)

    def volume(m: Message) -> float:
        return 2 * (h - 1) / h * m.nbytes

    comms = sorted({m.comm for m in msgs})
    queues = {c: [i for i, m in enumerate(msgs) if m.comm == c] for c in comms}
    head = dict.fromkeys(comms, 0)
    # per communicator: (message index, phase 'lat' | 'data', value: end time of latency or bytes left)
    active: dict[int, list] = {}
    free_at = dict.fromkeys(comms, 0.0)
    spans = [(0.0, 0.0)] * len(msgs)
    t, busy, eps = 0.0, 0.0, 1e-15
    while True:
        for c in comms:  # start what can start
            if c not in active and head[c] < len(queues[c]):
                i = queues[c][head[c]]
                if max(msgs[i].ready_s, free_at[c]) <= t + eps:
                    active[c] = [i, "lat", t + fixed(msgs[i])]
                    spans[i] = (t, 0.0)
        if not active:
            pending = [max(msgs[queues[c][head[c]]].ready_s, free_at[c]) for c in comms if head[c] < len(queues[c])]
            if not pending:
                break
            t = min(pending)
            continue
        data = [c for c, a in active.items() if a[1] == "data"]
        rate = min(flow, link / len(data)) if data else 0.0
        candidates = [a[2] - t for a in active.values() if a[1] == "lat"]
        candidates += [a[2] / rate for c, a in active.items() if a[1] == "data"]
        candidates += [
            max(msgs[queues[c][head[c]]].ready_s, free_at[c]) - t
            for c in comms
            if c not in active and head[c] < len(queues[c])
        ]
        dt = max(min(candidates), 0.0)
        for c in data:
            active[c][2] -= rate * dt
        t += dt
        busy += dt
        for c in list(active):
            i, phase, v = active[c]
            if phase == "lat" and v <= t + eps:
                active[c] = [i, "data", volume(msgs[i])]
                phase, v = "data", volume(msgs[i])
            if phase == "data" and v <= max(1e-6, volume(msgs[i]) * 1e-12):
                spans[i] = (spans[i][0], t)
                free_at[c] = t
                head[c] += 1
                del active[c]
    return t, busy, spans


def pattern(backend: str) -> StepPattern:
    """The step model of `backend`: a registered backend's record's `step_model`, or a baseline's (BASELINES)."""
    if backend in BASELINES:
        return BASELINES[backend]
    rec = registry.ALLREDUCE_BACKENDS.get(backend)
    if rec is None:
        raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    if not rec.step_model:
        raise ValueError(f"{backend}: its record (base/registry.py) names no step_model")
    return registry.resolve(rec.step_model)


def wire_format(backend: str, compression: str = "none") -> str:
    """The format `backend`'s messages carry: the dtype its record fixes (registry.Allreduce.wire_dtype, e.g. a hook
    that always sends bf16), else `compression` as the caller gives it (estimate.backends: the record's `wire` of
    comm.compression; the published entries' fp16 gradients)."""
    rec = registry.ALLREDUCE_BACKENDS.get(backend)
    return (rec.wire_dtype if rec is not None else None) or compression


def backend_kwargs(backend: str, comm=None) -> dict:
    """predict_step's settings of `backend` from a config's comm section (None: the defaults), wire format aside."""
    return pattern(backend).settings(comm.flat() if comm is not None else {})


def settings_label(backend: str, n: int, kwargs: dict) -> str:
    """How `backend` at predict_step's settings `kwargs` is described in tables and the lab's JSON, for n gradients."""
    return pattern(backend).label(n, kwargs)


def predict_step(
    backend: str,
    specs: list[TensorSpec],
    compute: Compute,
    net: Network,
    *,
    settings: Settings | None = None,
    compression: str = "none",
    bucket_cap_mb: float = 25.0,
    horovod: Horovod = Horovod(),
    flows: int | None = None,
    serial: bool = False,
) -> StepPrediction:
    """Step time of `backend` for one GPU's share of the work on `net`, by phase.

    flows: TCP flows each of the backend's communicators opens per peer (None: net.flows_per_comm, 1 unless set).
    """
    if flows is not None:
        if flows < 1:
            raise ValueError(f"flows: expected a positive integer, got {flows}")
        net = replace(net, flows_per_comm=flows)
    ranks = net.hosts * net.gpus_per_host
    msgs = _messages(
        backend,
        tuple(specs),
        compute,
        settings=settings,
        compression=compression,
        bucket_cap_mb=bucket_cap_mb,
        horovod=horovod,
        ranks=ranks,
        serial=serial,
    )
    end, busy, spans = simulate(msgs, net)
    hidden = sum(max(0.0, min(e, compute.backward_s) - s) for s, e in _union(spans))
    label = settings_label(
        backend,
        len(specs),
        {"settings": settings, "bucket_cap_mb": bucket_cap_mb, "horovod": horovod, "serial": serial},
    )
    wire = wire_format(backend, compression)
    if wire != "none":
        label += f", wire {wire}"
    if net.flows_per_comm != 1:
        label += f", {net.flows_per_comm} flows per communicator"
    return StepPrediction(
        backend,
        label,
        compute.forward_s,
        compute.backward_s,
        busy,
        hidden,
        max(0.0, end - compute.backward_s),
        compute.optimizer_s,
        len(msgs),
    )


def hierarchical_seconds(nbytes: float, net: Network, ring_mbit: float) -> float:
    """comm.hierarchy=host, the data time of one allreduce of `nbytes`: a reduce-scatter and an all-gather inside the
    host (2(G-1)/G x nbytes at `intra_gbyte`, as every message's intra-host stage here), then G rings between the
    hosts, one per local rank, each of length `hosts` on 1/G of the bytes; `ring_mbit` is the G rings' rate together
    (recipes/comm/flowrates.py's hier_mbit), so the inter-host part is 2(H-1)/H x nbytes at it."""
    g, h = net.gpus_per_host, net.hosts
    intra = 2 * (g - 1) / g * nbytes / (net.intra_gbyte * 1e9) if g > 1 else 0.0
    inter = 2 * (h - 1) / h * nbytes * 8 / (ring_mbit * 1e6) if h > 1 else 0.0
    return intra + inter


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def recommend(
    specs: list[TensorSpec], compute: Compute, net: Network, space: list[Settings], compression: str = "none"
) -> list[tuple[Settings, float]]:
    """The candidates of `space` with their predicted step times, fastest first."""
    scored = [
        (s, predict_step("multistream", specs, compute, net, settings=s, compression=compression).step_s) for s in space
    ]
    return sorted(scored, key=lambda x: (x[1], x[0].streams, x[0].slices, -x[0].bucket_mb))


def no_overlap(specs: list[TensorSpec], seconds: float = 0.0) -> Compute:
    """A step whose gradients are all ready at once, after `seconds` of compute (the lab's gradient-list model)."""
    return Compute(0.0, seconds, tuple(1.0 for _ in specs))
