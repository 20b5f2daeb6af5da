"""The names of the files in a run directory (<run.out_dir>/<run.name>), declared once.

Written by the run outputs (recipes/run/outputs.py), the checkpoint files (recipes/run/checkpoint_files.py), the run
directory (recipes/run/directory.py) and the launcher (scripts/launch.py); read by scripts/compare_runs.py,
evaluate.py and `train.py --resume`.
"""

from __future__ import annotations

import re

RUN = "run.json"  # the run id, when and where the run started
LOCK = ".lock"  # held (flock) by the training that writes here; says who holds it
ARCHIVE = "previous"  # runs set aside by checkpoint.resume=false: previous/<run id>/
CONFIG = "config.yaml"  # the resolved config of the run
META = "meta.json"  # git commit, world size, device, torch version
PROGRESS = "progress.json"  # the last logged step (how many steps a restart redoes)
SUMMARY = "summary.json"  # the end-of-run summary, with the per-epoch history and the allreduce CommStats
TSV = "dawnbench.tsv"  # DAWNBench's epoch/hours/top1/top5 table
ENTRY = "dawnbench.json"  # the DAWNBench submission entry
CHECKPOINT = "checkpoint.pt"  # the newest checkpoint (a link to ckpt-<step>.pt)
SIDECAR_SUFFIX = ".sha256"  # <checkpoint>.sha256: the digests a checkpoint must match
TENSORBOARD = "tb"  # TensorBoard event files
LAUNCH = "launch"  # scripts/launch.py: each host's output

RESULTS = (SUMMARY, TSV, ENTRY)  # what a finished run leaves for a person to read
STEP_CHECKPOINT = re.compile(r"^ckpt-(\d+)\.pt$")  # ckpt-<step>.pt: the newest checkpoint.keep are kept


def step_checkpoint(step: int) -> str:
    """The file name of the checkpoint written after optimizer step `step`."""
    return f"ckpt-{step:08d}.pt"


def sidecar(name: str) -> str:
    return name + SIDECAR_SUFFIX
