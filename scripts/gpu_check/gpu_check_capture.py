"""The `capture` part of gpu_check.py: the record's CUDA-graph step (recipes/steps.py GraphStep) probed on one GPU,
case by case, in one call of at most 8 minutes (docs/gpu.md, "The capture probe").

    python -m scripts.gpu_check.gpu_check --parts capture                      # one GPU: rows in gpu_check.json
    python -m scripts.gpu_check.gpu_check_capture --smoke --out capture.json   # CPU: the same code, tiny

Cases, in order; the rows are written after every case, so a run cut off keeps what it measured:
  phases      the record's step (configs/dawnbench_158s_resnet50d.yaml: its model, hybrid LARS, fp16, channels_last,
              multistream engaged on one rank), run.cuda_graph=true, per-GPU batch 64: one GraphStep captures and
              replays it at 96, 128, 224 and 288 px in one process, and the weights stay finite and equal those of
              the same steps run eagerly (each group within PHASE_REL of its own update); capture seconds
  optimizers  every optimizer in base/registry.py captured or refused as its record says (graph_decision with
              run.cuda_graph=true, and GraphStep itself); a captured one's weights after OPTIM_STEPS steps equal
              StepRunner's, each parameter group within OPTIM_REL of its own update
  wrapped     DDP and Horovod engaged on one rank (comm.engage_single_rank=true): graph_decision keeps the step eager
              and the trainer's eager step runs (Horovod is skipped where horovod.torch does not import)
  churn       CHURN_STEPS eager GraphStep steps (capture blocked by the backend) against as many StepRunner steps:
              the caching allocator's retries and peak reserved memory at most CHURN_MAX x StepRunner's
  dali        DALI's zero-copy batch with a device delay before GraphStep's static copy: what the copy read equals a
              host copy of the batch taken when DALI produced it
  speedup     graphed against eager at 96 and 128 px (per-GPU batch 256): wall-time ratio >= SPEEDUP_MIN, graphed
              wall/kernel <= WALL_PER_KERNEL_MAX, and the graphed step launched at least KERNELS_MIN of eager's kernels
  questions   answers, not judgements ('n/a' rows with the numbers): does this build's allocator refuse a capture
              into a dropped graph's pool; hybrid LARS's step time with float against tensor lr/momentum; the
              reserved memory after a capture and after an evaluation pass, against recipes/memory.py's estimate
  hierarchy   comm.hierarchy=host's GPU-only part: two processes on the GPU, each its own host, equal to DDP's mean
              (scripts/gpu_check/gpu_check_hier.py)

The cases and the thresholds named above are gpu_check_capture_cases.py; what they run on (Probe, the small
network's runners, the judge of weights), gpu_check_capture_probe.py. This module runs them and writes the rows.

Each case runs in its own process (a capture that raises leaves its thread on the capture stream, and the next case
would measure there). A skipped case fails the part unless --allow-skip; the report lists what was skipped.

--smoke runs every case on the CPU at tiny sizes. Capturing needs CUDA: where torch.cuda's graph API is not stood in
for, the capturing cases are skipped with that reason (the test installs tests/support.py's FakeCudaGraphs and runs
them all). CPU timings and the allocator's counters say nothing about a GPU: in --smoke they are reported as 'n/a'.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# Started as a file, Python puts only scripts/gpu_check/ on the path: the repository goes first, so the imports
# below (the repository's packages) resolve as they do under `python -m`.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.gpu_check.gpu_check_capture_cases import CHECKS
from scripts.gpu_check.gpu_check_capture_probe import Probe
from scripts.gpu_check.gpu_check_rows import guard, markdown_table, row

CASES = list(CHECKS)  # in the order they run


def skip_policy(rows: list[dict], *, allow_skip: bool) -> list[str]:
    """The skipped rows' names and reasons; without `allow_skip` each skipped row becomes a failed one (a skipped
    case proves nothing), in place."""
    skipped = []
    for r in rows:
        if r["result"].startswith("skip"):
            skipped.append(f"{r['name']} ({r['result']})")
            if not allow_skip:
                r["result"] = f"fail: {r['result']} (--allow-skip accepts a skipped case)"
    return skipped


def run_cases(rows: list[dict], probe: Probe, *, write, cases: list[str] | None = None) -> None:
    """Run `cases` (default: all, in order), adding their rows; `write()` after every case (a timeout keeps them)."""
    for case in [c for c in CASES if c in (cases or CASES)]:
        t = time.perf_counter()
        with guard(rows, f"capture {case}"):
            CHECKS[case](rows, probe)
        write()
        print(f"capture: {case} done in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)


def scope_fields() -> dict:
    """What a proof written from this probe's report records of where it ran (recipes/proofs.py): NCCL, the
    driver, the commit and the world size of the probe's process group (one rank)."""
    from recipes.environment import collect
    from recipes.rundir.outputs import git_commit

    env = collect()
    return {"nccl": env.nccl or "none", "driver": env.driver or "none", "commit": git_commit(), "world_size": 1}


CASE_TIMEOUT_S = 240  # one case's process; the whole probe is meant to end within about 5.5 minutes


def run_case_processes(rows: list[dict], cases: list[str], *, write, smoke: bool = False) -> None:
    """Each case of `cases` in a process of its own (this module with `--cases CASE`), its rows added to `rows` and
    `write()` after each; a process that ends without its rows is a failed row naming its exit."""
    import subprocess
    import tempfile

    from base.errors import ConfigError
    from base.reader import read_json_object

    root = Path(__file__).resolve().parents[2]
    for case in cases:
        with tempfile.TemporaryDirectory(prefix="capture-case-") as tmp:
            out = Path(tmp) / "case.json"
            cmd = [sys.executable, "-m", "scripts.gpu_check.gpu_check_capture", "--cases", case, "--out", str(out)]
            cmd += ["--allow-skip"] + (["--smoke"] if smoke else [])
            t = time.perf_counter()
            try:
                rc = subprocess.run(cmd, cwd=root, timeout=CASE_TIMEOUT_S, stdout=sys.stderr).returncode
            except subprocess.TimeoutExpired:
                rc = f"a timeout after {CASE_TIMEOUT_S} s"
            try:
                got = read_json_object(out, what=f"capture {case}'s rows", error=ConfigError).get("rows", [])
            except ConfigError as e:
                got = [row(f"capture {case}", f"fail: its process ended ({rc}) without its rows: {e}")]
            if got and got[0].get("seconds") is None:
                got[0]["seconds"] = time.perf_counter() - t
        rows += got
        write()


def check_capture(rows: list[dict], write, *, allow_skip: bool = False) -> None:
    """gpu_check.py's `capture` part on cuda:0, each case in its own process: its rows in gpu_check.json, written
    after every case; a skipped case fails the part unless `allow_skip`."""
    run_case_processes(rows, CASES, write=write)
    skip_policy([r for r in rows if r["name"].startswith("capture")], allow_skip=allow_skip)
    write()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_capture.json", help="the rows as JSON, rewritten after every case")
    ap.add_argument("--smoke", action="store_true", help="on the CPU at tiny sizes: the code paths, not numbers")
    ap.add_argument("--cases", nargs="+", choices=CASES, default=CASES)
    ap.add_argument("--allow-skip", action="store_true", help="a skipped case does not fail (the report lists it)")
    args = ap.parse_args(argv)
    import torch

    from base.writer import write_output

    if not args.smoke and not torch.cuda.is_available():
        print("gpu-check capture: no CUDA GPU present (--smoke runs the same code on the CPU)")
        return 0
    device = torch.cuda.get_device_name(0) if not args.smoke else "cpu"
    report = {"gpu": device, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "smoke": args.smoke}
    report.update(scope_fields())
    rows: list[dict] = []
    report.update(rows=rows, skipped=[])
    out = Path(args.out)

    def write() -> None:
        write_output(out, json.dumps(report, indent=2) + "\n", "the capture probe's report")

    cases = [c for c in CASES if c in args.cases]
    if len(cases) > 1:  # one process per case
        run_case_processes(rows, cases, write=write, smoke=args.smoke)
    else:
        probe = Probe("cpu" if args.smoke else "cuda", smoke=args.smoke)
        try:
            run_cases(rows, probe, write=write, cases=cases)
        finally:
            probe.close()
    report["skipped"] = skip_policy(rows, allow_skip=args.allow_skip)
    write()
    print(markdown_table(rows))
    return 1 if any(r["result"].startswith("fail") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
