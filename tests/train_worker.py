"""Several training runs in turn in one process (one rank under torchrun or horovodrun), so that a test of many
configurations pays for the interpreter, torch and the rendezvous once (tests/e2e/test_shipped_configs.py).

    python tests/train_worker.py JOBS.json

JOBS.json is a list of {"id", "config", "overrides", "run_dir"}: each is `train.py -c config overrides...
--run-dir run_dir`, run through `recipes.trainer.train`. A job with "two_layer": true may name tests/support.py's
TWO_LAYER network as model.name (registered as the `two_layer_model` fixture registers it in-process).
Each rank writes <run_dir>/rank<r>.json: the summary and what rank 0 printed, or the exception; the first exception
stops the worker (its peers then fail fast in their next collective, and the tests name the run that failed first).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from recipes.config import load_config  # noqa: E402
from recipes.trainer import train  # noqa: E402

# What a run under horovodrun derives from Horovod's environment when it starts (recipes/comm/horovod_backend.py):
# cleared between runs so that each one meets its peers at a new port, as a fresh process would.
HOROVOD_DERIVED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def run_one(job: dict, index: int, horovod: bool) -> dict:
    if horovod:
        for name in HOROVOD_DERIVED:
            os.environ.pop(name, None)
    else:
        # torchrun's store outlives each run's process group: a new namespace per run, as a restart gets one
        # (recipes/distributed.py: generation_id).
        os.environ["TORCHELASTIC_RESTART_COUNT"] = str(index)
    if job.get("two_layer"):
        import pytest
        from support import register_two_layer

        register_two_layer(pytest.MonkeyPatch())  # for the rest of this process
    cfg = load_config(ROOT / job["config"], job["overrides"])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        summary = train(cfg, job["run_dir"])
    sys.stdout.write(out.getvalue())
    sys.stderr.write(err.getvalue())
    return {"summary": summary, "stdout": out.getvalue(), "stderr": err.getvalue()}


def main(jobs_file: str) -> int:
    jobs = json.loads(Path(jobs_file).read_text())
    horovod = "HOROVOD_RANK" in os.environ and "RANK" not in os.environ
    rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("RANK", "0")))
    for i, job in enumerate(jobs):
        print(f"=== {job['id']}", flush=True)
        try:
            result = run_one(job, i, horovod)
        except BaseException:
            result = {"exception": traceback.format_exc()}
        Path(job["run_dir"]).mkdir(parents=True, exist_ok=True)
        (Path(job["run_dir"]) / f"rank{rank}.json").write_text(json.dumps(result, default=str))
        if "exception" in result:
            print(result["exception"], file=sys.stderr, flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
