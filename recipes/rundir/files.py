"""The names of the files in a run directory (<run.out_dir>/<run.name>), declared once.

Written by the run outputs (recipes/rundir/outputs.py), the checkpoint files
(recipes/rundir/checkpoint_files.py), the run directory (recipes/rundir/directory.py) and the launcher
(scripts/launch.py); read by scripts/compare_runs.py, evaluate.py and `train.py --resume`.
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
NETWORK = "network.json"  # scripts/launch.py: the link probe's figures

# What a directory may hold before its run writes run.json: the lock, previous/, the launcher's logs and probe, and
# TensorBoard's folder (the logger opens it first, so a start refused later, a missing data.root, leaves it behind).
BEFORE_RUN = {LOCK, ARCHIVE, LAUNCH, NETWORK, TENSORBOARD}
RESULTS = (SUMMARY, TSV, ENTRY)  # what a finished run leaves for a person to read
STEP_CHECKPOINT = re.compile(r"^ckpt-(\d+)\.pt$")  # ckpt-<step>.pt: the newest checkpoint.keep are kept
_NAMES = {RUN, LOCK, ARCHIVE, CONFIG, META, PROGRESS, SUMMARY, TSV, ENTRY, CHECKPOINT, TENSORBOARD, LAUNCH, NETWORK}
# The entry's copies under the entries repository's name (recipes/dawnbench.py), and the dot files a run makes:
# temp files of the writer (base/writer.py), the write probe, the ranks' share tokens
# (recipes/rundir/directory.py), the launcher's token (scripts/launcher/job.py).
_PATTERNS = re.compile(
    r"^ckpt-\d+\.pt$|_pytorch(\.not-qualifying)?\.(json|tsv)$|^\..+\.(tmp|link)\d+$|^\.write-probe-\d+$|^\.share-[0-9a-f]+$|^\.launch-token-[0-9-]+$"
)


def step_checkpoint(step: int) -> str:
    """The file name of the checkpoint written after optimizer step `step`."""
    return f"ckpt-{step:08d}.pt"


def sidecar(name: str) -> str:
    return name + SIDECAR_SUFFIX


RUN_ID = re.compile(r"^[0-9A-Za-z_-]{1,64}$")  # run ids name folders (previous/<run id>/): one safe path component


def is_run_file(name: str) -> bool:
    """Whether a run could have made an entry of this name in its directory (a user's file could not be one)."""
    name = name.removesuffix(SIDECAR_SUFFIX)
    return name in _NAMES or bool(_PATTERNS.search(name))
