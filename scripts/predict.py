#!/usr/bin/env python
"""Predicted step time and training time of a config on a cluster, per allreduce backend (recipes/comm/stepmodel.py).

    python scripts/predict.py -c configs/dawnbench_158s.yaml                 # 16 x 8 V100, 32 Gbps, 10 Gbps/flow
    python scripts/predict.py -c configs/dawnbench_158s.yaml --hosts 8 --link-gbit 25 --png scaling.png
    python scripts/predict.py --validate lab.json --fit-hosts 2 4           # fit on the lab, check the rest

Compute: the real model's backward is profiled here on the CPU (when each gradient becomes ready, as a fraction of
backward, and the forward/backward split); the GPU's time per image is taken from a published throughput
(`--gpu-img-s`, default 1270 img/s: NVIDIA DeepLearningExamples ResNet-50 v1.5, TensorFlow, V100 16 GB, AMP + XLA,
batch 256, 224 px) and scaled with the pixel count to each phase's image size. The lab file is what
`scripts/bench_allreduce.py --json` writes; --validate is in scripts/predict_lab.py.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from recipes.comm import stepmodel as sm  # noqa: E402
from recipes.comm.plan import Settings, TensorSpec, grad_specs  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
# --validate: the model against the network lab (re-exported: tests use predict.lab_predict, predict.LAB_FIT, ...)
from predict_lab import (  # noqa: E402, F401
    LAB_FIT,
    LAB_METHODS,
    LabFit,
    fit_lab,
    lab_predict,
    lab_specs,
    load_lab,
    measured,
    validate,
)

V100_IMG_S = 1270.0  # NVIDIA DeepLearningExamples RN50 v1.5 TF, 1x V100 16GB, AMP+XLA, batch 256, 224 px
OPTIMIZER_S = 3e-3  # ours: LARS over 25.6M parameters on a V100 (a few fused kernels per layer)


# ---------------------------------------------------------------------------------------------------------
# Compute: a CPU profile of the real model, scaled to a GPU.


@dataclass(frozen=True)
class Profile:
    specs: list[TensorSpec]
    ready: tuple[float, ...]  # gradient-ready fractions of backward
    forward_share: float  # forward / (forward + backward), as measured
    cpu_img_s: float  # CPU images/s (forward + backward) at the profiled size
    image_size: int


def profile_model(model_name: str, image_size: int = 96, batch: int = 2, repeats: int = 2) -> Profile:
    """Forward and backward of `model_name` on the CPU; when each gradient is ready (median of `repeats`)."""
    import torch

    from models.factory import create_model
    from recipes.config import load_config

    cfg = load_config(None, [f"model.name={model_name}"])
    torch.manual_seed(0)
    model = create_model(cfg.model, 1000)
    specs, params = grad_specs(model)
    x = torch.randn(batch, 3, image_size, image_size)
    y = torch.randint(0, 1000, (batch,))
    stamps = [0.0] * len(params)
    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda _p, i=i: stamps.__setitem__(i, time.perf_counter()))
    runs = []
    for _ in range(repeats + 1):  # the first one warms up
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        runs.append((t1 - t0, t2 - t1, [(s - t1) / (t2 - t1) for s in stamps]))
    runs = runs[1:]
    fwd = statistics.median(r[0] for r in runs)
    bwd = statistics.median(r[1] for r in runs)
    ready = tuple(min(1.0, max(0.0, statistics.median(r[2][i] for r in runs))) for i in range(len(params)))
    return Profile(specs, ready, fwd / (fwd + bwd), batch / (fwd + bwd), image_size)


def gpu_compute(prof: Profile, batch: int, image_size: int, gpu_img_s: float, optimizer_s: float) -> sm.Compute:
    """One GPU's step at `batch` images of `image_size` px: the published 224 px time per image x pixel ratio."""
    total = batch / gpu_img_s * (image_size / 224) ** 2
    return sm.Compute(total * prof.forward_share, total * (1 - prof.forward_share), prof.ready, optimizer_s)


# ---------------------------------------------------------------------------------------------------------
# Training time of a config.


def phases(cfg, world: int) -> list[tuple[int, int, int]]:
    """(optimizer steps, per-GPU batch, image size) per phase of the config's schedule, on ImageNet-1k."""
    from recipes.schedule import Schedule
    from recipes.schedule_report import IMAGENET_TRAIN_IMAGES

    plan = Schedule(cfg, IMAGENET_TRAIN_IMAGES, world)
    out: dict[int, list[int]] = {}
    for e in plan.epochs:
        out.setdefault(e.phase_index, [0, e.phase.batch_size // world, e.phase.image_size])[0] += e.steps
    return [tuple(v) for v in out.values()]


def contenders(cfg, recommended: Settings | None) -> list[tuple[str, str, dict]]:
    """(label, backend, keyword arguments of predict_step) for the backends compared."""
    c = cfg.comm
    out = [
        ("ddp", "ddp", {"bucket_cap_mb": c.bucket_cap_mb, "compression": "none"}),
        ("horovod", "horovod", {"horovod": sm.Horovod(fusion_mb=128.0), "compression": "none"}),
        (
            "multistream (defaults)",
            "multistream",
            {"settings": Settings(float(c.bucket_mb), c.streams, c.slices), "compression": c.compression},
        ),
    ]
    if recommended is not None:
        out.append(
            ("multistream (recommended)", "multistream", {"settings": recommended, "compression": c.compression})
        )
    return out


def training(
    cfg, prof: Profile, net: sm.Network, label_backend: tuple[str, str, dict], gpu_img_s: float, optimizer_s: float
) -> dict:
    world = net.hosts * net.gpus_per_host
    label, backend, kw = label_backend
    rows, total, images = [], 0.0, 0
    for steps, batch, size in phases(cfg, world):
        comp = gpu_compute(prof, batch, size, gpu_img_s, optimizer_s)
        p = sm.predict_step(backend, prof.specs, comp, net, **kw)
        rows.append({"steps": steps, "batch": batch, "size": size, "pred": p})
        total += steps * p.step_s
        images += steps * batch * world
    return {"label": label, "rows": rows, "seconds": total, "img_s": images / total}


def recommend_settings(cfg, prof: Profile, net: sm.Network, gpu_img_s: float, optimizer_s: float) -> Settings:
    """The tuner's search space scored over the whole schedule (steps x predicted step time)."""
    from recipes.comm.tuner import search_space

    c = cfg.comm
    space = search_space(c.tune_bucket_mb, c.tune_streams, c.tune_slices)
    world = net.hosts * net.gpus_per_host
    best = None
    for s in space:
        t = 0.0
        for steps, b, r in phases(cfg, world):
            comp = gpu_compute(prof, b, r, gpu_img_s, optimizer_s)
            t += steps * sm.predict_step("multistream", prof.specs, comp, net, s, c.compression).step_s
        if best is None or t < best[1] - 1e-9:
            best = (s, t)
    return best[0]


def report(
    cfg,
    prof: Profile,
    net: sm.Network,
    gpu_img_s: float,
    optimizer_s: float,
    record_s: float | None,
    png: str | None,
    max_hosts: int,
) -> list[str]:
    rec = recommend_settings(cfg, prof, net, gpu_img_s, optimizer_s)
    one = replace(net, hosts=1)
    lines = [
        f"cluster: {net.hosts} hosts x {net.gpus_per_host} GPUs, link {net.link_gbit:g} Gbit/s per host, "
        f"per-flow cap {net.flow_gbit if net.flow_gbit else 'none'} Gbit/s, {net.latency_s * 1e6:g} us per "
        f"ring step, intra-host {net.intra_gbyte:g} GB/s, goodput {net.efficiency:.0%} of the caps",
        f"compute: {cfg.model.name} profiled on this CPU at {prof.image_size} px ({prof.cpu_img_s:.1f} img/s, "
        f"forward {prof.forward_share:.0%} of forward+backward); GPU {gpu_img_s:g} img/s at 224 px, i.e. "
        f"{prof.cpu_img_s * (prof.image_size / 224) ** 2 / gpu_img_s:.2e} x this CPU's time per pixel; "
        f"optimizer {optimizer_s * 1000:g} ms per step",
        f"gradients: {len(prof.specs)} tensors, {sum(s.nbytes for s in prof.specs) / 1e6:.1f} MB "
        f"(fp32; wire {cfg.comm.compression}); recommended multistream settings: {rec.label()}",
        "",
    ]
    lines += [
        "| backend | phase | steps | batch/GPU | px | forward ms | backward ms | comm ms | hidden ms | "
        "exposed ms | step ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    results = []
    for cb in contenders(cfg, rec):
        r = training(cfg, prof, net, cb, gpu_img_s, optimizer_s)
        r1 = training(cfg, prof, one, cb, gpu_img_s, optimizer_s)
        r["efficiency"] = r["img_s"] / (r1["img_s"] * net.hosts)
        results.append(r)
        for i, row in enumerate(r["rows"]):
            p = row["pred"]
            lines.append(
                f"| {r['label'] if i == 0 else ''} | {i + 1} | {row['steps']} | {row['batch']} | "
                f"{row['size']} | {p.forward_s * 1000:.0f} | {p.backward_s * 1000:.0f} | "
                f"{p.comm_busy_s * 1000:.0f} | {p.hidden_s * 1000:.0f} | {p.exposed_s * 1000:.0f} | "
                f"{p.step_s * 1000:.0f} |"
            )
    lines += [
        "",
        "| backend | settings | training s (compute + exposed comm) | images/s | scaling efficiency vs "
        "1 host |" + (" vs record |" if record_s else ""),
        "|---|---|---:|---:|---:|" + ("---:|" if record_s else ""),
    ]
    for r in results:
        settings = r["rows"][0]["pred"].settings
        vs = f" {r['seconds'] / record_s:.2f}x |" if record_s else ""
        lines.append(
            f"| {r['label']} | {settings} | {r['seconds']:.0f} | {r['img_s']:,.0f} | {r['efficiency']:.0%} |{vs}"
        )
    if record_s:
        lines.append(f"| record (AIACC-Training, DAWNBench) | | {record_s:g} (everything, incl. evaluation) | | | |")
    if png:
        plot(cfg, prof, net, gpu_img_s, optimizer_s, rec, png, max_hosts)
        lines.append(f"\nplot: {png}")
    return lines


def plot(
    cfg, prof: Profile, net: sm.Network, gpu_img_s: float, optimizer_s: float, rec: Settings, png: str, max_hosts: int
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hosts = [h for h in (1, 2, 4, 8, 16, 32, 64, 128) if h <= max_hosts]  # global batches divide by these
    fig, ax = plt.subplots(figsize=(7, 4.5))
    base = None
    for cb in contenders(cfg, rec):
        ys = [training(cfg, prof, replace(net, hosts=h), cb, gpu_img_s, optimizer_s)["img_s"] for h in hosts]
        base = base or ys[0]
        ax.plot(hosts, ys, marker="o", ms=3, label=cb[0])
    ax.plot(hosts, [base * h for h in hosts], "k--", lw=1, label="ideal (1 host x hosts)")
    ax.set_xlabel(f"hosts ({net.gpus_per_host} GPUs each)")
    ax.set_ylabel("predicted images/s over the schedule")
    ax.set_title(f"{cfg.run.name}: {net.link_gbit:g} Gbit/s link, {net.flow_gbit or 'no'} Gbit/s per flow")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--config", default=str(ROOT / "configs" / "dawnbench_158s.yaml"))
    ap.add_argument("overrides", nargs="*", help="config overrides key=value (e.g. comm.compression=fp16)")
    ap.add_argument("--hosts", type=int, default=None, help="hosts (default: run.nodes of the config)")
    ap.add_argument("--gpus-per-host", type=int, default=None, help="GPUs per host (default: run.procs_per_node)")
    ap.add_argument("--link-gbit", type=float, default=32.0, help="link per host and direction (Gbit/s)")
    ap.add_argument("--flow-gbit", type=float, default=10.0, help="per-flow cap (Gbit/s; 0 = none)")
    ap.add_argument("--latency-us", type=float, default=50.0, help="per-message latency of one ring step (us)")
    ap.add_argument("--intra-gbyte", type=float, default=150.0, help="intra-host stage (GB/s; NVLink ~150, PCIe ~12)")
    ap.add_argument("--efficiency", type=float, default=0.93, help="TCP goodput as a fraction of the caps")
    ap.add_argument("--gpu-img-s", type=float, default=V100_IMG_S, help="GPU training images/s at 224 px")
    ap.add_argument("--optimizer-ms", type=float, default=OPTIMIZER_S * 1000, help="optimizer step (ms)")
    ap.add_argument("--profile-size", type=int, default=96, help="image size of the CPU profile")
    ap.add_argument("--record-s", type=float, default=158.0, help="the record's time, for comparison (0 = none)")
    ap.add_argument("--png", default="", help="plot predicted images/s against hosts to this PNG")
    ap.add_argument("--max-hosts", type=int, default=64)
    ap.add_argument("--validate", nargs="+", default=[], help="scripts/bench_allreduce.py --json files: fit, check")
    ap.add_argument("--fit-hosts", type=int, nargs="+", default=[2, 4], help="--validate: host counts to fit on")
    args = ap.parse_args(argv)
    if args.validate:
        print("\n".join(validate(args.validate, args.fit_hosts)))
        return 0
    from recipes.config import load_config
    from recipes.errors import ConfigError

    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for key in ("hosts", "gpus_per_host", "link_gbit", "gpu_img_s", "intra_gbyte", "efficiency"):
        v = getattr(args, key)
        if v is not None and v <= 0:
            print(f"error: --{key.replace('_', '-')}: expected a positive number, got {v}", file=sys.stderr)
            return 2
    net = sm.Network(
        args.hosts or cfg.run.nodes,
        args.gpus_per_host or cfg.run.procs_per_node,
        args.link_gbit,
        args.flow_gbit or None,
        args.latency_us * 1e-6,
        args.intra_gbyte,
        args.efficiency,
    )
    prof = profile_model(cfg.model.name, args.profile_size)
    print(
        "\n".join(
            report(
                cfg,
                prof,
                net,
                args.gpu_img_s,
                args.optimizer_ms / 1000,
                args.record_s or None,
                args.png or None,
                args.max_hosts,
            )
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
