"""What a training writes into its run directory, written by one object (`RunOutputs`).

The file names are `recipes.rundir.files`. Rank 0 writes the run's description and results; the leader of each
distinct run directory (one per host with a disk of its own) writes the run file (and, through the `Checkpointer`,
the checkpoints), so every host keeps a copy.

    start of the run    run.json (leader, after the resume checks), config.yaml, meta.json (rank 0)
    every log window    progress.json: the last logged step (how many steps a restart redoes), the window's metrics
    every epoch         dawnbench.tsv, a checkpoint (ckpt-<step>.pt and checkpoint.pt)
    end of the run      summary.json, dawnbench.json
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from base.writer import write_atomic, write_json
from recipes.config import Config, to_yaml
from recipes.dawnbench import write_entry
from recipes.distributed import DistInfo
from recipes.environment import collect
from recipes.rundir import files
from recipes.rundir.directory import write_run_file

TSV_HEADER = "epoch\thours\ttop1Accuracy\ttop5Accuracy\n"


def git_commit(where: Path | None = None) -> str:
    """The repository's commit, with `-dirty` when a tracked file differs from it; `unknown` outside git.

    Untracked files do not count: the documented hosts.txt, a bad_files.tsv, a plot are not part of the code."""
    here = where or Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, cwd=here)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=here,
        ).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


class RunOutputs:
    """The files of one run directory; each method writes only on the rank that owns the file."""

    def __init__(self, run_dir: Path, dist: DistInfo, leader: bool):
        self.dir, self.dist, self.leader = Path(run_dir), dist, leader

    def start(self, cfg: Config, run_id: str) -> None:
        if self.leader:
            write_run_file(self.dir, run_id)
        if self.dist.is_main:
            write_atomic(self.dir / files.CONFIG, to_yaml(cfg))
            meta = {
                "git_commit": git_commit(),
                "world_size": self.dist.world_size,
                "device": str(self.dist.device),
                "torch": torch.__version__,
                "run_id": run_id,
                # CUDA, cuDNN, NCCL, DALI, driver, GPU model and count, provider and instance type (when known)
                "environment": collect().to_dict(),
            }
            write_json(self.dir / files.META, meta)

    def progress(self, step: int, epoch: int, window: dict | None = None, wall_seconds: float | None = None) -> None:
        """`window`: the log window's metrics by name (recipes/metrics.py), beside the step; `wall_seconds`: the
        run's wall time at this step (what a restart loses: summary.json's lost_seconds)."""
        if self.dist.is_main:
            # a hint (how many steps a restart redoes), written every log window: no fsync stalling the loop
            wall = {} if wall_seconds is None else {"wall_seconds": wall_seconds}
            value = {"step": step, "epoch": epoch, **wall, **(window or {})}
            self._keep_going(self._hint, self.dir / files.PROGRESS, value)

    def history(self, rows: list[dict]) -> None:
        if self.dist.is_main:
            self._keep_going(write_tsv, self.dir / files.TSV, rows)

    @staticmethod
    def _hint(path: Path, value: dict) -> None:
        write_json(path, value, None, durable=False)

    @staticmethod
    def _keep_going(write, path: Path, *args) -> None:
        """Write a file the run can go on without (a full disk must not cost the epoch's checkpoint, which follows
        and reports the full disk itself); the previous complete file stays."""
        try:
            write(path, *args)
        except OSError as e:
            print(f"warning: writing '{path}' failed: {e.strerror or e}; the previous version is kept", file=sys.stderr)

    def finish(self, cfg: Config, summary: dict) -> None:
        if self.dist.is_main:
            write_json(self.dir / files.SUMMARY, summary)
            write_entry(self.dir / files.ENTRY, cfg, summary, self.dist, commit=git_commit())


def write_tsv(path: Path, rows: list[dict]) -> None:
    """DAWNBench TSV: epoch (1-based), cumulative training hours (no validation/checkpointing), top-1/top-5 %."""
    lines = [TSV_HEADER]
    for r in rows:
        lines.append(f"{r['epoch']}\t{r['train_seconds'] / 3600:.6f}\t{r['top1']:.2f}\t{r['top5']:.2f}\n")
    write_atomic(path, "".join(lines))
