"""Input pipelines. `create_input(cfg.data, dist, phases=, seed=, channels_last=, amp=)` is the only place that knows
which input pipeline (`data.backend`) is in use.

Every pipeline implements `data.pipeline.InputPipeline`: `num_classes`, `classes`, `num_train`, `num_val`,
`train_batches(epoch_info, start_step=0)` (exactly `epoch_info.steps - start_step` normalized batches on the
device for this rank), `val_batches(phase)` (this rank's disjoint share of the validation set, every image exactly
once over all ranks) and `close()`. Each `data.backend` is a record in base/registry.py (`Input`): its class,
the `data.*` keys it reads, whether it reads data.root's folders.
"""

from __future__ import annotations

from pathlib import Path

from base import registry
from base.errors import DataError
from data.folder import Split, blacklist_path, drop_blacklisted, scan_split
from data.pipeline import BasePipeline, InputPipeline, RunContext


def _val(data, classes: list[str]):
    val = scan_split(data.root, "val", classes=classes)
    if data.val_blacklist:
        val, _ = drop_blacklisted(val, blacklist_path(data.root, data.val_blacklist))
    return val


def copy_beside(root: str, name: str) -> Path:
    """Where a pre-resized copy named `name` of the dataset at `root` is looked for: `<root>-<name>`."""
    return Path(str(root).rstrip("/") + f"-{name}")


def _scan(data, phases: list, classes: list[str] | None = None):
    if classes is not None:  # evaluation: the checkpoint's class list labels val/, and train/ is not read
        val = _val(data, classes)
        train = Split(Path(data.root) / "train", list(classes), [], [])
        return train, val, {"full": (train, val)}
    train = scan_split(data.root, "train")
    val = _val(data, train.classes)
    roots = {"full": (train, val)}
    for name, path in data.roots.items():
        if name == "full" and path == data.root:
            continue
        roots[name] = (scan_split(path, "train", classes=train.classes), val)
    for i, phase in enumerate(phases):
        if phase.root in roots:
            continue
        # A copy not named in data.roots is found next to data.root: /data/imagenet-160 for root '160'.
        beside = copy_beside(data.root, phase.root)
        if not beside.is_dir():
            raise DataError(_no_copy(data, i, phase.root, sorted(roots)))
        roots[phase.root] = (scan_split(beside, "train", classes=train.classes), val)
    return train, val, roots


def _no_copy(data, i: int, name: str, known: list[str]) -> str:
    beside = copy_beside(data.root, name)
    size = f"--short-side {name}" if name.isdigit() else "--short-side N"
    return (
        f"phases.{i}.root: '{name}' is not in data.roots (known: {', '.join(known)}) and '{beside}' does not exist; "
        f"make it with: python data/prepare.py --src {data.root} --dst {beside} {size}"
    )


def missing_inputs(data, phases: list) -> list[str]:
    """Every folder or file of the data section that is not there, each as the line that would stop the run when
    its input pipeline starts (`train.py --plan` lists them all at once; a run stops at the first)."""
    if not registry.INPUT_PIPELINES[data.backend].reads_folders:
        return []
    if not Path(data.root).is_dir():
        return [f"dataset root '{data.root}' does not exist (set data.root or run `make sample`)"]
    problems = []
    if data.val_blacklist and not blacklist_path(data.root, data.val_blacklist).exists():
        where = blacklist_path(data.root, data.val_blacklist)
        devkit = "the devkit's data/ILSVRC2012_validation_blacklist.txt"
        problems.append(f"data.val_blacklist: '{where}' not found ({devkit})")
    known = sorted({"full", *data.roots})
    for i, phase in enumerate(phases):
        if phase.root in data.roots:
            if not Path(data.roots[phase.root]).is_dir():
                problems.append(f"data.roots.{phase.root}: '{data.roots[phase.root]}' is not a folder")
        elif phase.root != "full" and not copy_beside(data.root, phase.root).is_dir():
            line = _no_copy(data, i, phase.root, known)
            if line not in problems and not any(f"'{phase.root}' is not in" in p for p in problems):
                problems.append(line)
    return problems


def create_input(
    data, dist, *, phases: list, seed: int, channels_last: bool, amp: str, val_classes: list[str] | None = None
) -> InputPipeline:
    """Build the input pipeline named by `data.backend` (`data`: the config's data section). From the rest of the
    config: `phases` (epochs and dataset copy of each), `seed` (run.seed), `channels_last` (run.channels_last), `amp`
    (run.amp). `val_classes` (evaluation: the checkpoint's classes): read only `<data.root>/val`, labelled by that
    list, so a dataset of val/ alone is enough."""
    run = RunContext(phases=list(phases), seed=seed, channels_last=channels_last, amp=amp)
    pipeline = registry.load(registry.INPUT_PIPELINES, data.backend, "data.backend", "input pipeline")
    if not registry.INPUT_PIPELINES[data.backend].reads_folders:
        return pipeline(data, dist, run)
    return pipeline(data, dist, run, *_scan(data, run.phases, val_classes))  # + train split, val split, roots


__all__ = ["BasePipeline", "InputPipeline", "RunContext", "create_input", "missing_inputs"]
