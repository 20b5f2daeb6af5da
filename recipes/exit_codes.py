"""The exit codes of train.py, evaluate.py and scripts/launch.py, each once, with what it means and what to do.

The runbook's table (docs/reproduce.md, "A run died") is generated from `EXIT_CODES` by
scripts/gen_config_reference.py, and the code returns these names, never a bare number.
"""

from __future__ import annotations

from dataclasses import dataclass

FINISHED = 0
FAILED = 1  # a failure without a code of its own
BAD_INPUT = 2  # ConfigError, DataError, CheckpointError: one `error:` line (recipes/cli.py)
TRAINING_STOPPED = 3  # TrainingError: non-finite loss, a dead or hung peer
PREEMPTED = 75  # EX_TEMPFAIL in sysexits.h, "try again later": the checkpoint of a common step is written
TIMEOUT = 124  # the launcher's --timeout ran out (as coreutils' timeout)
CANNOT_START = 127  # the launcher could not start a host's transport (ssh, srun) (as a shell's "not found")
INTERRUPTED = 130  # the launcher got SIGINT or SIGTERM and stopped every host (128 + SIGINT)
SIGNALLED = 128  # + N: killed by signal N, as a shell reports it
KILLED = SIGNALLED + 9  # SIGKILL


@dataclass(frozen=True)
class ExitCode:
    code: str  # as the table shows it: "137", "128 + N"
    meaning: str
    action: str


EXIT_CODES = (
    ExitCode(str(FINISHED), "finished", "`make compare`, the entry files (section 5)"),
    ExitCode(
        str(FAILED),
        "a failure without a code of its own: a Python error outside the trainer's (its traceback ends the rank's "
        "log), a host that could not be reached (`launch-check:` lines name it)",
        "the log file; fix what it names, then rerun: it resumes from the last checkpoint",
    ),
    ExitCode(
        str(BAD_INPUT),
        "bad input: config value, data, run directory, checkpoint (one `error:` line says which)",
        "fix it; nothing was trained or written",
    ),
    ExitCode(
        str(TRAINING_STOPPED),
        "training stopped: non-finite loss or gradients, a dead or hung peer (`TrainingError`)",
        "see [failures.md](failures.md); rerun resumes from the last checkpoint",
    ),
    ExitCode(
        str(PREEMPTED),
        "preempted: SIGTERM or SIGINT, every rank wrote the checkpoint of the same step",
        "rerun the command the `preempted:` line names",
    ),
    ExitCode(str(TIMEOUT), "the launcher's `--timeout` ran out", "rerun (resumes) with a longer one"),
    ExitCode(
        str(CANNOT_START),
        "the launcher could not start a host's transport (`ssh`, `srun` not found)",
        "install it or choose another `--transport`",
    ),
    ExitCode(
        str(INTERRUPTED),
        "the launcher got Ctrl-C (SIGINT) or SIGTERM and stopped every host; the ranks wrote their checkpoint "
        "(their logs say `preempted:`)",
        "rerun",
    ),
    ExitCode(
        str(KILLED),
        "a rank was killed by SIGKILL: the launcher's failure line names the rank and host, and says whether the "
        "kernel's OOM killer did it (where it can read that host's kernel log), else a `kill -9` or a scheduler "
        "past its grace period; or the launcher, stopped by Ctrl-C or SIGTERM, killed ranks that wrote no "
        "checkpoint within its `--grace` (its `no checkpoint written:` line)",
        "rerun; it resumes from the last checkpoint written before the kill (killed for host memory: fewer "
        "`data.workers` first)",
    ),
    ExitCode(f"{SIGNALLED} + N", "a rank was killed by signal N", f"as {KILLED}"),
)


def table() -> str:
    """The runbook's exit-code table, as Markdown."""
    lines = ["| exit code | meaning | what to do |", "|---|---|---|"]
    lines += [f"| {e.code} | {e.meaning} | {e.action} |" for e in EXIT_CODES]
    return "\n".join(lines)


__all__ = ["EXIT_CODES", "ExitCode", "table"]
