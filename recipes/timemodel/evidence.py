"""The published evidence: the runs the model is calibrated on (Alibaba 1 x 8 and 16 x 8) and the multi-host
entries it was not fitted on (out of sample), each with the software it ran."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from recipes.comm import stepmodel as sm
from recipes.comm.plan import Settings
from recipes.timemodel.estimate import Backend, Cluster, Estimate, entry_phases, estimate
from recipes.timemodel.profile import GradProfile
from recipes.timemodel.rates import PUBLISHED, GpuRates


@dataclass(frozen=True)
class PublishedRun:
    name: str
    source: str
    hosts: int
    gpus_per_host: int
    rows: tuple[tuple[int, int, int], ...]  # (image size, global batch, epochs)
    phase_s: tuple[float, ...]  # training clock (the TSV's hours) per phase, seconds
    link_gbit: float = 32.0
    flow_gbit: float | None = 10.0


# The TSV hours at each phase's last epoch, differenced (ImageNet/train/alibabacloud_resnet50_gn6e_{1,16}_machine_*)
ALIBABA_1X8 = PublishedRun(
    "Alibaba 1 x 8 V100 (AIACC-Training, TF 2.1 + XLA)",
    "alibabacloud_resnet50_gn6e_1_machine_tensorflow.tsv",
    1,
    8,
    ((96, 2048, 12), (128, 2048, 6), (224, 2048, 2), (288, 1024, 1)),
    (447.62, 335.97, 277.34, 236.73),
)
ALIBABA_16X8 = PublishedRun(
    "Alibaba 16 x 8 V100, 32 Gbit/s (the record)",
    "alibabacloud_resnet50_gn6e_16_machine_tensorflow.tsv",
    16,
    8,
    ((96, 32768, 13), (128, 32768, 11), (224, 32768, 3), (288, 16384, 1)),
    (51.05, 57.36, 31.11, 18.03),
)
CALIBRATION_RUNS = (ALIBABA_1X8, ALIBABA_16X8)
# AIACC-Training on TensorFlow + XLA: fp16 gradients (~50 MB a step) on several streams, after backward (XLA
# compiles backward as one cluster: no gradient is ready before its end, so nothing is hidden).
CALIBRATION_BACKEND = Backend(
    "AIACC (multistream, fp16, after backward)",
    "multistream",
    {"settings": Settings(8.0, 4, 2), "compression": "fp16"},
    overlap=False,
)


def run_estimate(
    run: PublishedRun, prof: GradProfile, gpu: GpuRates | None = None, backend: Backend | None = None
) -> Estimate:
    cluster = Cluster(run.hosts, run.gpus_per_host, run.link_gbit, run.flow_gbit)
    return estimate(
        entry_phases(list(run.rows), run.hosts, run.gpus_per_host),
        cluster,
        gpu or PUBLISHED["v100-tf-xla"],
        backend=backend or CALIBRATION_BACKEND,
        prof=prof,
    )


def calibration(prof: GradProfile) -> list[tuple[PublishedRun, Estimate]]:
    return [(run, run_estimate(run, prof)) for run in CALIBRATION_RUNS]


def calibration_lines(prof: GradProfile) -> list[str]:
    """The fit's residuals per phase (training clock), as a Markdown table."""
    lines = [
        "| published run (fitted, training clock) | phase | px | published s | model s | residual |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for run, est in calibration(prof):
        for i, (p, pub) in enumerate(zip(est.phases, run.phase_s, strict=True)):
            m = p.total("train")
            lines.append(
                f"| {run.name if i == 0 else ''} | {i + 1} | {p.phase.image_size} | {pub:.1f} | {m:.1f} | "
                f"{m / pub - 1:+.1%} |"
            )
        tot, m = sum(run.phase_s), est.total("train")
        lines.append(f"| | total | | {tot:.1f} | {m:.1f} | {m / tot - 1:+.1%} |")
    return lines


# ---------------------------------------------------------------------------------------------------------
# Out of sample: published multi-host V100 entries the model was not fitted on.


@dataclass(frozen=True)
class EntrySoftware:
    """What an out-of-sample entry ran, from its JSON and its code: the rate table, the allreduce, the per-flow cap."""

    gpu: str
    backend: Backend
    flow_gbit: float | None
    source: str
    startup_in_clock: bool = False
    startup_source: str = "the clock starts after set-up"


ENTRY_SOFTWARE = {
    # fast.ai's imagenet18 (training/train_imagenet_nv.py, diux-dev/imagenet18) on PyTorch 0.4/0.5 and NCCL 2.2:
    # torch.nn.parallel.DistributedDataParallel with the NCCL backend reduces all gradients in one step after
    # backward (_register_nccl_grad_hook: 256 MB buckets, nothing overlapped), broadcasts the BN buffers from rank 0
    # in every forward (_sync_params, one ring pass) and the loop all-reduces its metrics every step and copies
    # them to the host (dist_utils.sum_tensor(metrics).cpu(), two passes). NCCL 2.2 had rings only (trees: 2.4).
    "pytorch-0.4-ddp": EntrySoftware(
        "v100-pytorch-2018",
        Backend(
            "PyTorch 0.4 DDP, NCCL (one allreduce after backward)",
            "ddp",
            {"bucket_cap_mb": 256.0, "compression": "fp16"},
            overlap=False,
            small_ring_passes=3,
            small_source="imagenet18's loop: BN buffers broadcast in DDP's forward (1 pass) and a metrics "
            "all_reduce + .cpu() every step (2 passes), each (N - 1) ring steps over all N ranks (NCCL 2.2: rings)",
        ),
        10.0,
        "AWS: 10 Gbit/s per flow in a cluster placement group, 25 Gbit/s per p3.16xlarge",
        True,
        "imagenet18 takes start_time before its first collective (NCCL set-up) and before the loaders' workers "
        "start: the first epoch carries the start-up (its TSVs: +15 to +47 s over the second)",
    ),
    # Huawei's ModelArts entry (TensorFlow 1.13 + XLA, AMP, Horovod 0.15.2 with fp16 compression, NCCL 2.4.2, GPUDirect
    # RDMA over InfiniBand): the record's kind of software, so the Alibaba 1 x 8 rates; Horovod's fusion buffer
    # 64 MB (its default then); XLA's backward as one cluster, so nothing is ready before its end (as for AIACC).
    "tf-xla-horovod-ib": EntrySoftware(
        "v100-tf-xla",
        Backend(
            "Horovod 0.15 (fp16, after backward: XLA)",
            "horovod",
            {"horovod": sm.Horovod(fusion_mb=64.0), "compression": "fp16"},
            overlap=False,
        ),
        None,
        "InfiniBand: no per-flow cap (RDMA); the link rate is not published: 100 Gbit/s (EDR) assumed",
    ),
}


def out_of_sample(path: str | Path, prof: GradProfile) -> list[dict]:
    """Each entry of `path` (tests/data/dawnbench_entries/out_of_sample.json) against the model, per image size,
    with the software its JSON and code name (ENTRY_SOFTWARE): nothing is fitted on these entries."""
    doc = json.loads(Path(path).read_text())
    out = []
    for e in doc["entries"]:
        sw = ENTRY_SOFTWARE[e["software"]]
        cluster = Cluster(e["hosts"], e["gpus_per_host"], e["link_gbit"], sw.flow_gbit)
        est = estimate(
            entry_phases([tuple(r) for r in e["rows"]], e["hosts"], e["gpus_per_host"]),
            cluster,
            PUBLISHED[sw.gpu],
            backend=sw.backend,
            prof=prof,
            startup_in_clock=sw.startup_in_clock,
        )
        by_size: dict[int, list[float]] = {}
        for p in est.phases:
            row = by_size.setdefault(p.phase.image_size, [0.0, 0.0, 0.0])
            for k, w in enumerate(("low", "mid", "high")):
                row[k] += p.total("train", w)
        sizes = [
            {
                "image_size": int(sz),
                "published_s": pub,
                "low": by_size[int(sz)][0],
                "mid": by_size[int(sz)][1],
                "high": by_size[int(sz)][2],
            }
            for sz, pub in e["size_s"].items()
        ]
        pub_total = sum(x["published_s"] for x in sizes)
        out.append(
            {
                "name": e["name"],
                "source": e["source"],
                "software": e["software"],
                "step_ms": [(p.phase.image_size, p.phase.batch, p.step_ms) for p in est.phases],
                "sizes": sizes,
                "published_s": pub_total,
                "low": est.total("train", "low"),
                "mid": est.total("train"),
                "high": est.total("train", "high"),
            }
        )
    return out


def out_of_sample_lines(path: str | Path, prof: GradProfile) -> list[str]:
    lines = [
        "| published entry (not fitted, training clock) | px | published s | model s (low-high) | error |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in out_of_sample(path, prof):
        for i, x in enumerate(r["sizes"]):
            lines.append(
                f"| {r['name'] if i == 0 else ''} | {x['image_size']} | {x['published_s']:.0f} | {x['mid']:.0f} "
                f"({x['low']:.0f}-{x['high']:.0f}) | {x['mid'] / x['published_s'] - 1:+.0%} |"
            )
        lines.append(
            f"| | total | {r['published_s']:.0f} | {r['mid']:.0f} ({r['low']:.0f}-{r['high']:.0f}) | "
            f"{r['mid'] / r['published_s'] - 1:+.0%} |"
        )
    return lines


def out_of_sample_step_lines(path: str | Path, prof: GradProfile) -> list[str]:
    """The model's per-step terms (ms) of every out-of-sample segment, with the software each entry ran."""
    keys = ("compute", "step floor", "intra-host", "exposed comm", "sync", "small collectives")
    lines = [
        "| entry | software (allreduce) | px | batch/GPU | " + " | ".join(f"{k} ms" for k in keys) + " | step ms |",
        "|---|---|---:|---:|" + "---:|" * (len(keys) + 1),
    ]
    for r in out_of_sample(path, prof):
        sw = ENTRY_SOFTWARE[r["software"]]
        for i, (size, batch, ms) in enumerate(r["step_ms"]):
            head = f"{r['source'].split('.json')[0]} | {sw.backend.label}" if i == 0 else " | "
            cells = " | ".join(f"{ms[k]:.1f}" for k in keys)
            lines.append(f"| {head} | {size} | {batch} | {cells} | {sum(ms[k] for k in keys):.0f} |")
    return lines
