"""Keys that do not apply are said: a seam's section holds the keys every part reads and the chosen part's own (its
record's config); a value set for another part's key is warned in one line, and --print-config marks it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from support import ROOT

from base import registry
from base.errors import ConfigError
from recipes.config import load_config, to_dict, to_yaml
from recipes.config.inert import inert_keys, inert_settings, marked_yaml
from recipes.config.schema import default_of, knob_fields


def _cfg(*overrides):
    return load_config(ROOT / "configs" / "base.yaml", list(overrides))


# Every record of every seam (base/registry.py SEAMS: optim.name, data.backend, model.name).
SEAM_RECORDS = [(section, name) for section, seam in registry.SEAMS.items() for name in seam.records]


@pytest.mark.parametrize(("section", "name"), SEAM_RECORDS, ids=lambda v: v)
def test_a_section_holds_the_shared_keys_and_the_chosen_parts_own(section, name):
    """The resolved section: the keys every part reads, then the record's own config's; another part's key given to
    it (configs/base.yaml's, or one set here) is inert, and nothing else is."""
    seam = registry.SEAMS[section]
    record = seam.records[name]
    cfg = _cfg(f"{section}.{seam.key}={name}")
    inert = [k.removeprefix(f"{section}.") for k in inert_keys(cfg) if k.startswith(f"{section}.")]
    assert list(to_dict(cfg)[section]) == [*seam.shared, *record.reads, *inert]
    assert not set(inert) & set(record.reads)
    other = next((k for k in knob_fields(section) if k not in record.reads), None)
    if other is not None:
        value = json.dumps(default_of(knob_fields(section)[other][0]))  # its default, given
        cfg = _cfg(f"{section}.{seam.key}={name}", f"{section}.{other}={value}")
        assert f"{section}.{other}" in inert_keys(cfg) and other not in vars(getattr(cfg, section).own)


def _read_by(section: str, key: str) -> str:
    """The plug-ins whose records read `section.key`, as the warning lists them."""
    return ", ".join(r.name for r in registry.SEAMS[section].records.values() if key in r.reads)


def test_a_set_inert_key_is_one_line_and_a_default_is_silent():
    assert inert_settings(_cfg("optim.name=sgd")) == []
    assert inert_settings(_cfg("optim.name=sgd", "optim.eta=0.02")) == [
        f"optim.eta=0.02 is not read by optim.name=sgd (read by {_read_by('optim', 'eta')}): it changes nothing"
    ]
    assert inert_settings(_cfg("optim.name=lamb", "optim.momentum=0.5")) == [
        f"optim.momentum=0.5 is not read by optim.name=lamb (read by {_read_by('optim', 'momentum')}): it changes "
        "nothing"
    ]
    assert inert_settings(_cfg("optim.name=lars", "optim.eta=0.02")) == []


def test_print_config_marks_inert_keys_and_stays_the_same_config():
    cfg = _cfg("optim.name=lars", "optim.trust_clip_min=1e-5")
    text = marked_yaml(cfg)
    marked = [
        ln.split(":")[0].strip() for ln in text.splitlines() if ln.endswith("# inert: not read by optim.name=lars")
    ]
    assert marked == ["trust_clip_min"]
    assert yaml.safe_load(text) == yaml.safe_load(to_yaml(cfg))  # comments only: the same config
    tree = yaml.safe_load(text)
    assert tree["optim"]["name"] == "lars" and tree["optim"]["trust_clip_min"] == 1e-5
    assert "trust_clip_max" not in tree["optim"]  # hybrid's key, not given: not in lars's section


def test_a_key_that_needs_another_keys_value_is_warned_and_marked_when_that_value_is_off():
    """comm.balance_level=hop without comm.balance=true once ran plain multistream without a word."""
    off = _cfg("comm.backend=multistream", "comm.balance_level=hop")
    assert inert_settings(off) == [
        "comm.balance_level='hop' is read only with comm.balance=true, which is off here: it changes nothing"
    ]
    text = marked_yaml(off)
    assert "  balance_level: hop  # inert: read only with comm.balance=true" in text.splitlines()
    assert "  balance_window: 4  # inert: read only with comm.balance=true" in text.splitlines()
    assert "  tune_max_candidates: 10  # inert: read only with comm.autotune=true" in text.splitlines()
    assert yaml.safe_load(text) == yaml.safe_load(to_yaml(off))
    on = _cfg("comm.backend=multistream", "comm.balance=true", "comm.balance_level=hop", "comm.autotune=true")
    assert inert_settings(on) == []
    assert "# inert" not in marked_yaml(on)
    assert inert_settings(_cfg("comm.backend=multistream")) == []  # defaults under an off switch: silent


def test_cli_warns_once_per_inert_setting():
    cmd = [sys.executable, "train.py", "-c", "configs/quickstart.yaml", "--print-config", "optim.trust_clip_max=2"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines() == [
        "warning: optim.trust_clip_max=2.0 is not read by optim.name=sgd (read by hybrid): it changes nothing"
    ]
    assert "  trust_clip_max: 2.0  # inert: not read by optim.name=sgd" in p.stdout.splitlines()


def test_a_set_data_key_the_pipeline_does_not_read_is_one_line():
    assert inert_settings(_cfg("data.backend=synthetic", "data.workers=4", "data.synthetic_size=64")) == [
        f"data.workers=4 is not read by data.backend=synthetic (read by {_read_by('data', 'workers')}): it changes "
        "nothing"
    ]
    assert inert_settings(_cfg("data.backend=torch", "data.dali_prefetch=2")) == [
        "data.dali_prefetch=2 is not read by data.backend=torch (read by dali): it changes nothing"
    ]
    text = marked_yaml(_cfg("data.backend=dali", "data.synthetic_size=64"))
    marked = [
        ln.split(":")[0].strip() for ln in text.splitlines() if ln.endswith("# inert: not read by data.backend=dali")
    ]
    assert marked == ["synthetic_size"]


def test_timm_augmentation_outside_the_torch_pipeline_is_refused_not_only_warned():
    with pytest.raises(
        ConfigError, match=r"data.aug_splits: timm's PIL augmentations run on data.backend=torch only, "
    ):
        _cfg("data.backend=dali", "data.aug_splits=2")
    with pytest.raises(ConfigError, match=r"data.auto_augment: .* got data.backend='synthetic'"):
        _cfg("data.backend=synthetic", "data.auto_augment=rand-m9-mstd0.5")


def test_model_keys_follow_the_model_record(monkeypatch):
    """Every registered network has BatchNorm residual blocks and reads every model.* key; a record that reads no BN
    key makes them inert and the factory does not hand them to timm (whose ViT takes no zero_init_last)."""
    from base import registry
    from models import create_model
    from recipes.config import ModelConfig

    assert not [k for k in inert_keys(_cfg("model.name=resnet18")) if k.startswith("model.")]
    vit = registry.Model("made_up_vit", "vit_tiny_patch16_224", "ViT-Tiny", config="")
    monkeypatch.setitem(registry.MODELS, "made_up_vit", vit)
    cfg = _cfg()
    cfg.model = ModelConfig(name="made_up_vit", bn_eps=1e-3)
    assert [k for k in inert_keys(cfg) if k.startswith("model.")] == ["model.bn_eps"]
    assert inert_settings(cfg)[-1] == (
        f"model.bn_eps=0.001 is not read by model.name=made_up_vit (read by {_read_by('model', 'bn_eps')}): it changes "
        "nothing"
    )
    model = create_model(cfg.model, 10)
    assert model.head.out_features == 10
