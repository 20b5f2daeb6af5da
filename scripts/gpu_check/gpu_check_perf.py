#!/usr/bin/env python
"""Where the GPU is the limit (docs/gpu.md): kernel time by class (convolution, BatchNorm, elementwise, optimizer)
for resnet50d and resnet50, bf16 against fp16 with BatchNorm's share of the difference, torch.compile against eager
with cold and warm compile seconds, and DALI inside the timed training loop against prebuilt batches.

    python -m scripts.gpu_check.gpu_check_perf --out perf.json                     # all parts, one GPU, ~6 min
    python -m scripts.gpu_check.gpu_check_perf --parts kernels dali_loop --out perf.json
    python -m scripts.gpu_check.gpu_check_perf --smoke --out perf.json             # CPU, tiny sizes (the tests)

The JSON (rows as gpu_check writes them, plus each part's raw numbers) is rewritten after every part, so a run cut
off by a time limit still returns what it measured. On the GPU the rows are judged against the anchors in docs/gpu.md;
in --smoke mode they are reported, not judged (CPU numbers say nothing about a GPU).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# Started as a file, Python puts only scripts/gpu_check/ on the path: the repository goes first, so the imports
# below (the repository's packages) resolve as they do under `python -m`.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from base.writer import encoded, write_output
from scripts.gpu_check.gpu_check_rows import guard, judged, markdown_table, row
from scripts.gpu_check.gpu_check_timing import median_ms, time_calls

ROOT = Path(__file__).resolve().parents[2]
PARTS = ["kernels", "compile", "dali_loop"]
# Kernel (CUDA) or aten op (CPU) names to classes; first match wins, so cuDNN's BatchNorm kernels are BatchNorm.
CLASSES = [
    ("batchnorm", r"batch_?norm|bn_fw|bn_bw|bn_bwd|welford"),
    ("optimizer", r"foreach|fused_sgd|multi_tensor|sgd|adam|lars"),
    ("convolution", r"conv|gemm|xmma|cutlass|cudnn|wgrad|dgrad|implicit|\bmm\b|addmm"),
    ("elementwise", r"elementwise|vectorized|unrolled|reduce|copy|add|mul|relu|threshold|cast|fill|softmax|nll"),
    ("elementwise", r"pool|mean|sum|div|where|clamp|triton|neg|exp|log|sub|index|cat|scatter|gather"),
]


def kernel_class(name: str) -> str:
    low = name.lower()
    return next((cls for cls, pat in CLASSES if re.search(pat, low)), "other")


def _sizes(smoke: bool) -> dict:
    if smoke:
        return {"device": "cpu", "models": ("test_resnet", "resnet10t"), "size": 32, "batch": 2, "steps": 1}
    return {"device": "cuda", "models": ("resnet50d", "resnet50"), "size": 224, "batch": 256, "steps": 20}


def _step_fn(model_name: str, *, size: int, batch: int, dtype: str, device: str, compile_mode: str = "none", **kw):
    """One SGD training step of `model_name` (timm), channels_last, autocast to `dtype`, on prebuilt batches."""
    import timm
    import torch
    import torch.nn.functional as F

    from models.factory import compile_for_training

    dev = torch.device(device)
    model = timm.create_model(model_name, num_classes=1000).to(dev).to(memory_format=torch.channels_last)
    cuda = dev.type == "cuda"
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, **({"fused": True} if cuda else {"foreach": True}))
    scaler = torch.amp.GradScaler(dev.type, enabled=cuda and dtype == "fp16")
    net = compile_for_training(model, compile_mode, cache=kw.get("cache", "auto"))
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(batch, 3, size, size, device=dev, generator=g).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=dev, generator=g)
    amp = torch.float16 if dtype == "fp16" else torch.bfloat16

    def step():
        with torch.autocast(dev.type, dtype=amp):
            loss = F.cross_entropy(net(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    return step, net


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def timed_step(step, device: str, steps: int) -> float:
    """Milliseconds per step over `steps` steps after 3 warm-up steps (gpu_check_timing: CUDA events around them,
    the host clock on the CPU)."""
    return median_ms(time_calls(step, steps, device=device, warmup=3))


def kernel_profile(step, device: str, steps: int = 2) -> dict:
    """Milliseconds per step by kernel class: device time of CUDA kernels, or self CPU time of aten ops on the CPU."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        _sync(device)
    out: dict[str, float] = {}
    for ev in prof.key_averages():
        if device == "cuda":
            us = getattr(ev, "self_device_time_total", 0) or 0
            if ev.device_type.name != "CUDA":
                continue
        else:
            us = ev.self_cpu_time_total if ev.key.startswith("aten::") else 0
        if us > 0:
            cls = kernel_class(ev.key)
            out[cls] = out.get(cls, 0.0) + us / 1e3 / steps
    return {k: round(v, 3) for k, v in sorted(out.items())}


def check_kernels(rows: list[dict], raw: dict, smoke: bool) -> None:
    s = _sizes(smoke)
    big, small = s["models"]
    variants = [(big, "fp16"), (big, "bf16"), (small, "fp16")]
    res = {}
    for model, dtype in variants:
        with guard(rows, f"kernels {model} {dtype}"):
            step, _ = _step_fn(model, size=s["size"], batch=s["batch"], dtype=dtype, device=s["device"])
            ms = timed_step(step, s["device"], s["steps"])
            prof = kernel_profile(step, s["device"])
            res[(model, dtype)] = {
                "ms_per_step": round(ms, 3),
                "images_per_s": s["batch"] * 1e3 / ms,
                "kernel_ms": prof,
            }
            raw.setdefault("kernels", []).append(
                {"model": model, "dtype": dtype, "size": s["size"], **res[(model, dtype)]}
            )
            where = f"{s['size']} px, batch {s['batch']}; kernel ms by class: " + ", ".join(
                f"{k} {v:.1f}" for k, v in prof.items()
            )
            # The anchors (docs/gpu.md): MLPerf v3.0's 8x H100 ResNet-50 gives >= 6,940 img/s per GPU; 6,000 for
            # resnet50d (7% more FLOPs).
            floor = {"resnet50d": 6000.0, "resnet50": 6940.0}.get(model) if dtype == "fp16" and not smoke else None
            img_s = res[(model, dtype)]["images_per_s"]
            rows.append(
                judged(f"step {model} {dtype}", img_s, "img/s", at_least=floor, reference=where)
                if floor
                else row(f"step {model} {dtype}", "n/a: reported", img_s, "img/s", reference=where)
            )
    if (big, "fp16") in res and (big, "bf16") in res:
        f16, b16 = res[(big, "fp16")], res[(big, "bf16")]
        extra = sum(b16["kernel_ms"].values()) - sum(f16["kernel_ms"].values())
        bn_extra = b16["kernel_ms"].get("batchnorm", 0.0) - f16["kernel_ms"].get("batchnorm", 0.0)
        share = bn_extra / extra if extra > 0 else None
        ratio = b16["ms_per_step"] / f16["ms_per_step"]
        ref = f"BatchNorm's share of bf16's extra kernel ms: {share:.0%}" if share is not None else "bf16 not slower"
        rows.append(
            judged("bf16/fp16 step time", ratio, "x", at_most=1.05, reference=ref)
            if not smoke
            else row("bf16/fp16 step time", "n/a: reported", ratio, "x", reference=ref)
        )
        raw["bf16_batchnorm_share"] = share
    if (big, "fp16") in res and (small, "fp16") in res:
        ratio = res[(small, "fp16")]["images_per_s"] / res[(big, "fp16")]["images_per_s"]
        rows.append(row(f"{small}/{big} img/s", "n/a: reported", ratio, "x", reference="same step, fp16"))


def check_compile(rows: list[dict], raw: dict, smoke: bool, work: Path) -> None:
    """Eager against torch.compile (default mode) on the record model's step; compile seconds cold (an empty cache)
    and warm (dynamo reset, the same persistent cache: what a second run on the machine pays)."""
    import torch._dynamo

    from models.factory import compile_report

    s = _sizes(smoke)
    model, cache = s["models"][0], str(work / "compile_cache")
    with guard(rows, "compile vs eager"):
        eager, _ = _step_fn(model, size=s["size"], batch=s["batch"], dtype="fp16", device=s["device"])
        eager_ms = timed_step(eager, s["device"], s["steps"])
        seconds = {}
        for state in ("cold", "warm"):
            torch._dynamo.reset()
            step, net = _step_fn(
                model,
                size=s["size"],
                batch=s["batch"],
                dtype="fp16",
                device=s["device"],
                compile_mode="default",
                cache=cache,
            )
            t = time.perf_counter()
            step()
            step()  # the second call closes the first shape's compile entry (its lazy backward compile included)
            _sync(s["device"])
            first_s = time.perf_counter() - t
            rep = compile_report(net)["compile"]
            seconds[state] = {"wall_s": round(first_s, 2), **next(iter(rep.values()))}
        compiled_ms = timed_step(step, s["device"], s["steps"])
        raw["compile"] = {"eager_ms": eager_ms, "compiled_ms": compiled_ms, "compile": seconds, "model": model}
        cold, warm = seconds["cold"], seconds["warm"]
        ref = (
            f"compile s: cold {cold['compile_s']:.1f} ({cold['cache']}), warm {warm['compile_s']:.1f} ({warm['cache']})"
        )
        rows.append(row("compile/eager img/s", "n/a: reported", eager_ms / compiled_ms, "x", reference=ref))


def make_jpegs(root: Path, *, classes: int, per_class: int, val_per_class: int, size=(500, 375), quality=90) -> None:
    """ImageNet-shaped JPEGs (500x375 at quality 90: smooth noise, so that they compress as photographs do, about
    85 KB; ImageNet's average about 110 KB) in train/ and val/ class folders."""
    import numpy as np
    from PIL import Image

    def one(job):
        path, seed = job
        small = np.random.default_rng(seed).integers(0, 256, (size[1] // 4, size[0] // 4, 3), dtype=np.uint8)
        image = Image.fromarray(small).resize(size, Image.BILINEAR)
        write_output(path, encoded(image, format="JPEG", quality=quality), "gpu check JPEG", durable=False)

    jobs = []
    for split, n in (("train", per_class), ("val", val_per_class)):
        for c in range(classes):
            d = root / split / f"n{c:08d}"
            d.mkdir(parents=True, exist_ok=True)
            jobs += [(d / f"img_{i:05d}.JPEG", len(jobs) + i) for i in range(n)]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:  # PIL encodes without the GIL
        list(pool.map(one, jobs))


def check_dali_loop(rows: list[dict], raw: dict, smoke: bool, work: Path) -> None:
    """The trainer with DALI decoding generated JPEGs, against the same trainer on prebuilt device batches (the
    synthetic backend), at each phase size: the loader's cost is 1 - dali/synthetic img/s of the second epoch."""
    from recipes.config import load_config
    from recipes.trainer import train

    if importlib.util.find_spec("nvidia.dali") is None:
        # DALI's wheel (~476 MB installed) is more than one device call carries (64 MiB): it must be in the image.
        rows.append(row("dali in the loop", "skip: nvidia.dali is not installed here"))
        return
    if smoke:
        sizes, batch, classes, per_class, model, amp = (32,), 8, 2, 8, "resnet10t", "bf16"
    else:  # 6,400 training images (25 steps per epoch at batch 256), about 0.55 GB of JPEGs
        sizes, batch, classes, per_class, model, amp = (96, 128, 224), 256, 16, 400, "resnet50_tweaked", "fp16"
    root = work / "jpegs"
    with guard(rows, "dali in the loop: data"):
        t = time.perf_counter()
        make_jpegs(root, classes=classes, per_class=per_class, val_per_class=4)
        raw["dali_loop_data_s"] = time.perf_counter() - t
    for size in sizes:
        with guard(rows, f"dali in the loop {size} px"):
            rates = {}
            for backend in ("synthetic", "dali"):
                over = [
                    f"data.root={root}",
                    f"data.backend={backend}",
                    f"data.synthetic_size={classes * per_class}",
                    f"data.synthetic_classes={classes}",
                    f"model.name={model}",
                    f"run.amp={amp}",
                    "run.channels_last=true",
                    "log.tensorboard=false",
                    "checkpoint.enabled=false",
                    f"data.workers={2 if smoke else 8}",
                    f"phases=[{{epochs: 2, image_size: {size}, batch_size: {batch}}}]",
                ]
                cfg = load_config(ROOT / "configs" / "quickstart.yaml", over + [f"run.out_dir={work / 'runs'}"])
                summary = train(cfg, work / "runs" / f"{backend}-{size}")
                rates[backend] = summary["history"][-1]["images_per_s"]  # the second epoch: pipelines built
            cost = 1 - rates["dali"] / rates["synthetic"]
            raw.setdefault("dali_loop", []).append({"size": size, **rates, "loader_cost": cost})
            ref = f"trainer img/s: DALI {rates['dali']:.0f}, prebuilt batches {rates['synthetic']:.0f}"
            rows.append(
                judged(f"dali loader cost {size} px", cost, "", at_most=0.05, reference=ref)
                if not smoke
                else row(f"dali loader cost {size} px", "n/a: reported", cost, "", reference=ref)
            )


def run_parts(rows: list[dict], parts: list[str], *, smoke: bool, work: Path, out: Path, gpu: str) -> dict:
    """Run `parts` in order, adding their rows to `rows`; `out` (JSON: rows and raw numbers) after every part."""
    import torch

    from base.writer import write_output

    raw: dict = {}
    report = {"gpu": gpu, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "parts_done": []}
    report.update(rows=rows, raw=raw)
    checks = {
        "kernels": lambda: check_kernels(rows, raw, smoke),
        "compile": lambda: check_compile(rows, raw, smoke, work),
        "dali_loop": lambda: check_dali_loop(rows, raw, smoke, work),
    }
    for part in [p for p in PARTS if p in parts]:
        t = time.perf_counter()
        checks[part]()
        report["parts_done"].append({"part": part, "seconds": round(time.perf_counter() - t, 1)})
        # after every part: a timeout keeps these
        write_output(out, json.dumps(report, indent=2, default=str) + "\n", "the perf report")
        print(f"gpu_check_perf: {part} done in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_check_perf.json")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS)
    ap.add_argument("--smoke", action="store_true", help="on the CPU with tiny sizes: the code paths, not numbers")
    ap.add_argument("--work", help="folder for generated JPEGs, runs and the compile cache (default: temporary)")
    args = ap.parse_args(argv)
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("gpu_check_perf: no CUDA GPU present: nothing ran (--smoke runs the code paths on the CPU)")
        return 0
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu_check_perf-"))
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.smoke else "cpu (smoke)"
    run_parts(rows, args.parts, smoke=args.smoke, work=work, out=Path(args.out), gpu=gpu)
    print(markdown_table(rows))
    return 1 if any(r["result"].startswith("fail") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
