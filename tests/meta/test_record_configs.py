"""The record configs' provenance labels: every value labelled `entry` is the published one, every published value
is used and labelled `entry`, everything else is labelled `ours: <reason>`.

The published values are read from verbatim copies of the record's DAWNBench entries in tests/data/dawnbench_entries/
(stanford-futuredata/dawn-bench-entries, ImageNet/train/)."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from support import ROOT

from recipes.config import load_config

ENTRIES = ROOT / "tests" / "data" / "dawnbench_entries"
MODEL = {"ResNet50-v1.5": "resnet50"}  # timm's resnet50 is v1.5: stride 2 in the 3x3 convolution of a block
OPTIMIZER = {"LARS with rectified adaptive lr": "hybrid", "SGD with Dynamic Momentum": "sgd"}
MOMENTUM = {"cycle linear": "cyclic"}


def _published_158s(e: dict) -> dict:
    m, s = e["misc"], e["misc"]["schedule"]
    return {
        "run.nodes": int(e["hardware"].split()[0]),  # "16 ecs.gn6e-c12g1.24xlarge (AlibabaCloud)"
        "run.procs_per_node": int(m["hardware backend"].split("x")[1].split()[0]),  # "16x8 V100-32G ..."
        "run.amp": "fp16" if m["mixed_precision"] else "none",
        "data.val_blacklist": e["usedBlacklist"],
        "model.name": MODEL[e["model"]],
        "optim.name": OPTIMIZER[m["optimizer"]],
        "optim.nesterov": m["use_nesterov"],
        "optim.eta": m["etta"],
        "optim.trust_clip_min": m["min_trust_ratio"],
        "optim.trust_clip_max": m["max_trust_ratio"],
        "optim.lr": s["max_lr"],
        "optim.final_lr": s["min_lr"],
        "optim.warmup_epochs": m["warmup_epochs"],
        "optim.momentum": s["max_momentum"],
        "optim.momentum_end": s["min_momentum"],
        "optim.momentum_schedule": MOMENTUM[s["momentum"]],
        "optim.weight_decay": m["weight_decay"],
        "optim.label_smoothing": m["smooth_label"],
    }


def _published_8gpu(e: dict) -> dict:
    m, s = e["misc"], e["misc"]["schedule"]
    return {
        "run.nodes": int(e["hardware"].split()[0]),
        "run.procs_per_node": int(m["hardware backend"].split("x")[1].split()[0]),
        "run.amp": "fp16" if m["mixed_precision"] else "none",
        "data.val_blacklist": e["usedBlacklist"],
        "model.name": MODEL[e["model"]],
        "optim.name": OPTIMIZER[m["optimizer"]] if not m["use_lars"] else None,
        "optim.nesterov": m["use_nesterov"],
        "optim.lr": s["max_lr"],
        "optim.final_lr": s["min_lr"],
        "optim.warmup_epochs": m["warmup_epochs"],
        "optim.momentum": m["max_momentum"],
        "optim.momentum_end": m["min_momentum"],
        "optim.weight_decay": m["weightDecay"],
    }


RECORDS = {
    "dawnbench_158s.yaml": ("alibabacloud_resnet50_gn6e_16_machine_tensorflow.json", _published_158s),
    "dawnbench_8gpu.yaml": ("alibabacloud_resnet50_gn6e_1_machine_tensorflow.json", _published_8gpu),
}


def _published_phases(e: dict) -> list[dict]:
    """One dict per phase: the imageSize rows, each with the batch size of its epochs and min_object_area."""
    m = e["misc"]
    batch = [b["batch_size"] for b in m["batchSize"] for _ in range(b["epochs"])]
    out, epoch = [], 0
    for row in m["imageSize"]:
        out.append({**row, "batch_size": batch[epoch], "min_object_area": m["min_object_area"]})
        epoch += row["epochs"]
    assert epoch == len(batch)  # the two tables of the entry cover the same epochs
    return out


def _labels(path) -> tuple[dict[str, str], list[tuple[dict, str]]]:
    """({dotted key: label} for `key: value  # label` lines, [(phase mapping, label)] for the phase lines)."""
    keys, phases, section = {}, [], None
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            section = line.split(":")[0]
            continue
        body, _, label = line.partition(" #")
        if section == "run" and body.strip().startswith("name:"):
            continue  # the run's name, not a hyperparameter
        assert label.strip(), f"{path.name}:{n}: value without a label: {line.strip()}"
        label = label.strip()
        assert re.match(r"^(entry|ours: \S)", label), f"{path.name}:{n}: label must be 'entry' or 'ours: <reason>'"
        if section == "phases":
            phases.append((yaml.safe_load(body.strip()[1:].strip()), label))
        else:
            keys[f"{section}.{body.split(':')[0].strip()}"] = label
    return keys, phases


def _get(cfg, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("name", list(RECORDS))
def test_entry_labels_are_the_published_values(name):
    entry_file, published = RECORDS[name]
    e = json.loads((ENTRIES / entry_file).read_text())
    values = published(e)
    cfg = load_config(ROOT / "configs" / name)
    keys, phases = _labels(ROOT / "configs" / name)
    for key, label in keys.items():
        if label.startswith("entry"):
            assert key in values, f"{name}: {key} is labelled 'entry' but {entry_file} does not publish it"
            ours = _get(cfg, key)
            ours = bool(ours) if key == "data.val_blacklist" else ours
            assert ours == values[key], f"{name}: {key} = {ours!r}, {entry_file} publishes {values[key]!r}"
    for key in values:  # every published value is used, and says so
        assert keys.get(key, "").startswith("entry"), f"{name}: {key} is published in {entry_file}: label it 'entry'"
    rows = _published_phases(e)
    assert len(phases) == len(rows) == len(cfg.phases)
    for i, ((line, label), row, phase) in enumerate(zip(phases, rows, cfg.phases, strict=True)):
        assert label.startswith("entry"), f"{name}: phase {i}: its published values make it 'entry'"
        for key, value in row.items():
            assert getattr(phase, key) == value, f"{name}: phases.{i}.{key} = {getattr(phase, key)}, entry {value}"
        unpublished = set(line) - set(row)
        ours = label.partition("ours:")[2]
        for key in unpublished:
            assert key in ours, f"{name}: phases.{i}.{key} is not published: name it after 'ours:' in its label"


@pytest.mark.parametrize("name", ["dawnbench_158s.yaml", "dawnbench_8gpu.yaml"])
def test_the_record_configs_name_the_labelled_choices_that_are_ours(name):
    keys, _ = _labels(ROOT / "configs" / name)
    # not published by either entry: our choices, and labelled so
    for key in ("model.zero_init_last_bn", "optim.no_bn_decay", "optim.warmup_start_lr", "optim.adapt_bn_bias"):
        if key in keys:
            assert keys[key].startswith("ours: "), f"{name}: {key} is not published; label it 'ours: <reason>'"


def test_the_record_uses_tensorflow_lars_and_the_variant_extends_it():
    cfg = load_config(ROOT / "configs" / "dawnbench_158s.yaml")
    assert cfg.optim.lars_momentum == "tf" and cfg.model.name == "resnet50"
    variant = load_config(ROOT / "configs" / "dawnbench_158s_resnet50d.yaml")
    assert variant.model.name == "resnet50_tweaked"
    assert variant.phases == cfg.phases and variant.optim == cfg.optim
    assert "extends: dawnbench_158s.yaml" in (ROOT / "configs" / "dawnbench_158s_resnet50d.yaml").read_text()
