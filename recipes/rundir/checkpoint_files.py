"""Checkpoints: written atomically with a checksum, the last K kept, a damaged one detected and skipped.

Layout in the run directory: `ckpt-<step>.pt` (+ `ckpt-<step>.pt.sha256`) for the last `checkpoint.keep`
checkpoints, and `checkpoint.pt`, a hard link to the newest complete one (what users hand to evaluate.py).
A write goes to a temp file that is fsynced and renamed, so a crash or a full disk never replaces a good
checkpoint with a partial one. A `.sha256` sidecar is written *before* the rename and lists the digests of both
the old and the new file until the rename is done, so an interrupt at any point leaves a file that verifies.
Checkpoints hold plain types only (tensors, numbers, strings, lists, dicts): `torch.load(weights_only=True)`
reads them.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import random
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from base import reader
from base.errors import CheckpointError
from base.writer import refuse_link, temp_path, write_atomic
from recipes.rundir import files
from recipes.rundir.payload import Checkpoint, check_structure

CHECKPOINT_NAME = files.CHECKPOINT
SHA256 = re.compile(r"[0-9a-f]{64}")


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_name(files.sidecar(path.name))


def _sidecar_digests(path: Path) -> list[str]:
    side = _sidecar(path)
    if not side.is_file():
        return []
    text = reader.read_text(side, what="checkpoint sidecar", error=CheckpointError, max_bytes=64 * 1024)
    digests = [line.split()[0] for line in text.splitlines() if line.strip()]
    bad = [d for d in digests if not SHA256.fullmatch(d)]
    if bad:
        raise CheckpointError(f"checkpoint sidecar '{side}' holds {bad[0][:20]!r}: expected sha256 digests (64 hex)")
    return digests


def _replace_verified(src: Path, path: Path, digest: str) -> None:
    """Rename `src` (whose sha256 is `digest`) over `path`; the sidecar accepts old and new while it happens."""
    refuse_link(path)
    old = _sidecar_digests(path)[:1] if path.exists() else []
    lines = "".join(f"{d}  {path.name}\n" for d in [digest, *old])
    write_atomic(_sidecar(path), lines)
    os.replace(src, path)
    if old:
        write_atomic(_sidecar(path), f"{digest}  {path.name}\n")


def save_atomic(state: dict, path: str | Path) -> str:
    """Write `state` to `path` (old complete file or new complete file, never a mix); returns its sha256."""
    path = Path(path)
    data = to_bytes(state)
    digest = hashlib.sha256(data).hexdigest()
    refuse_link(path)
    tmp = temp_path(path)
    tmp.unlink(missing_ok=True)
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _replace_verified(tmp, path, digest)
    finally:
        if tmp.exists():
            tmp.unlink()
    return digest


def verify(path: Path) -> None:
    """Raise CheckpointError when `path` matches no digest of its .sha256 sidecar (when there is one)."""
    expected = _sidecar_digests(path)
    if not expected:
        return
    actual = _digest(path)
    if actual not in expected:
        raise CheckpointError(f"checkpoint '{path}' is damaged: sha256 {actual[:12]}... != {expected[0][:12]}...")


def load(path: str | Path, check: bool = True) -> dict:
    path = Path(path)
    if not os.path.lexists(path):
        raise CheckpointError(f"checkpoint '{path}' not found")
    if not path.is_file():  # a FIFO would hang torch.load, a folder be its own traceback
        raise CheckpointError(f"checkpoint '{path}' is not a regular file (a folder, FIFO or device)")
    if check:
        verify(path)
    try:
        # weights_only: the unpickler builds tensors and plain values only, so a planted file cannot run code.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        text = str(e)
        found = re.search(r"GLOBAL ([\w.]+)", text)
        operand = re.search(r"Unsupported operand (\d+)", text)
        if found or (operand and int(operand.group(1)) in _CODE_OPCODES):
            what = f" ({found.group(1)})" if found else ""
            raise CheckpointError(
                f"checkpoint '{path}' refused: it holds objects other than tensors and plain values{what}, "
                "which would run code when loaded"
            ) from None
        why = f"unsupported pickle opcode {operand.group(1)}" if operand else "a pickle the weights-only loader rejects"
        raise CheckpointError(f"checkpoint '{path}' cannot be read: not a torch checkpoint ({why})") from None
    except Exception as e:  # torch raises several types for a damaged file
        raise CheckpointError(f"checkpoint '{path}' cannot be read: {first_line(e)}") from None
    check_structure(state, path)
    return state


def load_checkpoint(path: str | Path) -> Checkpoint:
    """The checkpoint at `path`, verified against its sidecar, read weights-only and typed."""
    return Checkpoint.from_dict(load(path), path)


# Pickle opcodes that import or call something (GLOBAL, STACK_GLOBAL, REDUCE, INST, OBJ, NEWOBJ, NEWOBJ_EX): the
# weights-only unpickler stops at them; any other unsupported opcode is a damaged or foreign file.
_CODE_OPCODES = {ord("c"), 0x93, ord("R"), ord("i"), ord("o"), 0x81, 0x92}


def first_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0][:300] if lines else type(e).__name__


def step_checkpoints(run_dir: Path) -> list[Path]:
    """`ckpt-<step>.pt` files in the run directory, newest first."""
    if not run_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if (m := files.STEP_CHECKPOINT.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


_ANY = object()


def load_latest(
    run_dir: Path, warn=lambda msg: print(f"warning: {msg}", file=sys.stderr), run_id=_ANY
) -> tuple[dict, Path] | None:
    """The newest checkpoint that verifies and loads; damaged ones are reported and skipped.

    With `run_id`, only checkpoints of that run are candidates (None: checkpoints that carry no run id).
    """
    candidates = step_checkpoints(run_dir)
    legacy = run_dir / CHECKPOINT_NAME
    if not candidates and legacy.is_file():
        candidates = [legacy]
    for path in candidates:
        try:
            state = load(path)
        except CheckpointError as e:
            warn(f"{e}; falling back to the previous checkpoint")
            continue
        if run_id is not _ANY and state.get("run_id") != run_id:
            continue  # another run's file (e.g. copied in): never a candidate
        return state, path
    return None


def to_bytes(state: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def from_bytes(data: bytes, what: str) -> dict:
    """A checkpoint received from another rank (plain types only: weights_only)."""
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"checkpoint {what} cannot be read: {e}") from None


def save_step_checkpoint(state: dict, run_dir: Path, step: int, keep: int) -> Path:
    """Write `ckpt-<step>.pt`, point checkpoint.pt at it, delete all but the newest `keep`."""
    path = run_dir / files.step_checkpoint(step)
    if path.is_file() and not path.is_symlink() and (other := run_of(path)) != state.get("run_id"):
        aside = set_aside(path, other)
        print(
            f"warning: '{path}' is not this run's checkpoint: moved to '{aside}' (kept, not resumed from)",
            file=sys.stderr,
        )
    try:
        save_atomic(state, path)
    except OSError as e:
        last = step_checkpoints(run_dir)
        kept = f"the last good checkpoint '{last[0]}' is kept" if last else "no earlier checkpoint exists"
        raise CheckpointError(f"writing checkpoint '{path}' failed: {e.strerror or e}; {kept}") from None
    link_tmp = temp_path(run_dir / CHECKPOINT_NAME, "link")
    link_tmp.unlink(missing_ok=True)
    os.link(path, link_tmp)
    _replace_verified(link_tmp, run_dir / CHECKPOINT_NAME, _sidecar_digests(path)[0])
    own = [p for p in step_checkpoints(run_dir) if p == path or run_of(p) == state.get("run_id")]
    for old in own[max(keep, 1) :]:  # another run's files (copied in, or without a run id) are never deleted
        old.unlink(missing_ok=True)
        _sidecar(old).unlink(missing_ok=True)
    return path


_UNREADABLE = "<unreadable>"


def set_aside(path: Path, run_id: str | None) -> Path:
    """Move another run's checkpoint (and its sidecar) to `previous/<its run id>/` instead of overwriting it."""
    folder = path.parent / files.ARCHIVE / (run_id if run_id and files.RUN_ID.match(run_id) else "unknown-run")
    folder.mkdir(parents=True, exist_ok=True)
    dest, n = folder / path.name, 1
    while dest.exists():
        dest, n = folder / f"{path.stem}-{n}{path.suffix}", n + 1
    os.rename(path, dest)
    if _sidecar(path).is_file():
        os.rename(_sidecar(path), _sidecar(dest))
    return dest


def run_of(path: Path) -> str | None:
    """The run id a checkpoint carries (None: written before run ids; `<unreadable>`: not a checkpoint of ours).

    Memory-mapped, weights-only: the tensors are not read, so this costs milliseconds whatever the file's size.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return _UNREADABLE
    run_id = state.get("run_id") if isinstance(state, dict) else _UNREADABLE
    return run_id if run_id is None or isinstance(run_id, str) else _UNREADABLE


def foreign_checkpoints(run_dir: Path, run_id: str | None) -> list[Path]:
    """The `ckpt-<step>.pt` files of `run_dir` that are not run `run_id`'s (None: the directory has no run.json, and
    only checkpoints without a run id are its own): never resumed from, never deleted."""
    return [p for p in step_checkpoints(run_dir) if run_of(p) != run_id]


def estimate_bytes(model, world_size: int = 1) -> int:
    """Rough size of a checkpoint: weights and buffers plus one optimizer slot per parameter, plus every other
    rank's BN running statistics (a mid-epoch checkpoint of several ranks keeps them), plus slack."""
    state = model.state_dict()
    weights = sum(t.numel() * t.element_size() for t in state.values())
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    bn = sum(t.numel() * t.element_size() for k, t in state.items() if k.endswith(("running_mean", "running_var")))
    return int(1.1 * (weights + params + (world_size - 1) * bn)) + (1 << 20)


def check_writable(run_dir: Path, needed_bytes: int) -> None:
    """Fail before training when the run directory is unwritable or its disk cannot hold a checkpoint."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError as e:
        raise CheckpointError(f"run directory '{run_dir}' is not writable: {e.strerror or e}") from None
    free = shutil.disk_usage(run_dir).free
    if free < needed_bytes:
        raise CheckpointError(
            f"run directory '{run_dir}': {free / 2**20:.1f} MiB free, but a checkpoint needs about "
            f"{needed_bytes / 2**20:.1f} MiB (two copies while one is written); free space or set run.out_dir"
        )


def rng_state() -> dict:
    """This process's RNG states in plain types (lists and tensors), so that weights_only loading reads them."""
    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(mt), gauss],
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict) -> None:
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    n = state["numpy"]
    if isinstance(n, dict):
        keys = n["keys"].numpy().astype(np.uint32)
        np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    else:  # checkpoints written before the plain-type format
        np.random.set_state(n)
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
