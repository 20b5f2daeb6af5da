"""The names of the files in a run directory (<run.out_dir>/<run.name>), declared once.

Written by the run outputs (recipes/outputs.py), the checkpoint code (recipes/checkpoint.py) and the launcher
(scripts/launch.py); read by scripts/compare_runs.py, evaluate.py and `train.py --resume`.
"""

from __future__ import annotations

CONFIG = "config.yaml"  # the resolved config of the run
META = "meta.json"  # git commit, world size, device, torch version
PROGRESS = "progress.json"  # the last logged step (how many steps a restart redoes)
SUMMARY = "summary.json"  # the end-of-run summary, with the per-epoch history and the allreduce CommStats
TSV = "dawnbench.tsv"  # DAWNBench's epoch/hours/top1/top5 table
ENTRY = "dawnbench.json"  # the DAWNBench submission entry
CHECKPOINT = "checkpoint.pt"  # the newest checkpoint (a link to ckpt-<step>.pt)
TENSORBOARD = "tb"  # TensorBoard event files
LAUNCH = "launch"  # scripts/launch.py: each host's output

RESULTS = (SUMMARY, TSV, ENTRY)  # what a finished run leaves for a person to read
