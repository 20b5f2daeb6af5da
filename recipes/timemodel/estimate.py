"""The estimate: a schedule's phases on a cluster, every cost a term with a low-mid-high range and its source."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from base import registry
from recipes.comm import stepmodel as sm
from recipes.comm.concurrency import driver_serializes
from recipes.timemodel.imagenet import IMAGENET_TRAIN_IMAGES, VAL_IMAGES
from recipes.timemodel.inputs import LOW_HIGH as INPUT_LOW_HIGH
from recipes.timemodel.profile import GradProfile
from recipes.timemodel.rates import FLOOR_WHY, GpuRates
from recipes.timemodel.terms import BnAllreduce, CommUncertainty, StartUp, Sync, Validation


@dataclass(frozen=True)
class Cluster:
    hosts: int
    gpus_per_host: int
    link_gbit: float = 32.0
    flow_gbit: float | None = 10.0
    flows_per_comm: int = 1  # TCP flows one communicator opens (NCCL sockets); see network()
    latency_s: float = 50e-6
    intra_gbyte: float = 150.0
    efficiency: float = 0.93

    @property
    def world(self) -> int:
        return self.hosts * self.gpus_per_host

    def network(self, hosts: int | None = None) -> sm.Network:
        """The stepmodel network of this cluster (or of `hosts` of its hosts).

        The one place where flows per communicator reach the comm model: a per-backend value (ddp with N flows)
        is wired here when stepmodel takes one."""
        return sm.Network(
            self.hosts if hosts is None else hosts,
            self.gpus_per_host,
            self.link_gbit,
            self.flow_gbit,
            self.latency_s,
            self.intra_gbyte,
            self.efficiency,
            flows_per_comm=self.flows_per_comm,
        )


@dataclass(frozen=True)
class Phase:
    """Part of a schedule with one image size and one per-GPU batch."""

    epochs: int
    steps: int  # optimizer steps over those epochs
    batch: int  # per GPU
    image_size: int
    val_size: int = 0  # 0: the image size
    micro_batches: int = 1  # gradient accumulation: the step runs its per-GPU batch as this many micro-batches


@dataclass(frozen=True)
class Backend:
    label: str
    name: str  # stepmodel backend
    kwargs: dict = field(default_factory=dict, hash=False, compare=False)
    overlap: bool = True  # False: every gradient ready at backward's end (XLA compiles backward as one cluster)
    # Latency-bound collectives every step besides the gradients', in passes around a flat ring of all N ranks
    # (a broadcast 1, an allreduce 2; NCCL before 2.4 had rings only): 0 for this trainer (DDP with
    # broadcast_buffers=False, no per-step metric allreduce; the finite check is deferred).
    small_ring_passes: int = 0
    small_source: str = "none: this trainer runs no per-step collective besides the gradients'"

    def small_collectives_s(self, cluster: Cluster) -> float:
        """Per step, over the same on one host (the single-host rates include it): (N - 1) ring steps of the
        per-message latency per pass."""
        one = (cluster.gpus_per_host - 1) * cluster.latency_s
        return self.small_ring_passes * ((cluster.world - 1) * cluster.latency_s - one)


def schedule_phases(cfg, world: int) -> list[Phase]:
    """The config's schedule on ImageNet-1k, one Phase per (image size, per-GPU batch)."""
    from recipes.memory import accumulation
    from recipes.schedule import Schedule

    plan = Schedule(cfg.phases, cfg.optim, num_images=IMAGENET_TRAIN_IMAGES, world_size=world, **accumulation(cfg))
    out: dict[int, list] = {}
    for e in plan.epochs:
        row = out.setdefault(e.phase_index, [0, 0, e.phase.batch_size // world, e.phase.image_size, 0, e.micro_batches])
        row[0] += 1
        row[1] += e.steps
    return [Phase(*row) for row in out.values()]


def entry_phases(rows: list[tuple[int, int, int]], hosts: int, gpus_per_host: int) -> list[Phase]:
    """Phases of a published entry: (image size, global batch, epochs) rows; steps = ceil(images / batch)."""
    world = hosts * gpus_per_host
    return [Phase(ep, ep * math.ceil(IMAGENET_TRAIN_IMAGES / b), b // world, s) for s, b, ep in rows]


def backends(cfg=None, driver: str | None = None) -> list[Backend]:
    """The time model's row of every registered allreduce backend (base/registry.py), one per TCP-flow count of
    its record (ddp: 1 and 4), with the config's comm settings if given: what scripts/predict.py compares.

    `driver`: the hosts' NVIDIA driver (e.g. '535.183.01'); where it is older than R545, comm.concurrency=auto on
    NCCL runs serialized (recipes/comm/concurrency.py), and the rows are predicted as the engine will run."""
    c = cfg.comm if cfg is not None else None
    nccl = cfg is None or cfg.dist.backend != "gloo"  # auto is NCCL on the GPU hosts the model is of
    out = []
    for rec in registry.ALLREDUCE_BACKENDS.values():
        own = c.as_part(rec.name) if c is not None else None  # this row's backend, with the config's comm values
        keys = own.flat() if own is not None else {}
        if nccl and driver_serializes(driver) and keys.get("concurrency") == "auto":  # a backend with the knob
            keys = {**keys, "concurrency": "serialize"}
        kwargs = {
            **sm.pattern(rec.name).settings(keys),
            "compression": rec.wire(own.get("compression", "none") if own else "none"),
        }
        for flows in rec.time_flows:
            out.append(Backend(rec.row_label(flows), rec.name, {**kwargs, **({"flows": flows} if flows > 1 else {})}))
    return out


# ---------------------------------------------------------------------------------------------------------
# The terms of a phase.


@dataclass(frozen=True)
class Term:
    name: str
    clock: str  # "train": in DAWNBench's training clock (and the wall clock); "wall": the wall clock only
    low: float
    mid: float
    high: float
    source: str


@dataclass
class PhaseEstimate:
    phase: Phase
    terms: list[Term]
    step_ms: dict[str, float]  # per-step parts, for the table

    def total(self, clock: str = "train", which: str = "mid") -> float:
        return sum(getattr(t, which) for t in self.terms if clock == "wall" or t.clock == "train")


@dataclass
class Estimate:
    backend: str
    gpu: str
    cluster: Cluster
    phases: list[PhaseEstimate]

    def total(self, clock: str = "train", which: str = "mid") -> float:
        return sum(p.total(clock, which) for p in self.phases)

    def range(self, clock: str = "train") -> tuple[float, float, float]:
        return self.total(clock, "low"), self.total(clock, "mid"), self.total(clock, "high")

    def widest(self, clock: str = "train") -> tuple[str, float]:
        """The term whose range contributes most to the total's range, and that width in seconds."""
        width: dict[str, float] = {}
        for p in self.phases:
            for t in p.terms:
                if clock == "wall" or t.clock == "train":
                    width[t.name] = width.get(t.name, 0.0) + (t.high - t.low)
        name = max(width, key=width.get)
        return name, width[name]

    def to_json(self) -> dict:
        return {
            "backend": self.backend,
            "gpu": self.gpu,
            "cluster": self.cluster.__dict__,
            "train_s": dict(zip(("low", "mid", "high"), self.range("train"), strict=True)),
            "wall_s": dict(zip(("low", "mid", "high"), self.range("wall"), strict=True)),
            "widest_term": self.widest("wall")[0],
            "phases": [
                {
                    **p.phase.__dict__,
                    "step_ms": p.step_ms,
                    "train_s": p.total("train"),
                    "wall_s": p.total("wall"),
                    "terms": [t.__dict__ for t in p.terms],
                }
                for p in self.phases
            ],
        }


def step_compute(rates: GpuRates, image_size: int, batch: int, gpus_per_host: int, prof: GradProfile) -> sm.Compute:
    """One GPU's calibrated training step at `image_size` and per-GPU `batch` inside a host of `gpus_per_host` GPUs
    (compute plus the intra-host share), split into forward and backward with the profile's gradient-ready times."""
    step = rates.step_s(image_size, batch)
    if gpus_per_host > 1:
        step /= rates.host_efficiency  # compute + intra-host, as estimate() counts them
    return sm.Compute(step * prof.forward_share, step * (1 - prof.forward_share), prof.ready, 0.0)


def exposed_comm_s(backend: Backend, prof: GradProfile, step_s: float, cluster: Cluster, hosts: int) -> float:
    """Communication after backward's end on `hosts` hosts (stepmodel's fluid simulation)."""
    ready = prof.ready if backend.overlap else tuple(1.0 for _ in prof.ready)
    comp = sm.Compute(step_s * prof.forward_share, step_s * (1 - prof.forward_share), ready, 0.0)
    return sm.predict_step(backend.name, list(prof.specs), comp, cluster.network(hosts), **backend.kwargs).exposed_s


def _bn_allreduce_s(prof: GradProfile, cluster: Cluster) -> float:
    h, g = cluster.hosts, cluster.gpus_per_host
    if h * g == 1:
        return 0.0
    lat = 2 * (h - 1 + (g - 1)) * cluster.latency_s
    link = cluster.link_gbit * 1e9 / 8 * cluster.efficiency
    return lat + (2 * (h - 1) / h * prof.bn_bytes / link if h > 1 else 0.0)


def estimate(
    phases: list[Phase],
    cluster: Cluster,
    gpu: GpuRates,
    *,
    backend: Backend,
    prof: GradProfile,
    sync: Sync = Sync(),
    startup: StartUp = StartUp(),
    startup_in_clock: bool = False,
    inputs=None,
) -> Estimate:
    """Every term of every phase, on the training and wall clocks (`startup_in_clock`: the run's clock starts
    before its set-up, as some published entries' code does; `inputs`: the input pipeline's InputRate, whose
    decoding a step waits for where it is slower than the step, recipes/timemodel/inputs.py)."""
    h, g, n = cluster.hosts, cluster.gpus_per_host, cluster.world
    cu, val = CommUncertainty(), Validation()
    out = []
    prev_shape = None
    for i, ph in enumerate(phases):
        per_img = gpu.per_image_s(ph.image_size)
        u = gpu.uncertainty(ph.image_size)
        compute = ph.batch * per_img
        flo = gpu.step_floor
        # The part of the step the GPU waits for the host, once per micro-batch: each accumulated micro-batch
        # launches its own forward and backward, and at 96-128 px on a Hopper one alone is floor-bound.
        a = ph.micro_batches
        floor = [a * max(0.0, f - compute / a) for f in flo]
        intra = (compute + floor[1]) * (1 / gpu.host_efficiency - 1) if g > 1 else 0.0
        step = compute + floor[1] + intra
        exposed = 0.0
        if h > 1:
            exposed = max(
                0.0,
                exposed_comm_s(backend, prof, step, cluster, h) - exposed_comm_s(backend, prof, step, cluster, 1),
            )
        sy = sync.seconds(h, g)
        small = backend.small_collectives_s(cluster)
        st = ph.steps
        feed = inputs.step_s(ph.image_size, ph.batch) if inputs is not None else 0.0
        # The pipeline decodes the next step's images while this step runs: a step waits only for what is left.
        wait = [max(0.0, k * feed - (step + exposed + sy)) for k in (INPUT_LOW_HIGH[0], 1.0, INPUT_LOW_HIGH[1])]
        terms = [
            Term("compute", "train", st * compute * (1 - u), st * compute, st * compute * (1 + u), gpu.source),
            Term("step floor", "train", *(st * f for f in floor), gpu.floor_source or FLOOR_WHY),
            Term(
                "intra-host",
                "train",
                st * intra * 0.5,
                st * intra,
                st * intra * 1.5,
                f"host efficiency {gpu.host_efficiency:.3f}: {gpu.host_source}",
            ),
            Term(
                "exposed comm",
                "train",
                st * exposed * cu.low_high[0],
                st * exposed,
                st * exposed * cu.low_high[1],
                f"{backend.label}: {cu.source}",
            ),
            Term("sync", "train", st * sy * sync.low_high[0], st * sy, st * sy * sync.low_high[1], sync.source),
            Term("small collectives", "train", st * small * 0.5, st * small, st * small * 2.0, backend.small_source),
            Term("input wait", "train", *(st * w for w in wait), inputs.source if inputs else "no input term"),
        ]
        shape = (ph.image_size, ph.batch)
        changed = i > 0 and shape != prev_shape
        prev_shape = shape
        pc = gpu.phase_change_s if changed else (0.0, 0.0, 0.0)
        at = gpu.autotune_s if changed else (0.0, 0.0, 0.0)
        terms += [
            Term("pipeline rebuild", "train", *pc, gpu.phase_change_source),
            Term("autotune", "train", *at, gpu.autotune_source),
        ]
        vsize = ph.val_size or ph.image_size
        val_s = ph.epochs * VAL_IMAGES / n * gpu.per_image_s(vsize) * val.forward_share
        bn = ph.epochs * _bn_allreduce_s(prof, cluster)
        terms += [
            Term("validation", "wall", val_s * val.low_high[0], val_s, val_s * val.low_high[1], val.source),
            Term("BN allreduce", "wall", bn * 0.5, bn, bn * 3.0, BnAllreduce().source),
        ]
        if i == 0:
            clock = "train" if startup_in_clock else "wall"
            terms.append(Term("start-up", clock, *startup.seconds, startup.source))
        step_ms = {
            "compute": compute * 1e3,
            "step floor": floor[1] * 1e3,
            "intra-host": intra * 1e3,
            "exposed comm": exposed * 1e3,
            "sync": sy * 1e3,
            "small collectives": small * 1e3,
            "input wait": wait[1] * 1e3,
        }
        out.append(PhaseEstimate(ph, terms, step_ms))
    return Estimate(backend.label, gpu.name, cluster, out)
