"""The errors a user can act on, at the bottom of the import graph (data/ and models/ raise them too).

The entry points turn `ConfigError`, `DataError` and `CheckpointError` into exit code 2 and one `error:` line,
and `TrainingError` (with `CommError` and `PlanMismatchError`) into exit code 3 (recipes/cli.py); a run stopped by
SIGTERM or SIGINT ends with `Preempted` and exit code 75 (recipes/preemption.py). This module is the one import path
of every error class.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem a user can fix; the message names the key and what was expected."""


class DataError(RuntimeError):
    """A dataset problem a user can fix; the message names the path."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used or written; the message names the file."""


class TrainingError(RuntimeError):
    """Training cannot go on (non-finite loss, a dead or hung peer); the message says where and why."""


class NonFiniteError(TrainingError):
    """A model whose outputs are not finite numbers: evaluating it would report a meaningless accuracy."""


class RunDirError(CheckpointError):
    """The run directory is in use, or holds a run that this start must not mix with; the message says which."""


class DeviceError(ConfigError):
    """`run.device` asks for a device this machine does not have."""


class CommError(TrainingError):
    """A collective failed or timed out (a dead or stalled peer)."""


class PlanMismatchError(TrainingError):
    """Ranks derived different fusion plans (different models, configs or code versions)."""


class Preempted(Exception):
    """SIGTERM/SIGINT stopped the run at a step boundary, after its checkpoint; the message says where."""
