"""What a run directory says, for scripts/compare_runs.py: its summary (or, for an interrupted run, what its
dawnbench.tsv and meta.json give), its per-epoch history and its config, each checked as it is read, through the one
reader, so a file that is not a run's is one line naming it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from base import reader
from base.errors import ConfigError
from recipes.comm.stats import CommStats
from recipes.config.load import MAX_CONFIG_BYTES, parse_yaml
from recipes.rundir import files as run_files


class CompareError(ValueError):
    """A run directory that cannot be read; the message names it."""


@dataclass
class Run:
    path: Path
    summary: dict
    config: dict
    history: list[dict]  # one row per epoch: epoch, train_seconds, top1, top5 (+ wall_seconds, images_per_s)
    interrupted: bool = False  # no summary.json: the summary is rebuilt from the epochs finished
    network: dict | None = None  # the launcher's network.json (link probe), when it ran one

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def world(self) -> int:
        return int(self.summary["world_size"])

    @property
    def comm(self) -> CommStats | None:
        return CommStats.from_dict(self.summary.get("comm"))

    @property
    def planned_epochs(self) -> int | None:
        """The epochs of the run's whole plan: summary.json's, else (an older run) the sum of its config's phases."""
        if self.summary.get("planned_epochs") is not None:
            return int(self.summary["planned_epochs"])
        epochs = [p.get("epochs") for p in self.config.get("phases") or [] if isinstance(p, dict)]
        ints = all(isinstance(e, int) and not isinstance(e, bool) for e in epochs)
        return sum(epochs) if epochs and ints else None

    @property
    def partial(self) -> bool:
        """Stopped before the end of its plan (--stop-after-epochs): its time and images/s cover only its epochs."""
        if self.interrupted:
            return False  # marked "interrupted" instead
        if "partial" in self.summary:
            return bool(self.summary["partial"])
        planned = self.planned_epochs
        return planned is not None and self.summary["epochs"] < planned

    @property
    def whole(self) -> bool:
        return not (self.interrupted or self.partial)

    def mark(self) -> str:
        """'' for a run that ran its whole plan, else what it ran: ' (partial: 3 of 9 epochs)'."""
        planned = f" of {self.planned_epochs}" if self.planned_epochs is not None else ""
        if self.interrupted:
            return f" (interrupted at epoch {self.summary['epochs']}{planned})"
        return f" (partial: {self.summary['epochs']}{planned} epochs)" if self.partial else ""


def _read_tsv(path: Path) -> list[dict]:
    rows = []
    lines = reader.read_text(path, what="the epoch table", error=CompareError).splitlines()
    for n, line in enumerate(lines[1:], 2):
        try:
            epoch, hours, top1, top5 = line.split("\t")
            row = {"epoch": int(epoch), "train_seconds": float(hours) * 3600, "top1": float(top1), "top5": float(top5)}
        except ValueError:
            raise CompareError(f"{path}: line {n} is not 'epoch hours top1 top5' (tab-separated numbers)") from None
        rows.append(row)
    return _check_history(path, rows)


def _read_json(path: Path) -> dict:
    return reader.read_json_object(path, what="run file", error=CompareError)


# What compare_runs reads of a summary.json: each a finite number >= 0 or null.
_SUMMARY_NUMBERS = (
    "epochs", "steps", "world_size", "wall_seconds", "train_seconds", "time_to_target_seconds", "epoch_at_target",
    "final_top1", "final_top5", "images_per_s", "val_count", "val_excluded", "skipped_steps", "last_step_logged",
    "planned_epochs", "planned_steps",
)  # fmt: skip


def _is_count(v) -> bool:
    return v is None or (not isinstance(v, bool) and isinstance(v, (int, float)) and 0 <= v < 1e18)


def _check_history(path: Path, history) -> list[dict]:
    if not isinstance(history, list) or not all(isinstance(r, dict) for r in history):
        raise CompareError(f"{path}: 'history' must be a list of per-epoch objects")
    for i, row in enumerate(history):
        for key in ("epoch", "train_seconds", "top1", "top5", "wall_seconds", "images_per_s"):
            if not _is_count(row.get(key)):
                raise CompareError(f"{path}: history[{i}].{key}: expected a number >= 0, got {row.get(key)!r}")
        if row.get("epoch") is None or row.get("train_seconds") is None:
            raise CompareError(f"{path}: history[{i}]: expected 'epoch' and 'train_seconds'")
    return history


def _check_summary(path: Path, summary: dict) -> dict:
    """`summary` when every value compare_runs reads has the type train.py writes; else one CompareError line."""
    for key in _SUMMARY_NUMBERS:
        if not _is_count(summary.get(key)):
            raise CompareError(f"{path}: '{key}': expected a number >= 0 or null, got {summary.get(key)!r}")
    if summary.get("world_size") is not None and (summary["world_size"] < 1 or summary["world_size"] % 1):
        raise CompareError(f"{path}: 'world_size': expected an integer >= 1, got {summary['world_size']!r}")
    if summary.get("history") is not None:
        _check_history(path, summary["history"])
    if summary.get("comm_backend") is not None and not isinstance(summary["comm_backend"], str):
        raise CompareError(f"{path}: 'comm_backend': expected a backend name, got {_short(summary['comm_backend'])}")
    comm = summary.get("comm")
    fields = ("steps", "comm_seconds", "wait_seconds", "bytes")
    if comm is not None and (
        not isinstance(comm, dict)
        or not isinstance(comm.get("backend", ""), str)
        or not isinstance(comm.get("settings", {}), dict)
        or not all(_is_count(comm.get(k)) for k in fields)
    ):
        raise CompareError(f"{path}: 'comm': not the allreduce statistics train.py writes (CommStats)")
    return summary


def _world_size(path: Path, meta: dict) -> int:
    """meta.json's process count (1 when it has none): an integer >= 1, or one CompareError line naming the file."""
    n = meta.get("world_size")
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 1 << 20:
        raise CompareError(f"{path}: 'world_size': expected an integer in [1, 1,048,576], got {_short(n)}")
    return n


def _interrupted_summary(path: Path, history: list[dict]) -> dict:
    """What summary.json would say of the epochs an interrupted run finished (meta.json gives the processes)."""
    meta = _read_json(path / run_files.META) if (path / run_files.META).is_file() else {}
    progress = _read_json(path / run_files.PROGRESS) if (path / run_files.PROGRESS).is_file() else {}
    last = history[-1]
    return {
        "epochs": last["epoch"],
        "steps": None,  # progress.json counts steps past the last epoch: not the steps of these epochs
        "last_step_logged": progress.get("step"),
        "world_size": _world_size(path / run_files.META, meta),
        "wall_seconds": last.get("wall_seconds"),
        "train_seconds": last["train_seconds"],
        "images_per_s": last.get("images_per_s"),
        "final_top1": last["top1"],
        "final_top5": last["top5"],
        "val_count": last.get("val_count"),
    }


def _read_config(path: Path) -> dict:
    """A run's config.yaml, parsed as the config loader parses YAML (no aliases, depth and size bounded), each
    section a mapping and `phases` a list of mappings, as train.py writes it."""
    try:
        text = reader.read_text(path, what="run config", error=CompareError, max_bytes=MAX_CONFIG_BYTES)
        config = parse_yaml(text) or {}
    except yaml.YAMLError:
        raise CompareError(f"{path}: not valid YAML (or nested or repeated beyond a config's size)") from None
    except ConfigError as e:  # the loader's own bounds (aliases, depth, numbers): its line says which
        raise CompareError(f"{path}: {e}") from None
    if not isinstance(config, dict):
        raise CompareError(f"{path}: expected a mapping of config sections")
    for key, value in config.items():
        if key == "phases":
            if not isinstance(value, list) or not all(isinstance(p, dict) for p in value):
                raise CompareError(f"{path}: 'phases': expected a list of mappings (one per phase)")
        elif not isinstance(key, str) or not isinstance(value, dict):
            raise CompareError(f"{path}: section '{str(key)[:40]}': expected a mapping, got {_short(value)}")
    return config


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def load_run(path: str | Path) -> Run:
    path = Path(path)
    if not path.is_dir():
        raise CompareError(f"{path}: not a directory")
    summary_path, config_path, tsv = path / run_files.SUMMARY, path / run_files.CONFIG, path / run_files.TSV
    config = _read_config(config_path) if config_path.is_file() else {}
    network = _read_json(path / run_files.NETWORK) if (path / run_files.NETWORK).is_file() else None
    if not summary_path.is_file():
        history = _read_tsv(tsv) if tsv.is_file() else []
        if not history:
            raise CompareError(
                f"{path}: no summary.json (not a run directory, or the run has not finished) and no finished epoch "
                "in dawnbench.tsv"
            )
        summary = _check_summary(path / run_files.PROGRESS, _interrupted_summary(path, history))
        return Run(path, summary, config or {}, history, True, network)
    summary = _check_summary(summary_path, _read_json(summary_path))
    history = summary.get("history")
    if history is None and tsv.is_file():
        history = _read_tsv(tsv)
    return Run(path, summary, config or {}, history or [], False, network)
