#!/usr/bin/env python
"""One prepared check of every GPU path (docs/gpu.md): AMP training steps against a bare loop and NVIDIA's figure,
DALI nvJPEG input, the allreduce backends on CUDA tensors, the trainer end to end (ddp, multistream + autotune,
horovod), evaluate.py and the batch-1 inference modes.

    python -m scripts.gpu_check.gpu_check [--out gpu_check.json] [--steps 25] [--work DIR]      (make gpu-check)
    python -m scripts.gpu_check.gpu_check --parts steps          # only the train-step rows and the GPU profile
    python -m scripts.gpu_check.gpu_check --parts speed          # the record's step, eager vs CUDA graph
    python -m scripts.gpu_check.gpu_check --parts capture        # the CUDA-graph step's probe, one call <= 8 min

Three outcomes, one line each where nothing ran:
  no GPU                       exit 0, "gpu-check: no CUDA GPU present: nothing GPU-only ran"
  a GPU torch cannot use       exit 1, the driver version, the CUDA version this torch needs, and the fix
  a run                        a Markdown table (check, result, number, unit, threshold, reference, seconds), the same
                               rows as JSON in --out (rewritten after every part, and after every case of
                               `capture`, so a run cut off keeps its rows), the time model's GPU profile in
                               gpu_profile.json beside it; exit 1 if any row fails
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

# Started as a file, Python puts only scripts/gpu_check/ on the path: the repository goes first, so the imports
# below (the repository's packages) resolve as they do under `python -m`.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.gpu_check.gpu_check_env import NO_GPU, probe  # noqa: F401  (NO_GPU: the no-GPU line, read by the tests)
from scripts.gpu_check.gpu_check_rows import failed, judged, markdown_table, row

BUDGET_S = 480.0  # the whole check on one GPU


def write_profile(path: Path, rates: list[dict], dtype: str) -> dict:
    """The train-step rates as the time model reads them (scripts/predict.py --gpu-profile)."""
    import torch

    from recipes.rundir.outputs import git_commit

    profile = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "commit": git_commit(),
        "model": "resnet50_tweaked",
        "channels_last": True,
        "dtype": dtype,
        "rates": rates,
    }
    from base.writer import write_output

    write_output(path, json.dumps(profile, indent=2) + "\n", "the GPU profile")
    return profile


# The check's parts in the order they run, each with the parts it needs: the DALI rows are held to the step rates,
# evaluation reads the ddp run's checkpoint.
# speed and perf run only when named (minutes each on one H200): speed is the record's step eager vs CUDA graph
# (gpu_check_speed.py, its JSON beside --out); perf is kernel classes, bf16, compile and DALI in the training loop
# (gpu_check_perf.py, its raw numbers in gpu_check_perf.json in the work folder after every part); capture probes
# the CUDA-graph step case by case (gpu_check_capture.py, its rows in --out after every case).
ALONE = ("speed", "perf", "capture")
PARTS = {"steps": (), "dali": ("steps",), "allreduce": (), "e2e": (), "eval": ("e2e",)} | {p: () for p in ALONE}
WHOLE = [p for p in PARTS if p not in ALONE]


def with_needs(parts: list[str]) -> list[str]:
    """`parts` and every part they need, in the order the check runs them."""
    chosen = set(parts)
    for p in parts:
        chosen.update(PARTS[p])
    return [p for p in PARTS if p in chosen]


def run_checks(rows: list[dict], work: Path, steps: int, gpus: int, profile: dict, parts: list[str]) -> None:
    """Run `parts` in order, adding their rows; `profile["save"]()` (when given) writes --out after every part."""
    import torch

    from data.make_sample import main as make_sample
    from scripts.gpu_check.gpu_check_env import native_bf16
    from scripts.gpu_check.gpu_check_runs import check_allreduce, check_e2e, check_eval
    from scripts.gpu_check.gpu_check_steps import check_dali, check_steps

    sample = work / "sample"
    ckpt = None
    save = profile.get("save", lambda: None)

    def part(name: str, fn) -> None:
        if name in parts:
            fn()
            save()

    def e2e():
        nonlocal ckpt
        ckpt = check_e2e(rows, sample, work, gpus)

    def speed():  # the record's step, eager vs CUDA graph (gpu_check_speed.py): its JSON beside --out
        from scripts.gpu_check.gpu_check_speed import check_speed

        check_speed(rows, Path(profile.get("speed_json", work / "gpu_speed.json")))

    def perf():
        from scripts.gpu_check.gpu_check_perf import PARTS as PERF
        from scripts.gpu_check.gpu_check_perf import run_parts

        run_parts(
            rows, PERF, smoke=False, work=work, out=work / "gpu_check_perf.json", gpu=torch.cuda.get_device_name(0)
        )

    def capture():  # the CUDA-graph step's probe (gpu_check_capture.py): --out after every case
        from scripts.gpu_check.gpu_check_capture import check_capture

        check_capture(rows, save, allow_skip=profile.get("allow_skip", False))

    with contextlib.redirect_stdout(sys.stderr):
        if {"dali", "e2e", "eval"} & set(parts):
            make_sample(["--out", str(sample)])
        part("steps", lambda: check_steps(rows, steps, work, profile))
        part("dali", lambda: check_dali(rows, sample, {r["image_size"]: r["images_per_s"] for r in profile["rates"]}))
        part("allreduce", lambda: check_allreduce(rows, work, gpus))
        part("e2e", e2e)
        part("eval", lambda: check_eval(rows, ckpt, sample, work, native_bf16(torch.cuda.get_device_capability(0))))
        part("speed", speed)
        part("perf", perf)
        part("capture", capture)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_check.json", help="write the rows as JSON here (gpu_profile.json beside it)")
    ap.add_argument("--steps", type=int, default=25, help="timed training steps per round (the step rows)")
    ap.add_argument(
        "--parts",
        nargs="+",
        choices=list(PARTS),
        default=WHOLE,
        help="run only these parts (and the parts they need: dali needs steps, eval needs e2e); default: all but "
        f"{', '.join(ALONE)}",
    )
    ap.add_argument(
        "--allow-skip", action="store_true", help="capture: a skipped case (DALI, Horovod) does not fail the part"
    )
    ap.add_argument(
        "--work", help="keep the sample data, runs and logs in a new folder inside this one (default: temporary)"
    )
    args = ap.parse_args(argv)
    parts = with_needs(args.parts)
    outcome = probe()
    if outcome.kind != "run":
        print(outcome.line)
        return outcome.exit_code
    import torch

    gpus = torch.cuda.device_count()
    tmp = None if args.work else tempfile.TemporaryDirectory(prefix="gpu_check-")
    base = Path(args.work or tmp.name)
    base.mkdir(parents=True, exist_ok=True)
    # A folder of its own for every invocation: a rerun into the same --work starts from nothing.
    work = Path(tempfile.mkdtemp(prefix=time.strftime("check-%Y%m%d-%H%M%S-"), dir=base))
    out = Path(args.out)
    cap = torch.cuda.get_device_capability(0)
    dtype = "fp16"  # the record's AMP (configs/dawnbench_158s.yaml run.amp)
    profile = {"dtype": dtype, "rates": [], "speed_json": str(out.with_name("gpu_speed.json"))}
    profile["allow_skip"] = args.allow_skip
    rows: list[dict] = []
    report = {
        "gpu": torch.cuda.get_device_name(0),
        "gpus": gpus,
        "capability": f"{cap[0]}.{cap[1]}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": time.strftime("%Y-%m-%d"),
        "seconds": None,
        "parts": parts,
        "work": str(work),
        "complete": False,  # True once the check ended (a run cut off leaves False and the rows so far)
        "rows": rows,
    }
    if "capture" in parts:  # what a proof written from this report records (scripts/gpu_check/prove.py)
        from scripts.gpu_check.gpu_check_capture import scope_fields

        report.update(scope_fields(), allow_skip=args.allow_skip)

    def save() -> None:
        from base.writer import write_output

        write_output(out, json.dumps(report, indent=2) + "\n", "the gpu-check report")

    profile["save"] = save
    t0 = time.perf_counter()
    try:
        run_checks(rows, work, args.steps, gpus, profile, parts)
    except Exception as e:  # noqa: BLE001 - whatever stopped the check is a failed row, and the table still prints
        rows.append(row("gpu-check", f"fail: {type(e).__name__}: {e}"))
    finally:
        seconds = time.perf_counter() - t0
        from scripts.gpu_check.gpu_check_runs import SETUP_SECONDS

        setup = sum(SETUP_SECONDS.values())
        ref = f"{gpus} GPU(s); per-row seconds in the last column"
        if setup:
            ref += "; not counted: " + ", ".join(f"{k} {v:.0f} s" for k, v in SETUP_SECONDS.items())
        name = "the whole check" if parts == WHOLE else f"the check's parts: {' '.join(parts)}"
        rows.append(judged(name, seconds - setup, "s", at_most=BUDGET_S, reference=ref))
        if profile["rates"]:
            write_profile(out.with_name("gpu_profile.json"), profile["rates"], dtype)
        report.update(seconds=seconds, complete=True)
        save()
        print(
            f"### GPU check: {report['gpu']} x{gpus}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
            f"{report['date']}, {seconds:.0f} s" + ("" if parts == WHOLE else f"; parts: {' '.join(parts)}") + "\n"
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
