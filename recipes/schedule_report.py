"""`train.py --plan`: the phase table, iteration count and a PNG of the schedules, without reading images."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from base import registry
from base.writer import write_output
from recipes import memory
from recipes.rundir.writer import figure_bytes
from recipes.schedule import Schedule
from recipes.steps import describe_graph_decisions, phase_graph_decisions
from recipes.timemodel import IMAGENET_TRAIN_IMAGES, predicted_estimate


def count_images(cfg) -> int | None:
    from data.folder import scan_split

    if not registry.INPUT_PIPELINES[cfg.data.backend].reads_folders:  # it makes its own images
        return cfg.data.synthetic_size
    if not (Path(cfg.data.root) / "train").is_dir():
        return None
    return len(scan_split(cfg.data.root, "train"))


def allreduce_lines(cfg, world: int, phases: int) -> list[str]:
    """Which allreduce every phase runs and why (the comm section holds for the whole run): the backend, the process
    group it runs on, and for multistream its balancing; a setting the engine would refuse at start-up is said so."""
    from recipes.comm import flowrates

    c = cfg.comm
    device = "cpu" if cfg.run.device == "cpu" else "cuda"
    on = cfg.dist.backend if cfg.dist.backend != "auto" else ("nccl" if device == "cuda" else "gloo")
    hosts, local = cfg.run.nodes, max(1, world // max(1, cfg.run.nodes))
    if c.backend != "multistream":
        what = f"comm.backend={c.backend} on {on}"
    else:
        balance, level, hier = bool(c.balance), c.balance_level, c.hierarchy
        why = flowrates.refusal(balance=balance, level=level, hierarchy=hier, transport=on)
        if why is not None:
            return [f"allreduce, every phase: refused at start-up: {why}"]
        if balance and level == "hop" and hier == "host":
            what = (
                f"the hierarchical ring (comm.hierarchy=host): a reduce-scatter and an all-gather on {on} inside each "
                f"of {hosts} hosts ({local} ranks), between them a hop-balanced gloo ring per local rank of {hosts} "
                f"members on pinned host copies, comm.streams={c.streams} connections per hop cut by what each "
                "delivers (recipes/comm/hierarchy.py)"
            )
        elif balance and level == "hop":
            what = f"the hop-balanced ring over all {world} ranks on gloo (comm.balance_level=hop)"
        else:
            how = "balanced per communicator (comm.balance=true)" if balance else "even striping (comm.balance=false)"
            what = f"multistream over comm.streams={c.streams} {on} communicators, {how}"
    why = (
        "; where the link probe finds uneven flows on multi-GPU hosts, "
        "OVERRIDES='comm.balance=true comm.balance_level=hop comm.hierarchy=host' (docs/allreduce.md)"
        if c.backend == "multistream" and on == "nccl" and not getattr(c, "balance", False)
        else ""
    )
    return [f"allreduce, all {phases} phases: {what}{why}"]


def plan_title(plan: Schedule, gpu: str | None, amp: str) -> str:
    """The plot's title: the plan's size, and what it was planned for (GPU, dtype, accumulation per phase)."""
    micro = {e.phase_index: (e.micro_batches, plan.micro_batch(e.epoch)) for e in plan.epochs}
    accum = ", ".join(f"{a} x {m}" for a, m in micro.values())
    return (
        f"{plan.total_steps} iterations in {len(plan.epochs)} epochs, {plan.world_size} processes\n"
        f"GPU: {gpu or 'none named (run.gpu / --gpu)'}, dtype: {amp if amp != 'none' else 'fp32'}, "
        f"micro-batches x images per GPU by phase: {accum}"
    )


def plot_plan(plan: Schedule, title: str = "") -> bytes:
    """LR, momentum, image size and batch size against the step, as PNG bytes (`title`: plan_title's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # The schedules are piecewise linear between epoch boundaries: those and 2,000 evenly spaced steps draw them
    # exactly, whatever the plan's length (a plan of 10^13 steps must not take 10^13 evaluations).
    bounds = {e.first_step for e in plan.epochs} | {plan.last_step, int(plan.warmup_steps())}
    steps = sorted(bounds | {int(s) for s in np.linspace(0, plan.last_step, 2000)})
    series = [
        ("learning rate", plan.lr),
        *([("momentum", plan.momentum)] if plan.reads_momentum else []),
        ("image size (px)", plan.image_size),
        ("global batch", plan.batch_size),
    ]
    fig, axes = plt.subplots(len(series), 1, figsize=(8, 8), sharex=True)
    for ax, (name, fn) in zip(axes, series, strict=True):
        ax.plot(steps, [fn(s) for s in steps])
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        for e in plan.epochs:
            if e.epoch and e.phase_index != plan.epochs[e.epoch - 1].phase_index:
                ax.axvline(e.first_step, color="grey", lw=0.8, ls="--")
    axes[-1].set_xlabel("iteration")
    fig.suptitle(title or f"{plan.total_steps} iterations in {len(plan.epochs)} epochs", fontsize=10)
    fig.tight_layout()
    data = figure_bytes(fig, dpi=90)
    plt.close(fig)
    return data


def hardware_table(cfg, plan: Schedule, gpu: str) -> tuple[list[str], list[str]]:
    """(lines, problems): per phase the global batch, per-GPU batch, accumulation and memory against `gpu`'s."""
    from recipes import memory

    gpu_bytes = memory.gpu_memory_bytes(gpu)
    lines = [f"per GPU on {gpu} ({gpu_bytes / memory.GIB:.0f} GiB, {memory.USABLE:.0%} usable), run.amp={cfg.run.amp}:"]
    lines.append("phase   size  global batch  per GPU  accumulation  micro-batch  memory (est.)")
    for pi in range(len(cfg.phases)):
        e = next(e for e in plan.epochs if e.phase_index == pi)
        per_gpu, micro = e.phase.batch_size // plan.world_size, plan.micro_batch(e.epoch)
        n = memory.need(
            cfg.model.name, image_size=e.phase.image_size, micro_batch=micro, per_gpu_batch=per_gpu, amp=cfg.run.amp
        )
        lines.append(
            f"{pi:>5}  {e.phase.image_size:>5}  {e.phase.batch_size:>12}  {per_gpu:>7}  {e.micro_batches:>12}  "
            f"{micro:>11}  {n.total / memory.GIB:>5.1f} GiB"
        )
    return lines, memory.check_fits(cfg, plan, gpu_bytes, gpu)


def step_table(est) -> list[str]:
    """The time model's step per phase: its micro-batches, and the step floor counted once for each."""
    lines = ["time model per step (the step floor once per micro-batch):"]
    lines.append("phase   size  micro-batches     compute  step floor  step (all terms)")
    for pi, p in enumerate(est.phases):
        ms = p.step_ms
        lines.append(
            f"{pi:>5}  {p.phase.image_size:>5}  {p.phase.micro_batches:>13}  {ms['compute']:>7.1f} ms  "
            f"{ms['step floor']:>7.1f} ms  {sum(ms.values()):>13.1f} ms"
        )
    return lines


def startup_lines(cfg) -> list[str]:
    """The checks a run makes before its first step (the entry's fields, the dataset, the blacklist, the
    pre-resized copies), each that fails as the line that would stop it: a run stops at the first, the plan lists
    every one."""
    from data import missing_inputs
    from recipes.dawnbench import required_problem

    stops = [p for p in (required_problem(cfg),) if p] + missing_inputs(cfg.data, cfg.phases)
    if not stops:
        return ["start-up checks: none would stop this run here (dawnbench fields, data.root, blacklist, copies)"]
    head = f"start-up checks: {len(stops)} would stop this run here (train.py stops at the first, exit 2):"
    return [head, *(f"  {line}" for line in stops)]


def print_plan(
    cfg, num_images: int | None, world_size: int | None, png: str | None = None, gpu: str | None = None
) -> int:
    source = "--num-images"
    if num_images is None:
        num_images = count_images(cfg)
        folder = cfg.data.get("root")  # None: the synthetic input reads no folder
        source = f"counted in {folder}" if folder is not None else "data.synthetic_size"
    if num_images is None:
        num_images, source = IMAGENET_TRAIN_IMAGES, "ImageNet-1k (data.root not found)"
    world = world_size or cfg.run.nodes * cfg.run.procs_per_node
    where = "--world-size" if world_size else f"run.nodes {cfg.run.nodes} x run.procs_per_node {cfg.run.procs_per_node}"
    plan = Schedule(cfg.phases, cfg.optim, num_images=num_images, world_size=world, **memory.accumulation(cfg))
    print(f"{num_images:,} training images ({source}), {world} processes ({where})")
    print(plan.table())
    # the CUDA-graph step per phase, on the device the config trains on (a GPU unless run.device=cpu)
    device = "cpu" if cfg.run.device == "cpu" else "cuda"
    decisions = phase_graph_decisions(
        cfg.run,
        cfg.comm,
        optim=cfg.optim.name,
        micro_batches=plan.phase_micro_batches(),
        device_type=device,
        world_size=world,
        dali=cfg.data.backend == "dali",
    )
    print("\n".join(describe_graph_decisions(cfg.run.cuda_graph, cfg.phases, decisions)))
    print("\n".join(allreduce_lines(cfg, world, len(cfg.phases))))
    if device == "cuda" and cfg.comm.backend == "multistream":  # NCCL: what the driver decides (read at start-up)
        from recipes.comm.concurrency import driver_conditions

        print("\n".join(driver_conditions()))
    out = Path(png) if png else Path(cfg.run.out_dir) / f"{cfg.run.name}_plan.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    # never through a planted link, never half-written
    write_output(out, plot_plan(plan, plan_title(plan, gpu, cfg.run.amp)), "the plan's plot")
    print(f"plot: {out}")
    print("\n".join(startup_lines(cfg)))
    if gpu is None:
        return 0
    lines, problems = hardware_table(cfg, plan, gpu)
    print("\n".join(lines))
    est, what = predicted_estimate(cfg, world, gpu)
    if est is None:
        print(f"predicted time: none ({what})")
    else:
        low, mid, high = est.range("train")
        print(f"predicted training clock: {mid:,.0f} s ({low:,.0f}-{high:,.0f}) on {what} (recipes/timemodel/)")
        print("\n".join(step_table(est)))
    for line in problems:
        print(f"error: does not fit: {line}", file=sys.stderr)
    return 2 if problems else 0
