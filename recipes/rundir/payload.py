"""What a checkpoint holds, typed: `Checkpointer.save` writes a `Checkpoint`, and every reader (resume, evaluate.py,
the latency protocol, the ONNX export) reads its attributes instead of key strings.

On disk a checkpoint is a dict of plain types (tensors, numbers, strings, lists, dicts), so that
`torch.load(weights_only=True)` reads it; `Checkpoint.to_dict` and `Checkpoint.from_dict` are the only code that
knows its keys, and `check_structure` the only code that says what each must be.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from base.errors import CheckpointError
from recipes.rundir import files


@dataclass
class State:
    """Everything that a resume must restore besides the modules' own state_dicts."""

    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps taken
    train_seconds: float = 0.0  # training time only (DAWNBench excludes validation and checkpointing)
    wall_seconds: float = 0.0
    images: int = 0  # training images processed, all ranks
    history: list = field(default_factory=list)  # one dict per epoch: epoch, train_seconds, top1, top5, ...
    skipped_steps: int = 0
    epoch_step: int = 0  # steps done inside the current epoch (mid-epoch checkpoint = data position)
    epoch_seconds: float = 0.0  # training time already spent in the current epoch
    epoch_images: int = 0
    restarts: int = 0  # recoveries from a checkpoint after a failure
    redone_steps: int = 0  # steps trained twice because they came after the last checkpoint
    lost_seconds: float = 0.0  # wall time of the work a failure threw away (checkpoint to the last logged step)
    forced: list = field(default_factory=list)  # recipe differences accepted with checkpoint.resume=force


_FIELDS = dataclasses.fields(State)
STATE_FIELDS = frozenset(f.name for f in _FIELDS)


@dataclass
class ModelInfo:
    """What a reader needs to rebuild the model without the training data: its name and class list."""

    name: str | None = None
    num_classes: int | None = None
    classes: list | None = None
    num_params: int | None = None


# Entry -> (type, what it must be). `model` is required; the others are checked when present.
_ENTRIES = {
    "model": (dict, "a mapping of parameter names to tensors"),
    "optimizer": (dict, "an optimizer state_dict (a mapping)"),
    "scaler": (dict, "a GradScaler state_dict (a mapping)"),
    "comm": (dict, "a mapping"),
    "state": (dict, "a mapping of training progress"),
    "rng": (list, "a list of per-rank RNG states"),
    "bn_per_rank": (list, "a list of per-rank BN running statistics"),
    "config": (dict, "a config mapping"),
    "model_info": (dict, "a mapping with num_classes and classes"),
    "ema": (dict, "a mapping of parameter names to tensors (the EMA weights, run.ema)"),
    "ema_bn_per_rank": (list, "a list of per-rank BN running statistics of the EMA"),
}
RESUME_ENTRIES = ("optimizer", "scaler", "state", "rng")


def check_structure(state, path: str | Path) -> None:
    """Raise CheckpointError naming the file and entry when `state` is not shaped like this trainer's checkpoint:
    every entry present is checked (type, range, consistency) before any reader uses it."""
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"checkpoint '{path}' has no 'model' entry: not a checkpoint of this trainer")
    for key, (tp, what) in _ENTRIES.items():
        if state.get(key) is not None and not isinstance(state[key], tp):
            got = type(state[key]).__name__
            raise CheckpointError(f"checkpoint '{path}': entry '{key}' must be {what}, got {got}")
    for key in ("model", "ema"):
        entry = state.get(key) or {}
        bad = [k for k, v in entry.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
        if bad:
            raise CheckpointError(f"checkpoint '{path}': entry '{key}' must map names to tensors ('{bad[0]}' does not)")
    for key, check in _CHECKS.items():
        if state.get(key) is not None and (problem := check(state[key], state)):
            raise CheckpointError(f"checkpoint '{path}': entry '{key}' {problem}")


def _count(v, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _seconds(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


_STATE_TYPES = {f.name: (list if f.type == "list" else float if f.type == "float" else int) for f in _FIELDS}


def _check_state(st: dict, _) -> str | None:
    for name, value in st.items():
        kind = _STATE_TYPES.get(name)
        if kind is None:
            return f"has unknown field '{name}'"
        ok = {int: _count, float: _seconds, list: lambda v: isinstance(v, list)}[kind](value)
        if not ok:
            want = {int: "an integer >= 0", float: "a finite number >= 0", list: "a list"}[kind]
            return f"field '{name}' must be {want}, got {_short(value)}"
    if any(not isinstance(row, dict) for row in st.get("history", [])):
        return "field 'history' must be a list of mappings (one per epoch)"
    return None


def _check_world_size(n, _) -> str | None:
    return None if _count(n, 1) else f"must be an integer >= 1 (processes), got {_short(n)}"


def _check_num_train(n, _) -> str | None:
    return None if _count(n, 1) else f"must be an integer >= 1 (training images), got {_short(n)}"


def _check_run_id(r, _) -> str | None:
    ok = isinstance(r, str) and files.RUN_ID.match(r)
    return None if ok else f"must be letters, digits, '_' or '-' (at most 64), got {_short(r)}"


def _per_rank(entries: list, d: dict) -> str | None:
    n = d.get("world_size")
    if _count(n, 1) and len(entries) != n:
        return f"has {len(entries)} per-rank item(s), but the checkpoint was written by {n} process(es)"
    return None


def _check_rng(rngs: list, d: dict) -> str | None:
    for rank, r in enumerate(rngs):
        if problem := rng_problem(r):
            return f"item {rank} {problem}"
    return _per_rank(rngs, d)


def _check_bn(stats: list, d: dict) -> str | None:
    for rank, s in enumerate(stats):
        if s is None:
            continue
        if not isinstance(s, dict) or any(
            not isinstance(k, str) or not isinstance(v, torch.Tensor) for k, v in s.items()
        ):
            return f"item {rank} must map buffer names to tensors"
    return _per_rank(stats, d)


def _check_model_info(info: dict, _) -> str | None:
    n, classes = info.get("num_classes"), info.get("classes")
    if n is not None and not _count(n, 1):
        return f"field 'num_classes' must be an integer >= 1, got {_short(n)}"
    if classes is not None and (not isinstance(classes, list) or not all(isinstance(c, str) for c in classes)):
        return "field 'classes' must be a list of class names"
    if n is not None and classes is not None and len(classes) != n:
        return f"lists {len(classes)} classes, but its 'num_classes' is {n}"
    if info.get("name") is not None and not isinstance(info["name"], str):
        return f"field 'name' must be a model name, got {_short(info['name'])}"
    if info.get("num_params") is not None and not _count(info["num_params"]):
        return f"field 'num_params' must be an integer >= 0, got {_short(info['num_params'])}"
    return None


def _check_optimizer(o: dict, _) -> str | None:
    if not isinstance(o.get("state"), dict) or not isinstance(o.get("param_groups"), list):
        return "must be an optimizer state_dict (a mapping with 'state' and 'param_groups')"
    if not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in o["param_groups"]):
        return "has a parameter group that is not a mapping with 'params'"
    return None


_CHECKS = {
    "state": _check_state,
    "world_size": _check_world_size,
    "num_train": _check_num_train,
    "run_id": _check_run_id,
    "rng": _check_rng,
    "bn_per_rank": _check_bn,
    "ema_bn_per_rank": _check_bn,
    "model_info": _check_model_info,
    "optimizer": _check_optimizer,
}


def rng_problem(r) -> str | None:
    """What is wrong with one rank's RNG state (`checkpoint_files.rng_state`), tried on fresh generators (None: ok)."""
    if not isinstance(r, dict) or not {"python", "numpy", "torch"} <= set(r):
        return "must be a mapping with 'python', 'numpy' and 'torch' RNG states"
    try:
        version, mt, gauss = r["python"]
        if gauss is not None and not isinstance(gauss, float):
            raise TypeError("gauss")
        random.Random().setstate((version, tuple(mt), gauss))
    except (TypeError, ValueError, OverflowError):
        return "has a 'python' RNG state that Python's random module rejects"
    n = r["numpy"]
    try:
        if not (
            _count(n["pos"]) and n["pos"] <= 624 and _count(n["has_gauss"]) and _seconds(abs(n["cached_gaussian"]))
        ):
            raise ValueError("position or cached value")
        keys = n["keys"].numpy().astype(np.uint32)
        np.random.RandomState().set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError, RuntimeError):
        return "has a 'numpy' RNG state that NumPy rejects"
    try:
        torch.Generator().set_state(r["torch"])
    except (TypeError, ValueError, RuntimeError):
        return "has a 'torch' RNG state that torch rejects"
    cuda = r.get("cuda")
    if cuda is not None and (not isinstance(cuda, list) or not all(isinstance(t, torch.Tensor) for t in cuda)):
        return "has a 'cuda' RNG state that is not a list of tensors"
    return None


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass
class Checkpoint:
    """One checkpoint. Optional entries are None in checkpoints that predate them (or, for `bn_per_rank`, in
    checkpoints written at an epoch end or by one rank)."""

    model: dict  # the model's state_dict
    optimizer: dict | None = None
    scaler: dict | None = None
    comm: dict | None = None  # the allreduce backend's tuned settings
    state: dict | None = None  # a `State` as a dict (`training_state` checks and converts it)
    rng: list | None = None  # every rank's RNG state (`checkpoint_files.rng_state`)
    config: dict | None = None  # the resolved config of the run (`recipes.config.to_dict`)
    run_id: str | None = None
    world_size: int | None = None
    num_train: int | None = None
    model_info: ModelInfo | None = None
    bn_per_rank: list | None = None  # every rank's BN running statistics (a mid-epoch checkpoint of several ranks)
    ema: dict | None = None  # the EMA's state_dict (run.ema), names as the model's
    ema_bn_per_rank: list | None = None  # the EMA's BN running statistics per rank, like `bn_per_rank`
    path: str = ""  # where it was read from (not written)

    @classmethod
    def from_dict(cls, d: dict, path: str | Path) -> Checkpoint:
        check_structure(d, path)
        info = d.get("model_info")
        known = {f.name for f in dataclasses.fields(ModelInfo)}
        return cls(
            model=d["model"],
            optimizer=d.get("optimizer"),
            scaler=d.get("scaler"),
            comm=d.get("comm"),
            state=d.get("state"),
            rng=d.get("rng"),
            config=d.get("config"),
            run_id=d.get("run_id"),
            world_size=d.get("world_size"),
            num_train=d.get("num_train"),
            model_info=ModelInfo(**{k: v for k, v in info.items() if k in known}) if info is not None else None,
            bn_per_rank=d.get("bn_per_rank"),
            ema=d.get("ema"),
            ema_bn_per_rank=d.get("ema_bn_per_rank"),
            path=str(path),
        )

    def to_dict(self) -> dict:
        """The file format (plain types only)."""
        optional = {"bn_per_rank": self.bn_per_rank, "ema": self.ema, "ema_bn_per_rank": self.ema_bn_per_rank}
        extra = {k: v for k, v in optional.items() if v is not None}
        return {
            **extra,
            "model": self.model,
            "optimizer": self.optimizer,
            "scaler": self.scaler,
            "comm": self.comm,
            "state": self.state,
            "rng": self.rng,
            "config": self.config,
            "run_id": self.run_id,
            "world_size": self.world_size,
            "num_train": self.num_train,
            "model_info": dataclasses.asdict(self.model_info) if self.model_info is not None else None,
        }

    @property
    def step(self) -> int:
        """The optimizer steps it was written after (0 when it holds no training state: `training_state` says so)."""
        return int(self.state.get("step", 0)) if self.state is not None else 0

    @property
    def ranks(self) -> int:
        """How many processes wrote it (checkpoints before `world_size` was recorded: one RNG state per rank)."""
        return self.world_size if self.world_size is not None else len(self.rng or [])

    def training_state(self) -> State:
        """The `State` to continue from: every entry a resume needs is there and its fields are known."""
        missing = [k for k in RESUME_ENTRIES if getattr(self, k) is None]
        if missing:
            raise CheckpointError(f"checkpoint '{self.path}' cannot be resumed: no '{missing[0]}' entry")
        check_structure(self.to_dict(), self.path)  # a Checkpoint built in memory is held to the file's rules
        lacking = [k for k in ("epoch", "step") if k not in self.state]
        if lacking:
            raise CheckpointError(f"checkpoint '{self.path}' cannot be resumed: entry 'state' has no '{lacking[0]}'")
        if not self.rng:
            raise CheckpointError(f"checkpoint '{self.path}' cannot be resumed: entry 'rng' is empty")
        return State(**self.state)

    def require_model_info(self) -> ModelInfo:
        """The config and class list an evaluation needs (a checkpoint of another trainer has neither)."""
        if self.config is None or self.model_info is None:
            raise CheckpointError(f"checkpoint '{self.path}' has no config: not written by this trainer")
        missing = [k for k in ("num_classes", "classes") if getattr(self.model_info, k) is None]
        if missing:
            raise CheckpointError(
                f"checkpoint '{self.path}': entry 'model_info' has no {' or '.join(repr(k) for k in missing)}: "
                "an evaluation needs the class list the model was trained on"
            )
        return self.model_info

    def ema_weights(self) -> Checkpoint:
        """This checkpoint with its EMA weights (run.ema) in place of the model's, for evaluate.py --ema."""
        if self.ema is None:
            raise CheckpointError(f"checkpoint '{self.path}' has no EMA weights (it was trained with run.ema=false)")
        return dataclasses.replace(self, model=self.ema, bn_per_rank=self.ema_bn_per_rank)

    def non_finite_weights(self) -> tuple[int, int, str | None]:
        """(non-finite values, all values, first tensor holding one) over the model's floating-point tensors."""
        bad = total = 0
        first = None
        for name, t in self.model.items():
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                n = int((~torch.isfinite(t)).sum())
                bad, total = bad + n, total + t.numel()
                if n and first is None:
                    first = name
        return bad, total, first
