"""Mark the parts a capture probe proved, with the scope it ran in, from the probe's own report (never by hand).

    python -m scripts.gpu_check.prove gpu_check.json                 # after gpu_check --parts capture on a GPU
    python -m scripts.gpu_check.prove gpu_check.json --allow-skip    # a skipped row (DALI, Horovod) is no failure

Reads the report that `gpu_check --parts capture` (or gpu_check_capture) wrote, and adds one proof to
docs/data/gpu-proofs.json (recipes/proofs.py): the optimizers whose `capture optimizers` row passed, and the record
config's optimizer and allreduce backend when every `capture phases` row passed; in the scope the report records
(GPU model, world size, whether the DALI row ran, torch, NCCL, driver, commit, date). A failed capture row, a smoke
(CPU) report or a report cut off proves nothing; a skipped row fails too unless `--allow-skip`, and the proof then
lists what was skipped. `run.cuda_graph=auto` captures a phase only inside the scope of a proof of every part.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Started as a file, Python puts only scripts/gpu_check/ on the path: the repository goes first, so the imports
# below (the repository's packages) resolve as they do under `python -m`.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from base.errors import ConfigError
from base.reader import read_json_object
from base.writer import write_output
from recipes import proofs as proofs_

OPTIMIZER_ROW = "capture optimizers: optim.name="
PHASES_ROW = "capture phases:"
DALI_ROW = "capture dali:"
SCOPE_KEYS = ("gpu", "torch", "nccl", "driver", "commit", "date", "world_size")


def proof_from_report(report: dict, *, allow_skip: bool, record_parts: tuple[str, ...]) -> proofs_.Proof:
    """The proof a probe's report supports; ConfigError (one line) when it supports none. `record_parts`: the
    parts the `phases` rows run (the record config's optimizer and backend)."""
    if report.get("smoke"):
        raise ConfigError("a --smoke report ran on the CPU: it proves nothing about a GPU")
    if report.get("complete") is False:
        raise ConfigError("the report was cut off (complete: false): run the probe to its end")
    absent = [k for k in SCOPE_KEYS if k not in report]
    if absent:
        raise ConfigError(f"the report has no {', '.join(absent)}: write it with this commit's gpu_check")
    rows = [r for r in report.get("rows", []) if isinstance(r, dict) and str(r.get("name", "")).startswith("capture")]
    if not rows:
        raise ConfigError("the report has no capture rows: run gpu_check --parts capture")
    failed = [r["name"] for r in rows if str(r.get("result", "")).startswith("fail")]
    if failed:
        raise ConfigError(f"{len(failed)} capture row(s) failed, nothing is proven: {'; '.join(failed)}")
    skipped = [f"{r['name']} ({r['result']})" for r in rows if str(r.get("result", "")).startswith("skip")]
    if skipped and not allow_skip:
        raise ConfigError(f"{len(skipped)} capture row(s) skipped (--allow-skip accepts that): {'; '.join(skipped)}")
    passed = {r["name"] for r in rows if r.get("result") == "pass"}
    parts = [
        name[len(OPTIMIZER_ROW) :].split()[0]
        for name in sorted(passed)
        if name.startswith(OPTIMIZER_ROW) and name.endswith(" captured as its record says")
    ]
    parts = [f"optim.name={p}" for p in parts]
    phases = [r for r in rows if r["name"].startswith(PHASES_ROW)]
    if phases and all(r["name"] in passed for r in phases):
        parts += [p for p in record_parts if p not in parts]
    if not parts:
        raise ConfigError("no capture row that proves a part passed (capture optimizers, capture phases)")
    dali = any(r["name"].startswith(DALI_ROW) for r in rows if r["name"] in passed)
    scope = {k: report[k] for k in SCOPE_KEYS}
    entry = {**scope, "parts": parts, "dali": dali, "skipped": skipped}
    return proofs_.parse_proof(entry, "the proof from the report")


def record_parts() -> tuple[str, ...]:
    """The optimizer and backend of the config the `phases` rows run (gpu_check_capture_probe.CONFIG)."""
    from recipes.config import load_config
    from scripts.gpu_check.gpu_check_capture_probe import CONFIG

    cfg = load_config(Path(__file__).resolve().parents[2] / CONFIG, ["run.device=cpu"])
    return (f"optim.name={cfg.optim.name}", f"comm.backend={cfg.comm.backend}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report", help="the probe's JSON report (gpu_check --parts capture --out FILE)")
    ap.add_argument("--allow-skip", action="store_true", help="a skipped capture row does not fail the proof")
    ap.add_argument(
        "--proofs", default=str(proofs_.PROOFS), help="the proofs file to add to (default: the tracked one)"
    )
    args = ap.parse_args(argv)
    try:
        report = read_json_object(args.report, what="the probe's report", error=ConfigError)
        proof = proof_from_report(report, allow_skip=args.allow_skip, record_parts=record_parts())
        known = proofs_.load_proofs(Path(args.proofs))
    except ConfigError as e:
        print(f"prove: {args.report}: {e}", file=sys.stderr)
        return 1
    data = {"proofs": [proofs_.to_json(p) for p in known if p != proof] + [proofs_.to_json(proof)]}
    write_output(args.proofs, json.dumps(data, indent=1) + "\n", "the GPU proofs file")
    print(f"proven: {', '.join(proof.parts)} on {proof.describe()}; written to {args.proofs}")
    if proof.skipped:
        print(f"skipped in that run: {'; '.join(proof.skipped)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
