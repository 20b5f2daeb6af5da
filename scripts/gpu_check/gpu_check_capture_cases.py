"""The capture probe's cases (gpu_check_capture.py's docstring lists them, in order) and their thresholds: each
adds its rows for one question about the record's CUDA-graph step (recipes/steps.py GraphStep) on one device."""

from __future__ import annotations

import gc
import importlib.util
import time

from scripts.gpu_check.gpu_check_capture_probe import (
    BLOCKED,
    OPTIM_WARMUP,
    Blocked,
    NoComm,
    Probe,
    finite,
    group_weights,
    judge_groups,
    small_batches,
    small_cfg,
    small_runner,
    train,
)
from scripts.gpu_check.gpu_check_hier import case_hierarchy
from scripts.gpu_check.gpu_check_rows import guard, judged, row

PHASE_SIZES, PHASE_BATCH = (96, 128, 224, 288), 64  # the record's phase changes; a small batch keeps it quick
PHASE_REPLAYS = 2  # replays after each capture
CAPTURE_MAX_S = 60.0  # one capture (cuDNN's autotuning of the new shape is in the warm-up steps before it)
OPTIM_STEPS = 8  # OPTIM_WARMUP (gpu_check_capture_probe.py) eager, the capture, 5 replays
# Each parameter group against its own update (start -> StepRunner's weights): a frozen lr in LARS's adapted group
# moves its weights by 7.1e-5 over these steps, under an absolute 1e-4 over all parameters, but by far more than 1%
# of that group's own update. fp32, deterministic cuDNN: rounding of tensor vs float lr only.
OPTIM_REL = 0.01
PHASE_REL = 0.05  # graphed vs eager at each size, fp16 at batch 64: per group, against that group's own update
KERNELS_MIN = 0.9  # the graphed step launches at least this share of the eager step's kernels (the work is there)
WRAPPED_STEPS = 3
CHURN_STEPS, CHURN_MAX = 50, 1.1
DALI_STEPS, DELAY_CYCLES = 12, 20_000_000  # about 10-15 ms of device delay before each copy (1.4-2 GHz)
SPEEDUP_SIZES, SPEEDUP_BATCH = (96, 128), 256
SPEEDUP_MIN, WALL_PER_KERNEL_MAX = 1.6, 1.15
SMOKE = "smoke: CPU numbers say nothing about a GPU"
NEED_CUDA = "skip: capturing needs CUDA (the test runs it under a CPU stand-in)"


def speedup_problems(eager: dict, graphed: dict) -> list[str]:
    """Whether the graphed step did the eager step's work: at least KERNELS_MIN of its kernels per step (a partial
    capture launches fewer), both counted."""
    e, g = eager.get("kernels"), graphed.get("kernels")
    if not e or g is None:
        return [f"kernel counts missing (eager {e}, graphed {g})"]
    return [] if g >= KERNELS_MIN * e else [f"graphed launched {g} kernels per step, eager {e}: a partial capture"]


# --- a. the record's phase changes in one process -------------------------------------------------------------------
def case_phases(rows: list[dict], probe: Probe) -> None:
    from recipes.optim import set_lr_momentum
    from recipes.rundir.payload import State

    bench = probe.bench
    sizes, batch = ((8, 12, 16), 2) if probe.smoke else (PHASE_SIZES, PHASE_BATCH)
    path = " -> ".join(map(str, sizes))
    names = [f"capture phases: the record's step at {s} px ({batch}/GPU), one GraphStep over {path} px" for s in sizes]
    if not probe.capture:
        rows += [row(n, NEED_CUDA) for n in names]
        return
    ok, why = probe.decision(bench.cfg)
    runner = probe.track(bench.runner(graph=True))
    eager = probe.track(bench.runner(graph=False))  # the same step eager, from the same weights: the reference
    st, st_eager = State(), State()
    for size, name in zip(sizes, names, strict=True):
        with guard(rows, name):
            x, y = bench.batch(size, batch)
            eager.model.load_state_dict(runner.model.state_dict())
            eager.optimizer.load_state_dict(runner.optimizer.state_dict())
            eager.scaler.load_state_dict(runner.scaler.state_dict())
            start = group_weights(runner.optimizer)
            capture_s, replays = None, 0
            for i in range(runner.warmup + 1 + PHASE_REPLAYS):
                before = runner.graph if i else None  # the call at a new size drops the last size's graph
                set_lr_momentum(runner.optimizer, 0.1, 0.9)
                set_lr_momentum(eager.optimizer, 0.1, 0.9)
                t = time.perf_counter()
                runner(x, y, st, probe.log)
                probe.sync()
                if runner.graph is not None and before is None:
                    capture_s = time.perf_counter() - t
                elif runner.graph is not None and runner.graph is before:
                    replays += 1
                eager(x.clone(), y.clone(), st_eager, probe.log)
            runner.settle(st, probe.log)
            eager.settle(st_eager, probe.log)
            probe.sync()
            _, off = judge_groups(start, group_weights(eager.optimizer), group_weights(runner.optimizer), rel=PHASE_REL)
            problems = [] if ok else [f"graph_decision keeps it eager: {why}"]
            if not probe.smoke:  # at smoke sizes BatchNorm over 2 images is chaotic: eager and graphed part anyway
                problems += [f"graphed vs eager: {p}" for p in off]
            if capture_s is None:
                problems.append(f"not captured ({runner.said or 'no reason given'})")
            elif replays < PHASE_REPLAYS:
                problems.append(f"{replays} of {PHASE_REPLAYS} replays")
            if not finite(runner.model):
                problems.append("weights not finite")
            shown = f"{replays} replays after {runner.warmup} eager steps; {st.skipped_steps} skipped so far; "
            shown += (
                "vs eager: not judged at smoke sizes" if probe.smoke else f"vs eager: each group within {PHASE_REL}"
            )
            rows.append(
                judged(name, capture_s, "s to capture", at_most=CAPTURE_MAX_S, reference=shown, why="; ".join(problems))
            )


# --- b. every optimizer captured or refused as its record says ------------------------------------------------------
def case_optimizers(rows: list[dict], probe: Probe) -> None:
    from base import registry
    from base.errors import TrainingError

    torch = probe.torch
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False  # eager and replay: same kernels
    try:
        for name, rec in registry.OPTIMIZERS.items():
            says = "captured" if rec.capturable else "refused"
            label = f"capture optimizers: optim.name={name} {says} as its record says"
            with guard(rows, label):
                cfg = small_cfg(probe, f"optim.name={name}")
                ok, why = probe.decision(cfg)
                if not probe.capture and rec.capturable:
                    rows.append(row(label, NEED_CUDA))
                    continue
                problems = [] if ok == rec.capturable else [f"graph_decision says {'capture' if ok else why}"]
                if not rec.capturable:  # GraphStep refuses to capture it too, and the eager step trains
                    try:
                        small_runner(probe, cfg, graph=True, comm=NoComm(), capture=True)
                        problems.append("GraphStep(capture=True) accepted it")
                    except TrainingError as e:
                        refusal = str(e)
                    else:
                        refusal = ""
                    eager = small_runner(probe, cfg, graph=False, comm=NoComm())
                    steps = train(probe, eager, small_batches(probe, WRAPPED_STEPS))
                    if not finite(eager.model):
                        problems.append("the eager step's weights are not finite")
                    shown = f"graph_decision: {why}; GraphStep: {refusal}; {steps} eager steps"
                    rows.append(judged(label, 0, "captures", at_most=0, reference=shown, why="; ".join(problems)))
                    continue
                batches = small_batches(probe, OPTIM_STEPS)
                ref = small_runner(probe, cfg, graph=False, comm=NoComm())
                new = small_runner(probe, cfg, graph=True, comm=NoComm())
                start = group_weights(ref.optimizer)
                train(probe, ref, batches)
                train(probe, new, [(x.clone(), y.clone()) for x, y in batches])
                if new.graph is None:
                    problems.append(f"not captured ({new.said or 'no reason given'})")
                worst, bad = judge_groups(
                    start, group_weights(ref.optimizer), group_weights(new.optimizer), rel=OPTIM_REL
                )
                shown = f"after {OPTIM_STEPS} fp32 steps ({OPTIM_WARMUP} eager, the capture, replays) vs StepRunner"
                why = "; ".join(problems + bad)
                rows.append(
                    judged(label, worst, "x own update (worst group)", at_most=OPTIM_REL, reference=shown, why=why)
                )
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


# --- c. DDP and Horovod engaged on one rank --------------------------------------------------------------------------
def horovod_missing() -> str:
    """'' when horovod.torch imports; else why not."""
    try:
        import horovod.torch  # noqa: F401
    except ImportError as e:
        return f"horovod.torch does not import ({e}); `make horovod` builds it"
    return ""


def case_wrapped(rows: list[dict], probe: Probe) -> None:
    from base import registry
    from recipes.steps import GraphStep

    # every backend whose record refuses capture while it wraps the model
    refusing = [n for n, r in registry.ALLREDUCE_BACKENDS.items() if r.graph_refusal]
    for backend in refusing:
        label = f"capture wrapped: comm.backend={backend} engaged at world 1 stays eager"
        with guard(rows, label):
            own = registry.ALLREDUCE_BACKENDS[backend].launcher == "horovodrun"  # needs horovod.torch
            if own and (why := horovod_missing()):
                rows.append(row(label, f"skip: {why}"))
                continue
            cfg = small_cfg(probe, f"comm.backend={backend}", "comm.engage_single_rank=true", "optim.name=hybrid")
            ok, why = probe.decision(cfg)
            # what the trainer builds from that decision: GraphStep capturing, or StepRunner
            runner = small_runner(probe, cfg, graph=ok)
            steps = train(probe, runner, small_batches(probe, WRAPPED_STEPS))
            problems = ["graph_decision captures it"] if ok else []
            if isinstance(runner, GraphStep) and runner.graph is not None:
                problems.append("captured")
            if not finite(runner.model):
                problems.append("weights not finite")
            moved = runner.comm.stats().bytes
            if not moved:
                problems.append("the backend moved 0 bytes: not engaged")
            shown = f"graph_decision: {why or 'capture'}; {moved / 2**20:.2f} MB through {backend}"
            rows.append(
                judged(label, steps, "eager steps", at_least=WRAPPED_STEPS, reference=shown, why="; ".join(problems))
            )


# --- d. stream and allocator churn of eager GraphStep steps ----------------------------------------------------------
def _memory(probe: Probe, make, x, y, steps: int) -> dict:
    """Allocator retries and peak reserved MB over `steps` steps of the runner `make()` builds (None on the CPU)."""
    torch = probe.torch
    from recipes.optim import set_lr_momentum
    from recipes.rundir.payload import State

    gc.collect()
    if probe.cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    retries0 = torch.cuda.memory_stats().get("num_alloc_retries", 0) if probe.cuda else 0
    runner, st = make(), State()
    for i in range(steps):
        set_lr_momentum(runner.optimizer, 0.1, 0.9)
        runner(x, y, st, probe.log)
        if i % 10 == 9:
            runner.settle(st, probe.log)
    runner.settle(st, probe.log)
    probe.sync()
    out = {"steps": st.step, "eager": getattr(runner, "graph", None) is None, "said": getattr(runner, "said", None)}
    if probe.cuda:
        stats = torch.cuda.memory_stats()
        out["retries"] = stats.get("num_alloc_retries", 0) - retries0
        out["peak_mb"] = stats.get("reserved_bytes.all.peak", 0) / 2**20
    del runner
    gc.collect()
    return out


def case_churn(rows: list[dict], probe: Probe) -> None:
    bench = probe.bench
    steps = 3 if probe.smoke else CHURN_STEPS
    size, batch = (8, 2) if probe.smoke else (PHASE_SIZES[0], PHASE_BATCH)
    x, y = bench.batch(size, batch)

    def make(graph: bool):
        return lambda: probe.track(bench.runner(graph=graph, comm=Blocked() if graph else NoComm()))

    base = _memory(probe, make(False), x, y, steps)
    new = _memory(probe, make(True), x, y, steps)
    problems = []
    if not new["eager"]:
        problems.append("captured although the backend blocked capture")
    if probe.capture and new["said"] != BLOCKED:
        problems.append(f"GraphStep did not give the backend's reason ({new['said']})")
    if new["steps"] != steps or base["steps"] != steps:
        problems.append(f"ran {new['steps']} and {base['steps']} of {steps} steps")
    what = f"{steps} eager GraphStep steps (capture blocked) vs StepRunner at {size} px ({batch}/GPU)"
    for key, unit in (("retries", "allocator retries"), ("peak_mb", "MB peak reserved")):
        name = f"capture churn: {unit}, {what}"
        if not probe.cuda:
            skip = "skip: the CUDA caching allocator's counters need a GPU (the steps ran)"
            rows.append(row(name, f"fail: {'; '.join(problems)}" if problems else skip))
            continue
        limit = CHURN_MAX * base[key]
        shown = f"StepRunner {base[key]:,.1f}; at most {CHURN_MAX}x"
        rows.append(judged(name, new[key], unit, at_most=limit, reference=shown, why="; ".join(problems)))


# --- e. DALI's zero-copy batch, a device delay before the static copy -----------------------------------------------
def _noise_pipeline(probe: Probe, size: int, batch: int, prefetch: int):
    """A DALI pipeline as data/dali_loader.py builds them (pipelined, asynchronous, `prefetch` batches in flight),
    of random NHWC images, on the GPU (outputs in DALI's device buffers) or on the CPU."""
    from nvidia.dali import fn, pipeline_def, types

    gpu = probe.cuda

    def graph():
        images = fn.random.uniform(range=[-1.0, 1.0], shape=[size, size, 3], dtype=types.FLOAT)
        labels = fn.cast(fn.random.uniform(range=[0.0, 9.0], shape=[1]), dtype=types.INT64)
        return (images.gpu(), labels.gpu()) if gpu else (images, labels)

    pipe = pipeline_def(
        graph,
        batch_size=batch,
        num_threads=2,
        device_id=(probe.device.index or 0) if gpu else None,
        seed=11,
        prefetch_queue_depth=prefetch,
        exec_pipelined=True,
        exec_async=True,
    )()
    pipe.build()
    return pipe


def case_dali(rows: list[dict], probe: Probe) -> None:
    torch = probe.torch
    name = "capture dali: GraphStep's static copy of DALI's zero-copy batch after a device delay = DALI's host copy"
    if importlib.util.find_spec("nvidia") is None or importlib.util.find_spec("nvidia.dali") is None:
        rows.append(row(name, "skip: nvidia.dali does not import (requirements: DALI)"))
        return
    size, batch = (16, 8) if probe.smoke else (32, 32)
    prefetch = probe.bench.cfg.data.as_part("dali").dali_prefetch  # its config's, whichever pipeline it chose
    cfg = small_cfg(probe, "optim.name=hybrid")
    runner = small_runner(probe, cfg, graph=True, comm=NoComm())
    pipe = _noise_pipeline(probe, size, batch, prefetch)
    from recipes.optim import set_lr_momentum
    from recipes.rundir.payload import State

    st, hosts, seen = State(), [], []
    for _ in range(DALI_STEPS):
        images, labels = pipe.run()
        # the host copy, taken now (DALI's own copy, ordered on its stream): what the batch held when produced
        host = images.as_cpu().as_array() if probe.cuda else images.as_array()
        hosts.append(torch.from_numpy(host.copy()).permute(0, 3, 1, 2))
        if probe.cuda:
            with torch.cuda.device(probe.device):
                x, y = torch.from_dlpack(images.as_tensor()), torch.from_dlpack(labels.as_tensor())
            torch.cuda._sleep(DELAY_CYCLES)  # the device is late: the copy below runs after the host moved on
        else:
            x, y = torch.from_dlpack(images.as_tensor()), torch.from_dlpack(labels.as_tensor())
        x, y = x.permute(0, 3, 1, 2), y.reshape(-1).long()  # as data/dali_loader.py's _to_torch
        set_lr_momentum(runner.optimizer, 0.05, 0.9)
        runner(x, y, st, probe.log)
        seen.append(runner.static[0].clone())  # queued after the step: what its copy read
        del x, y
    runner.settle(st, probe.log)
    probe.sync()
    bad = sum(not torch.equal(s.cpu().float(), h.float()) for s, h in zip(seen, hosts, strict=True))
    delay = f"{DELAY_CYCLES:,} cycles of device delay before each copy" if probe.cuda else "cpu: no device delay"
    captured = "captured" if runner.graph is not None else f"eager ({runner.said or 'no capture on this device'})"
    shown = f"{DALI_STEPS} batches of {batch}x{size}px, prefetch {prefetch}, {delay}, "
    shown += f"host <= {runner.ahead} steps ahead, {captured}"
    why = "" if runner.graph is not None or not probe.capture else "the step was not captured"
    rows.append(judged(name, bad, "batches differ", at_most=0, reference=shown, why=why))
    del pipe


# --- f. graphed against eager, wall and kernel time -----------------------------------------------------------------
def case_speedup(rows: list[dict], probe: Probe) -> None:
    from scripts.gpu_check.gpu_check_speed import compare

    bench = probe.bench
    sizes, batch = ((8,), 2) if probe.smoke else (SPEEDUP_SIZES, SPEEDUP_BATCH)
    rounds, steps = (2, 1) if probe.smoke else (3, 12)
    for size in sizes:
        speed = f"capture speedup: graphed vs eager wall time at {size} px ({batch}/GPU)"
        ratio = f"capture speedup: graphed wall/kernel at {size} px ({batch}/GPU)"
        if not probe.capture:
            rows += [row(n, NEED_CUDA) for n in (speed, ratio)]
            continue
        with guard(rows, speed):
            variants = {
                "eager": lambda: probe.track(bench.runner(graph=False)),
                "graphed": lambda: probe.track(bench.runner(graph=True)),
            }
            res = compare(bench, variants, size=size, batch=batch, rounds=rounds, steps=steps, warmup=4)["variants"]
            errors = "; ".join(f"{k}: {v['error']}" for k, v in res.items() if "error" in v)
            if errors:
                rows += [row(speed, f"fail: {errors}"), row(ratio, f"fail: {errors}")]
                continue
            e, g = res["eager"], res["graphed"]
            up, wpk = g["speedup_vs_eager"], g["wall_per_kernel"]
            work = "; ".join(speedup_problems(e, g))
            shown = f"eager {e['wall_ms']:.2f} ms, graphed {g['wall_ms']:.2f} ms per step (median of {rounds} rounds)"
            kern = "no kernel timing" if g["kernel_ms"] is None else f"{g['kernel_ms']:.2f} ms, {g['kernels']} kernels"
            eager_wpk = "-" if e["wall_per_kernel"] is None else f"{e['wall_per_kernel']:.2f}"
            kshown = f"graphed kernel {kern} per step; eager wall/kernel {eager_wpk}"
            if probe.smoke:
                rows += [row(speed, f"n/a: {SMOKE}", up, "x eager", reference=shown)]
                rows += [row(ratio, f"n/a: {SMOKE}", wpk, "wall/kernel", reference=kshown)]
                continue
            kshown += f"; eager {e['kernels']} kernels per step"
            rows.append(judged(speed, up, "x eager", at_least=SPEEDUP_MIN, reference=shown, why=work))
            rows.append(judged(ratio, wpk, "wall/kernel", at_most=WALL_PER_KERNEL_MAX, reference=kshown, why=work))


# --- g. the open questions, answered on this build ---------------------------------------------------------------
QUESTION_STEPS = 20


def case_questions(rows: list[dict], probe: Probe) -> None:
    torch = probe.torch
    names = {
        "pool": "capture questions: a second capture into a dropped graph's pool (pool=the old handle)",
        "lars": f"capture questions: hybrid LARS step, float vs tensor lr/momentum ({QUESTION_STEPS} steps)",
        "memory": "capture questions: reserved GiB after a capture at 96 px, and after an evaluation pass",
    }
    if not probe.cuda:
        rows += [row(n, NEED_CUDA) for n in names.values()]
        return
    from recipes.optim import set_lr_momentum
    from recipes.rundir.payload import State

    bench = probe.bench
    with guard(rows, names["pool"]):  # the allocator's `use_count > 0` assert on torch 2.11 (gpu-capture-review 1.1)
        x = torch.randn(64, 64, device=probe.device)
        w = torch.randn(64, 64, device=probe.device)
        pool = torch.cuda.graph_pool_handle()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            y = x @ w
        del g, y
        try:
            g2 = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g2, pool=pool):
                y = x @ w
            g2.replay()
            answer = "accepted: this build reuses the pool (a fresh pool per capture stays the rule)"
        except RuntimeError as e:
            answer = f"refused: {str(e).splitlines()[0][:160]}"
        rows.append(row(names["pool"], f"n/a: {answer}"))
    with guard(rows, names["lars"]):
        times = {}
        for kind in ("float", "tensor"):
            runner = probe.track(bench.runner(graph=False))
            opt = runner.optimizer
            for p in runner.model.parameters():
                p.grad = torch.randn_like(p) * 1e-3
            hp = [
                {k: torch.tensor(g[k], device=probe.device) for k in ("lr", "momentum") if k in g}
                for g in opt.param_groups
            ]
            for i in range(QUESTION_STEPS + 3):  # 3 warm-up steps make the momentum buffers and workspaces
                if i == 3:
                    probe.sync()
                    t = time.perf_counter()
                set_lr_momentum(opt, 0.1, 0.9)
                if kind == "tensor":
                    for g, h in zip(opt.param_groups, hp, strict=True):
                        g.update(h)
                opt.step()
            probe.sync()
            times[kind] = (time.perf_counter() - t) / QUESTION_STEPS * 1000
            del runner
        shown = f"float {times['float']:.3f} ms, tensor {times['tensor']:.3f} ms per optimizer step"
        rows.append(row(names["lars"], f"n/a: {shown}", times["tensor"] / times["float"], "x float", reference=shown))
    with guard(rows, names["memory"]):
        from recipes import memory

        gc.collect()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_reserved() / 2**30
        runner, st = probe.track(bench.runner(graph=True)), State()
        x, y = bench.batch(PHASE_SIZES[0], PHASE_BATCH)
        for _ in range(runner.warmup + 2):
            set_lr_momentum(runner.optimizer, 0.1, 0.9)
            runner(x, y, st, probe.log)
        runner.settle(st, probe.log)
        probe.sync()
        captured = torch.cuda.memory_reserved() / 2**30
        runner.model.eval()
        with torch.no_grad(), runner.amp_ctx():
            runner.model(x)
        probe.sync()
        after_eval = torch.cuda.memory_reserved() / 2**30
        runner.model.train()
        est = memory.need(
            bench.cfg.model.name, image_size=PHASE_SIZES[0], micro_batch=PHASE_BATCH, per_gpu_batch=PHASE_BATCH,
            amp=bench.amp, captured=True,
        )  # fmt: skip
        shown = f"before {base:.2f}, after the capture {captured:.2f}, after eval {after_eval:.2f} GiB reserved; "
        shown += f"estimated step {est.total / 2**30:.2f} GiB (graph pool {est.graph_pool / 2**30:.2f})"
        graph = "captured" if runner.graph is not None else f"eager ({runner.said})"
        rows.append(row(names["memory"], f"n/a: {graph}; {shown}", after_eval - base, "GiB", reference=shown))


CHECKS = {
    "phases": case_phases,
    "optimizers": case_optimizers,
    "wrapped": case_wrapped,
    "churn": case_churn,
    "dali": case_dali,
    "speedup": case_speedup,
    "questions": case_questions,
    "hierarchy": case_hierarchy,  # comm.hierarchy=host's GPU-only part: scripts/gpu_check/gpu_check_hier.py
}
