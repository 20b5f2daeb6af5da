"""Keys that do not apply are said: a value set for an optim.* key the chosen optimizer does not read is warned in
one line, and --print-config marks every such key, from the optimizer records (recipes/registry.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from support import ROOT

from recipes.config import load_config, to_yaml
from recipes.config.inert import inert_keys, inert_settings, marked_yaml


def _cfg(*overrides):
    return load_config(ROOT / "configs" / "base.yaml", list(overrides))


@pytest.mark.parametrize(
    ("name", "inert"),
    [
        ("sgd", ["eta", "trust_clip_min", "trust_clip_max", "lars_momentum", "adapt_bn_bias"]),
        ("lars", ["trust_clip_min", "trust_clip_max"]),
        ("hybrid", []),
        ("lamb", ["momentum", "momentum_end", "momentum_schedule", "nesterov", "eta", "trust_clip_min"]),
    ],
)
def test_inert_keys_per_optimizer(name, inert):
    keys = inert_keys(_cfg(f"optim.name={name}"))
    if name == "lamb":
        assert keys == [f"optim.{k}" for k in (*inert, "trust_clip_max", "lars_momentum")]
    else:
        assert keys == [f"optim.{k}" for k in inert]


def test_a_set_inert_key_is_one_line_and_a_default_is_silent():
    assert inert_settings(_cfg("optim.name=sgd")) == []
    assert inert_settings(_cfg("optim.name=sgd", "optim.eta=0.02")) == [
        "optim.eta=0.02 is not read by optim.name=sgd (read by lars, hybrid): it changes nothing"
    ]
    assert inert_settings(_cfg("optim.name=lamb", "optim.momentum=0.5")) == [
        "optim.momentum=0.5 is not read by optim.name=lamb (read by sgd, lars, hybrid): it changes nothing"
    ]
    assert inert_settings(_cfg("optim.name=lars", "optim.eta=0.02")) == []


def test_print_config_marks_inert_keys_and_stays_the_same_config():
    cfg = _cfg("optim.name=lars")
    text = marked_yaml(cfg)
    marked = [
        ln.split(":")[0].strip() for ln in text.splitlines() if ln.endswith("# inert: not read by optim.name=lars")
    ]
    assert marked == ["trust_clip_min", "trust_clip_max"]
    assert yaml.safe_load(text) == yaml.safe_load(to_yaml(cfg))  # comments only: the same config
    tree = yaml.safe_load(text)
    assert tree["optim"]["name"] == "lars" and tree["optim"]["trust_clip_min"] == 1e-5


def test_cli_warns_once_per_inert_setting():
    cmd = [sys.executable, "train.py", "-c", "configs/quickstart.yaml", "--print-config", "optim.trust_clip_max=2"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines() == [
        "warning: optim.trust_clip_max=2.0 is not read by optim.name=sgd (read by hybrid): it changes nothing"
    ]
    assert "  trust_clip_max: 2.0  # inert: not read by optim.name=sgd" in p.stdout.splitlines()
