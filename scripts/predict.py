#!/usr/bin/env python
"""Predicted training time of a config on a cluster, per allreduce backend, every cost a term (recipes/timemodel/).

    python scripts/predict.py -c configs/dawnbench_158s.yaml                 # 16 x 8 V100 32 GB, 32 Gbps, 10/flow
    python scripts/predict.py --hosts 2 --gpus-per-host 8 --gpu a100 --link-gbit 100 --json a100.json
    python scripts/predict.py --gpu-profile gpu_check.json                   # measured rates replace published ones
    python scripts/predict.py --network runs/x/network.json                  # the link probe's figures (launch.py)

Compute comes per image size from a rate table (published PyTorch figures per GPU, the H200 measured here and the
H100 derived from it, or `--gpu-profile` from `make gpu-check`), never shorter than the step floor (a per-step cost
set on the host, found in the rate table: the "floor ms" column is the part of a step the GPU waits for it); the
intra-host share, the exposed inter-host communication (recipes/comm/stepmodel.py), a per-step
synchronisation cost, pipeline rebuilds and autotuning at phase changes are training-clock terms; validation, the
BN-statistics allreduce and start-up are wall-clock terms. Every run prints the calibration on the two published
Alibaba runs (fitted, with residuals: docs/data/timemodel-evidence.json, which lab/timemodel_evidence.py writes
with the out-of-sample evidence); a prediction is a range with the term of the widest uncertainty named.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from base import registry  # noqa: E402
from base.errors import RunDirError  # noqa: E402
from base.writer import check_target, to_json, write_output  # noqa: E402
from recipes import timemodel as tm  # noqa: E402
from recipes.argtypes import OneLineParser, bounded_float, bounded_int  # noqa: E402
from recipes.comm.plan import Settings  # noqa: E402
from recipes.rundir.writer import figure_bytes  # noqa: E402
from scripts.predict_balance import balance_lines  # noqa: E402

RECORD_S = 157.55  # the record's TSV: hours 0.043763889 at its last epoch (DAWNBench training clock)

DEFAULT_GPU = "v100-32gb"  # the record's GPU: a config that names none is predicted on it
RATE_TABLE_OF = {"a100-40gb": "a100"}  # a memory size of a GPU whose compute has one rate table


def gpu_and_dtype(cfg, gpu: str | None, dtype: str | None) -> tuple[str, str, str]:
    """(rate table, dtype, a line saying where each came from): the flags, else the config's run.gpu and run.amp."""
    if gpu:
        where = "--gpu"
    elif cfg.run.gpu:
        gpu, where = cfg.run.gpu, "run.gpu of the config"
    else:
        gpu, where = DEFAULT_GPU, "the record's; the config names no run.gpu"
    table = RATE_TABLE_OF.get(gpu, gpu)
    if table != gpu:
        where += f"; rates of {table}"
    if dtype:
        dwhere = "--dtype"
    elif cfg.run.amp in tm.DTYPES:
        dtype, dwhere = cfg.run.amp, "run.amp of the config"
    else:
        dtype, dwhere = "fp16", f"run.amp={cfg.run.amp} has no rate table; fp16's"
    return table, dtype, f"GPU: {gpu} ({where}), dtype: {dtype} ({dwhere})"


def rates_label(gpu: str, dtype: str, profile: str = "") -> str:
    """Whether the rates of (gpu, dtype) were measured, published, or derived from other figures."""
    if profile:
        return f"measured ({profile})"
    if gpu == "h200":
        return (
            "measured (make gpu-check on an H200)"
            if dtype == "fp16"
            else ("measured at 128 and 224 px, 288 px derived from fp16 at the measured bf16/fp16 ratio")
        )
    if gpu in tm.MEASURED:
        return f"derived (from the H200's measured {dtype} rates)"
    if dtype != "fp16":
        return f"derived (the published AMP fp16 figures, taken for {dtype})"
    return "published (AMP fp16 figures)"


def recommend_settings(cfg, phases, cluster, rates, prof, row: tm.Backend) -> Settings:
    """The tuner's search space scored over the whole schedule with the calibrated compute (training clock), for
    the time model's `row` of a backend the tuner tunes."""
    from recipes.comm.tuner import search_space

    c = cfg.comm.as_part(row.name)  # the row's backend with the config's comm values
    best = None
    for s in search_space(c.tune_bucket_mb, c.tune_streams, c.tune_slices):
        be = tm.Backend(row.label, row.name, {**row.kwargs, "settings": s})
        t = tm.estimate(phases, cluster, rates, backend=be, prof=prof).total("train")
        if best is None or t < best[1] - 1e-9:
            best = (s, t)
    return best[0]


def tuned_rows(rows: list[tm.Backend]) -> list[tm.Backend]:
    """The rows the tuner's search space (recipes/comm/tuner.py: bucket, streams, slices) applies to: a backend
    comm.autotune tunes (its record's `autotune`) whose settings are a fusion plan's."""
    return [
        r
        for r in rows
        if registry.ALLREDUCE_BACKENDS[r.name].autotune and isinstance(r.kwargs.get("settings"), Settings)
    ]


def driver_version(text: str) -> str:
    """argparse type of --driver: 'NNN' or 'NNN.NN[.NN]', digits only."""
    if not re.fullmatch(r"\d{1,4}(\.\d{1,4}){0,2}", text):
        raise argparse.ArgumentTypeError(f"expected a driver version such as 535.183.01, got {text[:40]!r}")
    return text


def driver_lines(cfg, driver: str | None) -> list[str]:
    """What --driver changed: the rows predicted serialized (comm.concurrency=auto falls back on NCCL)."""
    if not driver:
        return []
    serial = [b.label for b in tm.backends(cfg, driver) if b.kwargs.get("serial")]
    if not serial:
        return [f"driver {driver}: no row runs differently (R545 or newer, or no backend falls back)"]
    return [
        f"driver {driver}: older than R545 (CUDA 12.3), so {', '.join(dict.fromkeys(serial))} with "
        "comm.concurrency=auto runs serialized on NCCL (one collective in flight: its K connections never carry data "
        "together) and is predicted so; a driver of R545 or newer lets them overlap"
    ]


def estimates(cfg, cluster, rates, prof, driver: str | None = None) -> list[tm.Estimate]:
    phases = tm.schedule_phases(cfg, cluster.world)
    bes = tm.backends(cfg, driver)
    if cluster.hosts > 1:
        for row in tuned_rows(bes):
            rec = recommend_settings(cfg, phases, cluster, rates, prof, row)
            bes.append(
                tm.Backend(f"{row.label} (recommended: {rec.label()})", row.name, {**row.kwargs, "settings": rec})
            )
    inputs = tm.input_rate(cfg)
    return [tm.estimate(phases, cluster, rates, backend=be, prof=prof, inputs=inputs) for be in bes]


FLOW_ASSUMPTION = (
    "per-flow cap {cap}: an assumption (--flow-gbit), and it decides the ranking of the backends; measure yours with "
    "`python scripts/launch.py --hostfile hosts.txt -c CONFIG --probe-network` (make probe-network) and pass "
    "--network <run dir>/network.json"
)


def input_line(cfg, cluster: tm.Cluster, est: tm.Estimate) -> str:
    """What each phase's steps consume per GPU and host against what the input pipeline decodes (the input term)."""
    rate = tm.input_rate(cfg)
    if rate is None:
        return f"input: no term (data.backend={cfg.data.backend}: no measured decode rate on a GPU host)"
    g, parts = cluster.gpus_per_host, []
    for p in est.phases:
        step_s = sum(v for k, v in p.step_ms.items() if k != "input wait") / 1e3
        need, have = p.phase.batch / step_s, rate.images_per_s(p.phase.image_size)
        per_host = f"{g * need / 1e3:.0f}k of {g * have / 1e3:.0f}k per host"
        parts.append(f"{p.phase.image_size} px {need / 1e3:.1f}k of {have / 1e3:.1f}k ({per_host})")
    return (
        f"input: img/s per GPU the steps consume of what DALI decodes with data.workers={rate.threads_per_gpu} threads "
        f"({est.backend}): {'; '.join(parts)}; {rate.source}"
    )


def report(
    cfg,
    cluster: tm.Cluster,
    rates: tm.GpuRates,
    prof: tm.GradProfile,
    record_s: float | None,
    link_source: str = "",
    *,
    driver: str | None = None,
) -> tuple:
    ests = estimates(cfg, cluster, rates, prof, driver)
    cap = f"{cluster.flow_gbit:g} Gbit/s" if cluster.flow_gbit else "none"
    lines = [
        f"cluster: {cluster.hosts} hosts x {cluster.gpus_per_host} {rates.name}, link {cluster.link_gbit:g} Gbit/s "
        f"per host, per-flow cap {cap}, {cluster.flows_per_comm} flow(s) per communicator, goodput "
        f"{cluster.efficiency:.0%}",
        f"link figures: {link_source or 'given (--link-gbit, --flow-gbit, --latency-us)'}",
        *([] if link_source else [FLOW_ASSUMPTION.format(cap=cap)]),
        input_line(cfg, cluster, ests[0]),
        *driver_lines(cfg, driver),
        f"compute: {rates.source}",
        "step floor: "
        + (
            f"{rates.step_floor[1] * 1e3:.1f} ms ({rates.step_floor[0] * 1e3:.1f}-{rates.step_floor[2] * 1e3:.1f}): "
            f"{rates.floor_source or tm.FLOOR_WHY}"
            if rates.step_floor[1]
            else "none in this rate table (its smallest steps still shrink with the pixels)"
        ),
        f"intra-host: efficiency {rates.host_efficiency:.3f} ({rates.host_source})",
        f"gradients: {len(prof.specs)} tensors, {sum(s.nbytes for s in prof.specs) / 1e6:.1f} MB fp32; ready times "
        f"from the layers' FLOPs at {prof.image_size} px",
        "",
        "Per step (ms) and per phase (s); training clock = DAWNBench's (the TSV's hours), wall = + validation, BN "
        "allreduce, start-up.",
        "",
        "| backend | phase | px | batch/GPU | steps | compute ms | floor ms | intra-host ms | exposed comm ms | "
        "sync ms | rebuild+autotune s | validation+BN s | training s | wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in ests:
        for i, p in enumerate(e.phases):
            t = {x.name: x.mid for x in p.terms}
            lines.append(
                f"| {e.backend if i == 0 else ''} | {i + 1} | {p.phase.image_size} | {p.phase.batch} | "
                f"{p.phase.steps} | {p.step_ms['compute']:.1f} | {p.step_ms['step floor']:.1f} | "
                f"{p.step_ms['intra-host']:.1f} | "
                f"{p.step_ms['exposed comm']:.1f} | {p.step_ms['sync']:.1f} | "
                f"{t['pipeline rebuild'] + t['autotune']:.1f} | {t['validation'] + t['BN allreduce']:.1f} | "
                f"{p.total('train'):.1f} | {p.total('wall'):.1f} |"
            )
    vs = " training vs record (158 s, training clock) |" if record_s else ""
    lines += [
        "",
        "| backend | training clock s, low-mid-high | wall clock s, low-mid-high | widest term (wall) |" + vs,
        "|---|---:|---:|---|" + ("---:|" if record_s else ""),
    ]
    for e in ests:
        lo, mid, hi = e.range("train")
        wl, wm, wh = e.range("wall")
        name, width = e.widest("wall")
        cmp = f" {lo / record_s:.2f}-{hi / record_s:.2f}x |" if record_s else ""
        lines.append(
            f"| {e.backend} | {lo:.0f}-**{mid:.0f}**-{hi:.0f} | {wl:.0f}-**{wm:.0f}**-{wh:.0f} | {name} "
            f"(+-{width / 2:.0f} s) |{cmp}"
        )
    lines += ["", "Calibration (fitted, not predicted): the model on the published Alibaba runs, GPU v100-tf-xla.", ""]
    lines += tm.calibration_lines()
    return lines, ests


def link_figures(args):
    """The link as a link_figures.LinkFigures: --network's probe file, or the flags (source ""; a flag given next to
    --network is an error: the file is the measurement)."""
    from recipes.comm.link_figures import LinkFigures, load_link_figures

    if not args.network:
        link = 32.0 if args.link_gbit is None else args.link_gbit
        flow = 10.0 if args.flow_gbit is None else args.flow_gbit
        return LinkFigures(link, flow or None, 50.0 if args.latency_us is None else args.latency_us, "")
    from base.errors import ConfigError

    given = [f for f in ("link_gbit", "flow_gbit", "latency_us", "flow_spread") if getattr(args, f) is not None]
    if given:
        raise ConfigError(f"the probe file gives the link figures; drop --{given[0].replace('_', '-')}")
    return load_link_figures(args.network)


STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1, 1, 1)), "v"), ((0, (1, 3)), "x")]


def figure(cfg, cluster, rates, prof, max_hosts: int, driver: str | None = None):
    """The predicted training clock against hosts, one line per backend (each its own dash and marker, so a line
    under another still shows), the cluster asked about marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    hosts = sorted({h for h in (1, 2, 4, 8, 16, 32, 64) if h <= max_hosts} | {cluster.hosts})
    fig, ax = plt.subplots(figsize=(7, 4.5))
    inputs = tm.input_rate(cfg)
    for i, be in enumerate(tm.backends(cfg, driver)):
        ys = []
        for h in hosts:
            c = replace(cluster, hosts=h)
            est = tm.estimate(tm.schedule_phases(cfg, c.world), c, rates, backend=be, prof=prof, inputs=inputs)
            ys.append(est.range("train"))
        dash, marker = STYLES[i % len(STYLES)]
        ax.plot(hosts, [y[1] for y in ys], ls=dash, marker=marker, ms=4, mfc="none", label=be.label)
        ax.fill_between(hosts, [y[0] for y in ys], [y[2] for y in ys], alpha=0.08)
    ax.axvline(cluster.hosts, color="k", lw=0.8, ls=":", label=f"this cluster: {cluster.hosts} hosts")
    ax.set_xscale("log", base=2)
    ax.set_xticks(hosts, [str(h) for h in hosts])
    ax.set_yscale("log")
    # One set of tick labels, plain seconds: matplotlib labels minor ticks too when the range is under a decade.
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(f"hosts ({cluster.gpus_per_host} GPUs each)")
    ax.set_ylabel("predicted training clock, s (band: low-high)")
    ax.set_title(f"{cfg.run.name} on {rates.name}: {cluster.link_gbit:g} Gbit/s link")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot(cfg, cluster, rates, prof, max_hosts: int, driver: str | None = None) -> bytes:
    """figure() as PNG bytes."""
    import matplotlib.pyplot as plt

    fig = figure(cfg, cluster, rates, prof, max_hosts, driver)
    data = figure_bytes(fig, dpi=80)
    plt.close(fig)
    return data


def parser() -> OneLineParser:
    """The command line (tests read its numeric flags' bounds)."""
    ap = OneLineParser(prog="predict.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--config", default=str(ROOT / "configs" / "dawnbench_158s.yaml"))
    ap.add_argument("overrides", nargs="*", help="config overrides key=value (e.g. comm.compression=fp16)")
    ap.add_argument("--hosts", type=bounded_int(1, 4096), default=None, help="hosts (default: run.nodes of the config)")
    ap.add_argument(
        "--gpus-per-host", type=bounded_int(1, 64), default=None, help="GPUs per host (default: run.procs_per_node)"
    )
    ap.add_argument(
        "--gpu",
        default=None,
        choices=tm.gpu_names(),
        help=f"rate table (default: the config's run.gpu, else {DEFAULT_GPU})",
    )
    ap.add_argument(
        "--dtype", default=None, choices=tm.DTYPES, help="default: the config's run.amp (fp16 where it is none)"
    )
    ap.add_argument("--gpu-profile", default="", help="measured rates (make gpu-check) instead of --gpu's")
    ap.add_argument(
        "--link-gbit",
        type=bounded_float(0.001, 100_000),  # comm.link_gbit's domain: 1 Mbit/s is the slowest link a model ranks
        default=None,
        help="link per host and direction (Gbit/s; 32)",
    )
    ap.add_argument(
        "--flow-gbit",
        type=bounded_float(0.001, 100_000, zero=True),
        default=None,
        help="per-flow cap (Gbit/s; 0 = none; 10)",
    )
    ap.add_argument(
        "--flow-spread",
        type=bounded_float(0.01, 1),
        default=None,
        help="one connection per hop at this fraction of the others' rate: even striping against balancing (no file)",
    )
    ap.add_argument(
        "--network", default="", help="the link probe's figures (<run dir>/network.json of launch.py --probe-network)"
    )
    ap.add_argument(
        "--flows-per-comm", type=bounded_int(1, 64), default=1, help="TCP flows per communicator (NCCL sockets)"
    )
    ap.add_argument(
        "--latency-us",
        type=bounded_float(0, 1_000_000),
        default=None,
        help="per-message latency of one ring step (us; 50)",
    )
    ap.add_argument(
        "--intra-gbyte",
        type=bounded_float(0.1, 100_000),
        default=150.0,
        help="intra-host stage (GB/s; NVLink ~150, PCIe ~12)",
    )
    ap.add_argument(
        "--efficiency",
        type=bounded_float(0.01, 1),
        default=0.93,
        help="TCP goodput as a fraction of the caps",
    )
    ap.add_argument(
        "--profile-size", type=bounded_int(32, 4096), default=224, help="image size of the FLOP gradient-ready profile"
    )
    ap.add_argument(
        "--record-s", type=bounded_float(0, 10_000_000), default=RECORD_S, help="the record's training clock (0 = none)"
    )
    ap.add_argument("--json", default="", help="write per-backend, per-phase, per-term numbers to this file")
    ap.add_argument("--png", default="", help="plot the predicted training clock against hosts to this PNG")
    ap.add_argument("--max-hosts", type=bounded_int(1, 4096), default=64)
    ap.add_argument(
        "--driver",
        type=driver_version,
        help="the hosts' NVIDIA driver (nvidia-smi's, e.g. 535.183.01): older than R545, multistream's "
        "comm.concurrency=auto runs serialized on NCCL, and its row is predicted so",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from base.errors import ConfigError
    from recipes.config import load_config

    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:  # outputs checked before the computation, not after it
        for flag, path in (("--json", args.json), ("--png", args.png)):
            if path:
                check_target(path, flag)
    except RunDirError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    gpu, dtype, chosen = gpu_and_dtype(cfg, args.gpu, args.dtype)
    try:
        rates = tm.load_gpu_profile(args.gpu_profile) if args.gpu_profile else tm.published(gpu, dtype)
    except (tm.ProfileError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{chosen}; rates: {rates_label(gpu, dtype, args.gpu_profile)}\n")
    try:
        figures = link_figures(args)
    except ConfigError as e:
        print(f"error: --network: {e}", file=sys.stderr)
        return 2
    cluster = tm.Cluster(
        args.hosts or cfg.run.nodes,
        args.gpus_per_host or cfg.run.procs_per_node,
        figures.link_gbit,
        figures.flow_gbit,
        args.flows_per_comm,
        figures.latency_us * 1e-6,
        args.intra_gbyte,
        args.efficiency,
    )
    bad = [p for p in cfg.phases if p.batch_size % cluster.world]
    if bad:
        print(
            f"error: --hosts/--gpus-per-host: {cluster.hosts} x {cluster.gpus_per_host} = {cluster.world} processes "
            f"do not divide the global batch of {bad[0].batch_size}: choose a process count that does",
            file=sys.stderr,
        )
        return 2
    prof = tm.profile_model(cfg.model.name, args.profile_size)
    lines, ests = report(cfg, cluster, rates, prof, args.record_s or None, figures.source, driver=args.driver)
    lines += balance_lines(cfg, cluster, figures, args.flow_spread, sum(s.nbytes for s in prof.specs))
    try:
        if args.png:
            write_output(args.png, plot(cfg, cluster, rates, prof, args.max_hosts, args.driver), "--png")
            lines.append(f"\nplot: {args.png}")
        if args.json:
            doc = {"config": args.config, "link_figures": figures.source, "backends": [e.to_json() for e in ests]}
            write_output(args.json, to_json(doc), "--json")
            lines.append(f"\njson: {args.json}")
    except RunDirError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
