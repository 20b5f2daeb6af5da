"""The `speed` part of gpu_check.py: the record's own training step, eager against one CUDA graph (docs/gpu.md).

The step is built from configs/dawnbench_158s.yaml's settings with the project's own parts: its model, hybrid LARS
with `tf` momentum, fp16 GradScaler, channels_last, and the multistream engine engaged on a one-rank group, run by
recipes/steps.py's StepRunner (eager) or GraphStep (`run.cuda_graph`), on prebuilt device batches (no input
pipeline). Every variant has its own model copy. In paired rounds with the order rotated each round, per step: wall
ms, GPU kernel ms and kernels launched (torch.profiler), and wall/kernel (1.0: the GPU never waits for the host).

    python -m scripts.gpu_check.gpu_check_speed --out gpu_speed.json          # one GPU, a few minutes
    python -m scripts.gpu_check.gpu_check_speed --smoke --out speed.json     # CPU: the same code, tiny

Parts, each written to the JSON as soon as it is done (a timeout still leaves the parts before it):
  graph       eager vs graphed at 96/128/224/288 px, the record's per-GPU batch (256, 128 at 288 px)
  multistream eager step at 96 px with the multistream engine engaged vs no allreduce backend
  batch       graphed step at 96 px, per-GPU batch 256 vs 512 (images/s)
A failing variant is written as its error and the run moves on.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

# Started as a file, Python puts only scripts/gpu_check/ on the path: the repository goes first, so the imports
# below (the repository's packages) resolve as they do under `python -m`.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.gpu_check.gpu_check_timing import median_ms, seconds_per_call

SIZES = (96, 128, 224, 288)
BATCH = {96: 256, 128: 256, 224: 256, 288: 128}  # the record's global batch over its 128 GPUs
ROUNDS, STEPS = 3, 12  # paired rounds per comparison, timed steps per round


class Bench:
    """The record's step on one device, with a one-rank process group for the multistream engine."""

    def __init__(self, device: str, smoke: bool, *, config: str = "configs/dawnbench_158s.yaml", capture=None):
        """`config`: the record config whose step is built; `capture`: whether GraphStep captures (default: on
        CUDA; True on the CPU only under a stand-in for torch.cuda's graph API, as the capture part's test runs)."""
        import torch
        import torch.distributed as td

        from recipes.config import load_config
        from recipes.distributed import DistInfo

        self.torch, self.smoke = torch, smoke
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        self.capture = cuda if capture is None else capture
        torch.backends.cudnn.benchmark = cuda  # as the trainer sets it (recipes/distributed.py)
        os.environ.setdefault("NCCL_LAUNCH_ORDER_IMPLICIT", "1")  # multistream's overlap rule (recipes/comm)
        self.owns_group = not td.is_initialized()
        if self.owns_group:
            port = 29500 + os.getpid() % 2000
            td.init_process_group(
                "nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
            )
        self.dist = DistInfo(0, 1, 0, 1, self.device)
        self.cfg = load_config(
            config,
            [f"run.device={device}", "comm.autotune=false", "comm.engage_single_rank=true", "run.amp=fp16"],
        )
        self.amp = "fp16" if cuda else "none"  # CPU: fp16 convolutions are reference kernels, minutes per step
        self.base = self._model()

    def close(self) -> None:
        """Destroy the one-rank process group this bench made, waiting for gloo's workers (recipes.distributed)."""
        if self.owns_group:
            from recipes.distributed import teardown

            teardown()

    def _model(self):
        torch = self.torch
        torch.manual_seed(0)
        if self.smoke:
            import timm

            model = timm.create_model("resnet50", num_classes=10, channels=(8, 16, 32, 64), stem_width=8, base_width=8)
        else:
            from models import create_model

            model = create_model(self.cfg.model, 1000)
        return model.to(self.device).to(memory_format=torch.channels_last)

    def runner(self, *, graph: bool, bare: bool = False, comm=None):
        """A fresh model copy, optimizer and step runner (GraphStep with capture on CUDA, or StepRunner): the config's
        backend engaged on the one-rank group, or with `bare` no allreduce wrapper (load_ddp), or `comm`, a stand-in
        backend object (gpu_check_capture_probe's)."""
        torch = self.torch
        from recipes.comm import create_allreduce
        from recipes.optim import create_optimizer
        from recipes.step_builder import build_step

        cfg = self.cfg
        model = copy.deepcopy(self.base)
        opt = create_optimizer(cfg.optim, model)
        named = {"backend": "stand-in"}  # a stand-in is no registered backend: the step's messages say so
        if comm is None:
            comm_cfg = load_ddp(cfg) if bare else cfg.comm
            comm = create_allreduce(comm_cfg, self.dist, timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name)
            named["backend"] = comm_cfg.backend
        train_model, opt = comm.prepare(model, opt)
        scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp == "fp16")
        parts = dict(model=model, train_model=train_model, optimizer=opt, comm=comm, scaler=scaler, device=self.device)
        return build_step(cfg, **parts, graph=graph, capture=graph and self.capture, amp=self.amp, **named)

    def batch(self, size: int, batch: int):
        torch = self.torch
        g = torch.Generator(device="cpu").manual_seed(size)
        x = torch.randn(batch, 3, size, size, generator=g).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 10 if self.smoke else 1000, (batch,), generator=g)
        dtype = torch.float16 if self.amp == "fp16" else torch.float32
        return x.to(self.device, dtype), y.to(self.device)

    def _sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def steps(self, runner, st, x, y, n: int) -> float:
        """Seconds per step over n steps, the trainer's lr/momentum set too (gpu_check_timing: CUDA events around
        them, the host clock on the CPU)."""
        from recipes.optim import set_lr_momentum

        def step():
            set_lr_momentum(runner.optimizer, 0.1, 0.9)
            runner(x, y, st)

        dt = seconds_per_call(step, n, device=self.device)
        runner.settle(st, _Quiet())
        return dt

    def kernels(self, runner, st, x, y, n: int = 3) -> tuple[float | None, int | None]:
        """(GPU kernel ms per step, kernels launched per step) from torch.profiler; (None, None) on CPU."""
        torch = self.torch
        if self.device.type != "cuda":
            return None, None
        from torch.profiler import ProfilerActivity, profile

        self._sync()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                runner(x, y, st)
            self._sync()
        runner.settle(st, _Quiet())
        events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        us = sum(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total for e in events)
        return us / 1000.0 / n, round(len(events) / n)


def load_ddp(cfg):
    """The same config with no allreduce wrapper (ddp at world size 1 wraps nothing)."""
    import dataclasses

    return dataclasses.replace(cfg.comm, backend="ddp", engage_single_rank=False)


class _Quiet:
    def warn(self, msg):
        print(f"speed: {msg}", file=sys.stderr)

    def info(self, msg):
        print(f"speed: {msg}", file=sys.stderr)


def compare(bench: Bench, variants: dict, *, size: int, batch: int, rounds: int, steps: int, warmup: int = 4) -> dict:
    """Paired rounds over `variants` (name -> runner factory), order rotated each round; per variant: wall ms per
    step (median, range), kernel ms and kernels per step, wall/kernel, images/s; and each one's ratio to the first."""
    from recipes.rundir.payload import State

    x, y = bench.batch(size, batch)
    names = list(variants)
    out: dict = {"image_size": size, "batch": batch, "rounds": rounds, "steps": steps, "variants": {}}
    runners, states = {}, {}
    for name in names:
        try:
            runners[name], states[name] = variants[name](), State()
            bench.steps(runners[name], states[name], x, y, warmup)  # GraphStep: 3 eager steps, then the capture
        except Exception as e:  # noqa: BLE001 - a failing variant is a result; the others still run
            out["variants"][name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc(limit=4)}
    live = [n for n in names if n in runners]
    walls: dict = {n: [] for n in live}
    for r in range(rounds):
        order = live[r % len(live) :] + live[: r % len(live)] if live else []
        for name in order:
            walls[name].append(bench.steps(runners[name], states[name], x, y, steps))
    for name in live:
        wall = median_ms(walls[name])
        kernel_ms, launched = bench.kernels(runners[name], states[name], x, y)
        out["variants"][name] = {
            "wall_ms": wall,
            "wall_ms_range": [min(walls[name]) * 1000, max(walls[name]) * 1000],
            "kernel_ms": kernel_ms,
            "kernels": launched,
            "wall_per_kernel": wall / kernel_ms if kernel_ms else None,
            "images_per_s": batch / wall * 1000,
        }
    first = live[0] if live else None
    for name in live[1:]:
        pairs = [a / b for a, b in zip(walls[first], walls[name], strict=True)]
        out["variants"][name][f"speedup_vs_{first}"] = statistics.median(pairs)
    return out


def run(out: Path, *, device: str, smoke: bool, parts: list[str]) -> dict:
    import torch

    from base.writer import write_output

    bench = Bench(device, smoke)
    sizes = (8,) if smoke else SIZES
    batch = {8: 2} if smoke else BATCH
    small = sizes[0]
    rounds, steps = (2, 1) if smoke else (ROUNDS, STEPS)
    warm = {"warmup": 1 if smoke else 4}
    report = {
        "device": torch.cuda.get_device_name(0) if bench.device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "smoke": smoke,
        "step": "record: resnet50, hybrid LARS tf, channels_last, "
        + ("fp16 GradScaler" if bench.amp == "fp16" else "fp32 (CPU)")
        + ", multistream engaged on one rank",
        "parts": {},
    }

    def write():
        write_output(out, json.dumps(report, indent=2) + "\n", "the speed report")

    def part(name, fn):
        t = time.perf_counter()
        try:
            report["parts"][name] = fn()
        except Exception as e:  # noqa: BLE001 - the JSON keeps what ran; the next part still runs
            report["parts"][name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc(limit=6)}
        report["parts"][name]["seconds"] = time.perf_counter() - t
        write()
        print(f"speed: part {name} done in {time.perf_counter() - t:.0f} s", file=sys.stderr)

    eager = lambda: bench.runner(graph=False)  # noqa: E731
    graphed = lambda: bench.runner(graph=True)  # noqa: E731
    if "graph" in parts:
        part(
            "graph",
            lambda: {
                str(s): compare(
                    bench,
                    {"eager": eager, "graphed": graphed},
                    size=s,
                    batch=batch[s],
                    rounds=rounds,
                    steps=steps,
                    **warm,
                )
                for s in sizes
            },
        )
    if "multistream" in parts:
        bare = lambda: bench.runner(graph=False, bare=True)  # noqa: E731
        part(
            "multistream",
            lambda: compare(
                bench,
                {"no_backend": bare, "multistream": eager},
                size=small,
                batch=batch[small],
                rounds=rounds,
                steps=steps,
                **warm,
            ),
        )
    if "batch" in parts:
        part(
            "batch",
            lambda: {
                str(b): compare(bench, {"graphed": graphed}, size=small, batch=b, rounds=rounds, steps=steps, **warm)
                for b in ((2, 4) if smoke else (256, 512))
            },
        )
    write()
    bench.close()
    return report


def table(report: dict) -> str:
    """Markdown rows: part, size, batch, variant, wall ms, kernel ms, kernels, wall/kernel, img/s, ratio."""
    lines = ["| part | px | batch | variant | wall ms | kernel ms | kernels | wall/kernel | img/s | ratio |"]
    lines.append("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|")

    def fmt(v, f="{:.1f}"):
        return "-" if v is None else f.format(v)

    for pname, part in report["parts"].items():
        groups = [part] if "variants" in part else [v for v in part.values() if isinstance(v, dict)]
        for g in groups:
            if "variants" not in g:
                lines.append(f"| {pname} | | | error | {g.get('error', '')} | | | | | |")
                continue
            for name, v in g["variants"].items():
                if "error" in v:
                    lines.append(f"| {pname} | {g['image_size']} | {g['batch']} | {name} | {v['error']} | | | | | |")
                    continue
                ratio = next((val for key, val in v.items() if key.startswith("speedup_vs_")), None)
                lines.append(
                    f"| {pname} | {g['image_size']} | {g['batch']} | {name} | {fmt(v['wall_ms'])} | "
                    f"{fmt(v['kernel_ms'])} | {fmt(v['kernels'], '{}')} | {fmt(v['wall_per_kernel'], '{:.2f}')} | "
                    f"{fmt(v['images_per_s'], '{:.0f}')} | {fmt(ratio, '{:.2f}')} |"
                )
    return "\n".join(lines)


def check_speed(rows: list[dict], out: Path) -> None:
    """gpu_check.py's `speed` part: the JSON beside its --out, and one row per part saying where it is."""
    from scripts.gpu_check.gpu_check_rows import row

    report = run(out, device="cuda", smoke=False, parts=["graph", "multistream", "batch"])
    print(table(report))
    for name, part in report["parts"].items():
        bad = "error" in part or any("error" in v for v in part.values() if isinstance(v, dict))
        rows.append(row(f"speed: {name}", "fail: see " + str(out) if bad else "ok", reference=str(out)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_speed.json", help="the JSON, rewritten after every part")
    ap.add_argument("--smoke", action="store_true", help="CPU, a narrow resnet50 at 8 px: the same code, tiny")
    ap.add_argument("--parts", nargs="+", choices=["graph", "multistream", "batch"], default=None)
    args = ap.parse_args(argv)
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("gpu-check speed: no CUDA GPU present (--smoke runs the same code on CPU)")
        return 0
    report = run(
        Path(args.out),
        device="cpu" if args.smoke else "cuda",
        smoke=args.smoke,
        parts=args.parts or ["graph", "multistream", "batch"],
    )
    print(table(report))
    bad = [n for n, p in report["parts"].items() if "error" in p]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
