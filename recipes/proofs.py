"""What a GPU run has proven about the captured training step, and how far each proof reaches (its scope).

`run.cuda_graph=auto` captures a phase only where a proof of every part it uses (the optimizer, and the allreduce
backend when it wraps the model) covers the run: at least the run's world size, the DALI input pipeline if the run
uses it, the same torch (major.minor) and, where the GPU is known, the same GPU model. A one-GPU proof does not
unlock 128 ranks, and a proof without DALI does not unlock DALI.

The proofs live in docs/data/gpu-proofs.json, written only by `python -m scripts.gpu_check.prove gpu_check.json`
from the capture probe's own report (docs/gpu.md, "Marking a part proven"):

    {"proofs": [{"parts": ["optim.name=hybrid", "comm.backend=multistream"], "gpu": "NVIDIA H200",
                 "world_size": 1, "dali": false, "torch": "2.14.1+cu130", "nccl": "2.27.3", "driver": "580.65.06",
                 "commit": "3da9d85...", "date": "2026-12-07", "skipped": []}]}
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from base.errors import ConfigError
from base.reader import read_json_object

PROOFS = Path(__file__).resolve().parent.parent / "docs" / "data" / "gpu-proofs.json"
WHAT = "the GPU proofs file"


@dataclass(frozen=True)
class Proof:
    """One passing capture probe: the parts it proved and the scope it ran in."""

    parts: tuple[str, ...]  # "optim.name=hybrid", "comm.backend=multistream"
    gpu: str
    world_size: int
    dali: bool  # the probe fed a captured step from DALI's zero-copy batches
    torch: str
    nccl: str
    driver: str
    commit: str
    date: str
    skipped: tuple[str, ...] = ()  # the probe's rows skipped with --allow-skip, as they read

    def describe(self) -> str:
        pipe = "with DALI" if self.dali else "without DALI"
        return (
            f"{self.gpu}, world size {self.world_size}, {pipe}, torch {self.torch}, NCCL {self.nccl}, "
            f"driver {self.driver}, commit {self.commit[:12]}, {self.date}"
        )


@dataclass(frozen=True)
class Scope:
    """What a run uses that a proof must have covered."""

    world_size: int
    dali: bool
    torch: str
    gpu: str | None = None  # the GPU model where known (on the device); --plan on a host without one: None


def _minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def lacks(proof: Proof, scope: Scope) -> list[str]:
    """What of `scope` the proof did not cover, in words ([] = covered)."""
    out = []
    if proof.world_size < scope.world_size:
        out.append(f"world size {scope.world_size} (proven at {proof.world_size})")
    if scope.dali and not proof.dali:
        out.append("the DALI input pipeline (proven without it)")
    if _minor(proof.torch) != _minor(scope.torch):
        out.append(f"torch {_minor(scope.torch)} (proven on {proof.torch})")
    if scope.gpu is not None and scope.gpu != proof.gpu:
        out.append(f"GPU {scope.gpu} (proven on {proof.gpu})")
    return out


def missing_scope(part: str, scope: Scope, proofs: list[Proof]) -> str | None:
    """None when a proof of `part` covers `scope`; else what is missing, naming the nearest proof's gaps."""
    mine = [p for p in proofs if part in p.parts]
    if not mine:
        return f"{part}: no GPU run has proven it"
    gaps = [lacks(p, scope) for p in mine]
    if any(not g for g in gaps):
        return None
    nearest = min(gaps, key=len)
    return f"{part}: its proof does not cover {' and '.join(nearest)}"


_FIELDS = {f.name: f.type for f in dataclasses.fields(Proof)}


def parse_proof(entry, where: str) -> Proof:
    """A proof from its JSON object; one line naming the entry and key on a bad one."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected an object, got {type(entry).__name__}")
    unknown = sorted(set(entry) - set(_FIELDS))
    missing = sorted(k for k in _FIELDS if k not in entry and k != "skipped")
    if unknown or missing:
        raise ConfigError(f"{where}: unknown keys {unknown}, missing keys {missing}")
    for key, value in entry.items():
        if key in ("parts", "skipped"):
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
            want = "a list of strings"
        elif key == "world_size":
            ok, want = type(value) is int and value >= 1, "an integer >= 1"
        elif key == "dali":
            ok, want = isinstance(value, bool), "true or false"
        else:
            ok, want = isinstance(value, str), "a string"
        if not ok:
            raise ConfigError(f"{where}.{key}: expected {want}, got {value!r}")
    return Proof(**{k: tuple(v) if isinstance(v, list) else v for k, v in entry.items()})


def load_proofs(path: Path | None = None) -> list[Proof]:
    """The proofs in `path` (default: PROOFS; [] where the file does not exist)."""
    path = PROOFS if path is None else path
    if not Path(path).exists():
        return []
    data = read_json_object(path, what=WHAT, error=ConfigError)
    entries = data.get("proofs")
    if set(data) != {"proofs"} or not isinstance(entries, list):
        raise ConfigError(f"{WHAT} '{path}': expected {{\"proofs\": [...]}}, got keys {sorted(data)}")
    return [parse_proof(e, f"{WHAT} '{path}': proofs[{i}]") for i, e in enumerate(entries)]


def to_json(proof: Proof) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(proof).items()}
