#!/usr/bin/env python
"""One prepared check of every GPU path (docs/gpu.md): DALI nvJPEG input, AMP training steps, the trainer end to end
over NCCL (ddp, multistream + autotune, horovod), evaluate.py and the batch-1 inference modes.

    python scripts/gpu_check.py [--out gpu_check.json] [--steps 20]      (make gpu-check)

Prints one Markdown table (check, result, number, unit, reference) and writes the same rows as JSON to --out; exits 1
if any check fails. Without CUDA it prints one line saying so and exits 0, having run nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NO_GPU = "gpu-check: no CUDA GPU present: nothing GPU-only ran"
# NVIDIA DeepLearningExamples, PyTorch ResNet-50 v1.5, training performance, DGX A100 (8x A100 80GB), AMP, batch 256.
NVIDIA_RN50_AMP_8XA100 = 16621.0
NVIDIA_RN50_AMP_PER_GPU = NVIDIA_RN50_AMP_8XA100 / 8
NVIDIA_REF = f"NVIDIA DLE RN50 AMP 8xA100: {NVIDIA_RN50_AMP_8XA100:,.0f} img/s = {NVIDIA_RN50_AMP_PER_GPU:,.0f}/GPU"
SIZES = (96, 128, 224, 288)
# A reduced-precision mode fails below this top-1 agreement with fp32 (a 3-epoch model has near-ties to flip).
AGREEMENT_MIN = 90.0


def row(name: str, result: str, number: float | None = None, unit: str = "", reference: str = "") -> dict:
    """One line of the table: result is 'pass', 'fail', 'skip' or 'n/a' (and why, after a colon)."""
    return {"name": name, "result": result, "number": number, "unit": unit, "reference": reference}


def _fmt(v: float | None) -> str:
    if v is None:
        return ""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def markdown_table(rows: list[dict]) -> str:
    """The rows as one Markdown table; '|' inside a cell is escaped."""

    def cell(s) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    lines = ["| check | result | number | unit | reference |", "|---|---|---:|---|---|"]
    lines += [
        f"| {cell(r['name'])} | {cell(r['result'])} | {_fmt(r['number'])} | {cell(r['unit'])} | "
        f"{cell(r['reference'])} |"
        for r in rows
    ]
    return "\n".join(lines)


def failed(rows: list[dict]) -> list[str]:
    return [r["name"] for r in rows if r["result"].startswith("fail")]


def _guard(rows: list[dict], name: str):
    """Run a check body; an exception becomes a 'fail' row naming it (the other checks still run)."""

    @contextlib.contextmanager
    def cm():
        try:
            yield
        except Exception as e:  # noqa: BLE001 - a check that raises is a failed check, reported in its row
            traceback.print_exc(file=sys.stderr)
            rows.append(row(name, f"fail: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"))

    return cm()


# --- 1. DALI mixed decoding ---------------------------------------------------------------------------------------
def check_dali(rows: list[dict], sample: Path) -> None:
    import torch

    from data import create_input
    from recipes.config import load_config
    from recipes.distributed import DistInfo
    from recipes.schedule import EpochInfo

    dev = torch.device("cuda", 0)
    batch = 64
    for size in SIZES:
        with _guard(rows, f"DALI mixed decode + random-resized-crop {size}px"):
            phase = f"{{epochs: 1, image_size: {size}, batch_size: {batch}}}"
            cfg = load_config(
                ROOT / "configs" / "base.yaml",
                ["data.backend=dali", f"data.root={sample}", "data.workers=4", f"phases=[{phase}]"],
            )
            pipe = create_input(cfg, DistInfo(0, 1, 0, 1, dev))
            info = EpochInfo(0, 0, cfg.phases[0], 0, math.ceil(pipe.num_train / batch))
            n, shape_ok = 0, True
            for i, _batch in enumerate(pipe.train_batches(info)):  # warm-up: the pipeline built, its queue full
                if i == 2:
                    break
            torch.cuda.synchronize()
            t = time.perf_counter()
            for x, _ in pipe.train_batches(info):
                n += x.shape[0]
                shape_ok &= x.is_cuda and x.shape.count(size) >= 2  # NCHW or NHWC, square crops
            torch.cuda.synchronize()
            dt = time.perf_counter() - t
            pipe.close()
            ok = shape_ok and n > 0
            rows.append(
                row(
                    f"DALI mixed decode + random-resized-crop {size}px",
                    "pass" if ok else "fail: shape",
                    n / dt,
                    "images/s",
                    f"{n} images on cuda:0",
                )
            )
    with _guard(rows, "DALI mixed rect validation (each image once)"):
        phase = "{epochs: 1, image_size: 128, batch_size: 64, rect_val: true}"
        cfg = load_config(
            ROOT / "configs" / "base.yaml",
            ["data.backend=dali", f"data.root={sample}", "data.workers=4", f"phases=[{phase}]"],
        )
        pipe = create_input(cfg, DistInfo(0, 1, 0, 1, dev))
        t = time.perf_counter()
        n = sum(x.shape[0] for x, _ in pipe.val_batches(cfg.phases[0]))
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        expected = pipe.num_val
        pipe.close()
        rows.append(
            row(
                "DALI mixed rect validation (each image once)",
                "pass" if n == expected else f"fail: counted {n}, expected {expected}",
                n / dt,
                "images/s",
                f"{n} of {expected} val images",
            )
        )


# --- 2. AMP training steps ---------------------------------------------------------------------------------------
def _step_config(amp: str, size: int, batch: int, steps: int, rounds: int, out: Path):
    from recipes.config import load_config

    return load_config(
        None,
        [
            "data.backend=synthetic",
            f"data.synthetic_size={batch * steps}",
            "data.synthetic_classes=1000",
            "model.name=resnet50_tweaked",
            f"run.amp={amp}",
            "run.channels_last=true",
            "optim.name=hybrid",
            "log.tensorboard=false",
            "checkpoint.enabled=false",
            "checkpoint.resume=false",
            f"log.every_steps={steps}",
            f"run.out_dir={out}",
            f"phases=[{{epochs: {rounds + 1}, image_size: {size}, batch_size: {batch}}}]",
        ],
    )


def bare_loop(model, optimizer, criterion, x, y, steps: int, amp_dtype, scaler) -> float:
    """Images/s of a plain autocast forward/backward/step loop; synchronize only around the timed window."""
    import torch

    model.train()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        with torch.autocast("cuda", dtype=amp_dtype):
            loss = criterion(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
    torch.cuda.synchronize()
    return steps * x.shape[0] / (time.perf_counter() - t)


def check_steps(rows: list[dict], steps: int, work: Path) -> None:
    import statistics

    import torch

    from models import create_model
    from recipes.optim import create_optimizer
    from recipes.steps import create_criterion
    from recipes.trainer import Trainer

    batch, rounds = 256, 3
    for amp in ("fp16", "bf16"):
        for size in (128, 224):
            name = f"train step resnet50_tweaked {amp} {size}px b{batch}"
            with _guard(rows, name):
                cfg = _step_config(amp, size, batch, steps, rounds, work / "steps")
                with contextlib.redirect_stdout(sys.stderr):
                    trainer = Trainer(cfg)
                trainer.log.active = False
                dev = trainer.dist.device
                bare_model = create_model(cfg.model, 1000).to(dev).to(memory_format=torch.channels_last)
                bare_opt = create_optimizer(cfg.optim, bare_model)
                x, y = next(iter(trainer.data.train_batches(trainer.plan.epoch_info(0))))
                x = x.to(dev).contiguous(memory_format=torch.channels_last)
                y = y.to(dev)
                dtype = torch.float16 if amp == "fp16" else torch.bfloat16
                scaler = torch.amp.GradScaler("cuda") if amp == "fp16" else None
                criterion = create_criterion(cfg).to(dev)
                bare_loop(bare_model, bare_opt, criterion, x, y, 3, dtype, scaler)
                trainer.train_one_epoch(0)
                bare, ours = [], []
                for r in range(rounds):
                    bare.append(bare_loop(bare_model, bare_opt, criterion, x, y, steps, dtype, scaler))
                    res = trainer.train_one_epoch(r + 1)
                    ours.append(res["images"] / res["seconds"])
                trainer.close()
                b, o = statistics.median(bare), statistics.median(ours)
                rows.append(row(name, "pass", o, "img/s per GPU", NVIDIA_REF if size == 224 else ""))
                rows.append(
                    row(
                        f"trainer overhead vs bare loop ({amp} {size}px)",
                        "pass",
                        100 * (1 - o / b),
                        "%",
                        f"bare loop {b:,.0f} img/s; target <= 3%",
                    )
                )
                del trainer, bare_model, bare_opt
                torch.cuda.empty_cache()


# --- 3. The trainer end to end over NCCL -------------------------------------------------------------------------
def _train_overrides(sample: Path) -> list[str]:
    return [
        "data.backend=dali",
        f"data.root={sample}",
        "model.name=resnet18",
        "dist.backend=nccl",
        "run.amp=fp16",
        "run.channels_last=true",
        "log.tensorboard=false",
        "dist.timeout_s=120",
        "phases=[{epochs: 2, image_size: 96, batch_size: 64}, {epochs: 1, image_size: 128, batch_size: 64}]",
    ]


def _run(cmd: list[str], log: Path, timeout: int) -> int:
    with open(log, "w") as f:
        try:
            return subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            f.write(f"\ngpu-check: timed out after {timeout} s\n")
            return 124


def _tuner_lines(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if "tun" in ln.lower()]
    return " / ".join(lines[-6:])


def check_e2e(rows: list[dict], sample: Path, work: Path, gpus: int) -> Path | None:
    """Train with each allreduce backend; returns the ddp run's checkpoint (for check 4)."""
    py, ckpt = sys.executable, None
    torchrun = [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(gpus)]
    runs = {"ddp": ["comm.backend=ddp"], "multistream": ["comm.backend=multistream", "comm.autotune=true"]}
    for backend, extra in runs.items():
        name = f"trainer end to end, NCCL, comm.backend={backend}"
        with _guard(rows, name):
            run_dir = work / f"run-{backend}"
            log = work / f"run-{backend}.log"
            rc = _run(
                torchrun
                + ["train.py", "-c", "configs/base.yaml", "--run-dir", str(run_dir)]
                + _train_overrides(sample)
                + extra,
                log,
                240,
            )
            summary = run_dir / "summary.json"
            if rc != 0 or not summary.is_file():
                rows.append(row(name, f"fail: exit {rc} (see {log})"))
                continue
            s = json.loads(summary.read_text())
            comm = s.get("comm") or {}
            ref = f"world {gpus}; comm settings {comm.get('settings', {})}"
            if not comm.get("steps"):  # one process: the backend hands nothing to an allreduce (nor to the tuner)
                ref += "; one process, nothing reduced"
            if backend == "multistream":
                ref += f"; tuner: {_tuner_lines(log)}"
            rows.append(row(name, "pass", s.get("images_per_s"), "img/s", ref))
            if backend == "ddp":
                ckpt = run_dir / "checkpoint.pt"
    name = "trainer end to end, comm.backend=horovod"
    try:
        import horovod.torch  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means the backend cannot run here
        rows.append(row(name, f"skip: horovod not importable ({type(e).__name__})"))
        return ckpt
    local = Path(py).parent / "horovodrun"  # the venv's own, beside this Python
    hvdrun = str(local) if local.is_file() else shutil.which("horovodrun") or "horovodrun"
    with _guard(rows, name):
        run_dir, log = work / "run-horovod", work / "run-horovod.log"
        cmd = [
            hvdrun,
            "--gloo",
            "-np",
            str(gpus),
            "-H",
            f"localhost:{gpus}",
            py,
            "train.py",
            "-c",
            "configs/base.yaml",
            "--run-dir",
            str(run_dir),
        ]
        rc = _run(cmd + _train_overrides(sample) + ["comm.backend=horovod"], log, 240)
        summary = run_dir / "summary.json"
        if rc != 0 or not summary.is_file():
            rows.append(row(name, f"fail: exit {rc} (see {log})"))
        else:
            rows.append(
                row(name, "pass", json.loads(summary.read_text()).get("images_per_s"), "img/s", f"world {gpus}")
            )
    return ckpt


# --- 4. evaluate.py and the inference modes ----------------------------------------------------------------------
def check_eval(rows: list[dict], ckpt: Path | None, sample: Path, work: Path) -> None:
    from recipes.evaluation.inference import MODES

    if ckpt is None or not ckpt.is_file():
        rows.append(row("evaluate.py (DALI) on the checkpoint", "fail: no checkpoint from the ddp run"))
        return
    py = sys.executable
    with _guard(rows, "evaluate.py (DALI) on the checkpoint"):
        out, log = work / "eval.json", work / "eval.log"
        rc = _run(
            [py, "evaluate.py", str(ckpt), "--data", str(sample), "--backend", "dali", "--out", str(out)], log, 120
        )
        if rc != 0 or not out.is_file():
            rows.append(row("evaluate.py (DALI) on the checkpoint", f"fail: exit {rc} (see {log})"))
        else:
            r = json.loads(out.read_text())
            rows.append(
                row(
                    "evaluate.py (DALI) on the checkpoint",
                    "pass",
                    r.get("top1"),
                    "% top-1",
                    f"{r.get('count')} val images counted once",
                )
            )
    # The compiled GPU modes replay the model as a CUDA graph (torch.compile mode="reduce-overhead").
    modes = [m for m in ("compile", "fp16", "bf16") if m in MODES and "cuda" in MODES[m].devices]
    with _guard(rows, "batch-1 latency"):
        out, log = work / "latency.json", work / "latency.log"
        cmd = [
            py,
            "evaluate.py",
            str(ckpt),
            "--data",
            str(sample),
            "--latency",
            "--device",
            "cuda",
            "--optimize",
            ",".join(modes),
            "--images",
            "200",
            "--out",
            str(out),
        ]
        rc = _run(cmd, log, 300)
        if rc != 0 or not out.is_file():
            rows.append(row("batch-1 latency (DAWNBench protocol)", f"fail: exit {rc} (see {log})"))
            return
        results = json.loads(out.read_text())["results"]
        for m in ["none"] + modes:
            r = results.get(m)
            label = f"batch-1 latency --optimize {m}" + (" (CUDA graphs)" if MODES[m].compile != "never" else "")
            if r is None:
                rows.append(row(label, "fail: missing from the results"))
                continue
            agree = r.get("agreement_top1")
            ok = m == "none" or (agree is not None and agree >= AGREEMENT_MIN)
            rows.append(
                row(
                    label,
                    "pass" if ok else f"fail: top-1 agreement {agree}%",
                    r["latency_ms"]["excluding_preprocessing"]["mean"],
                    "ms/image",
                    f"top-1 agreement with fp32 {agree}%; {r['images']} images",
                )
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_check.json", help="write the rows as JSON here")
    ap.add_argument("--steps", type=int, default=20, help="timed training steps per round (check 2)")
    ap.add_argument("--work", help="keep the sample data and runs in this folder (default: a temporary one)")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(NO_GPU)
        return 0
    gpus = torch.cuda.device_count()
    tmp = None if args.work else tempfile.TemporaryDirectory(prefix="gpu_check-")
    work = Path(args.work or tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    t0 = time.perf_counter()
    try:
        from data.make_sample import main as make_sample

        sample = work / "sample"
        with contextlib.redirect_stdout(sys.stderr):
            make_sample(["--out", str(sample)])
        with contextlib.redirect_stdout(sys.stderr):
            check_dali(rows, sample)
            check_steps(rows, args.steps, work)
        ckpt = check_e2e(rows, sample, work, gpus)
        with contextlib.redirect_stdout(sys.stderr):
            check_eval(rows, ckpt, sample, work)
    finally:
        report = {
            "gpu": torch.cuda.get_device_name(0),
            "gpus": gpus,
            "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"),
            "seconds": time.perf_counter() - t0,
            "rows": rows,
        }
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(
            f"### GPU check: {report['gpu']} x{gpus}, torch {torch.__version__}, {report['date']}, "
            f"{report['seconds']:.0f} s\n"
        )
        print(markdown_table(rows))
        if tmp is not None:
            tmp.cleanup()
    bad = failed(rows)
    if bad:
        print(f"\n{len(bad)} check(s) failed: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
