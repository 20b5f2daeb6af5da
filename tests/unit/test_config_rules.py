"""Rules between keys (recipes/config/rules.py): each written once, declared on its fields, run by the loader, and
the same function raises the same error from the part for a section built in code."""

from __future__ import annotations

import dataclasses

import pytest

from base.errors import ConfigError
from recipes.config import Config, OptimConfig, Phase, load_config, rules
from recipes.config.schema import field_of
from recipes.optim import create_optimizer

TRUST = r"^optim.trust_clip_min: 0.5 is above optim.trust_clip_max \(0.25\)$"


def test_the_schema_declares_each_rule_on_its_fields_and_the_loader_runs_them():
    assert set(rules.declared(Config)) == {rules.BY_SIZE, rules.WARMUP, rules.TRUST_CLIP}
    assert field_of("optim.trust_clip_min").metadata["cross"] is rules.TRUST_CLIP
    assert field_of("optim.trust_clip_max").metadata["cross"] is rules.TRUST_CLIP
    with pytest.raises(ConfigError, match=TRUST):
        load_config(None, ["optim.name=hybrid", "optim.trust_clip_min=0.5", "optim.trust_clip_max=0.25"])
    with pytest.raises(ConfigError, match=r"^optim.warmup_epochs: 3.0 is longer than the schedule \(2 epochs\)$"):
        load_config(None, ["phases=[{epochs: 2, image_size: 32, batch_size: 8}]", "optim.warmup_epochs=3"])
    load_config(None, ["optim.trust_clip_min=0.25", "optim.trust_clip_max=0.25"])  # equal bounds: a fixed ratio


def test_the_part_raises_the_same_error_for_a_section_built_in_code():
    import torch

    model = torch.nn.Linear(2, 2)
    bad = OptimConfig(name="hybrid", trust_clip_min=0.5, trust_clip_max=0.25)
    with pytest.raises(ConfigError, match=TRUST):
        create_optimizer(bad, model)
    create_optimizer(dataclasses.replace(bad, name="lars"), model)  # lars clips nothing: the rule is hybrid's
    cfg = Config(optim=OptimConfig(warmup_epochs=2.0), phases=[Phase(epochs=1, image_size=32, batch_size=8)])
    with pytest.raises(ConfigError, match="optim.warmup_epochs: 2.0 is longer than the schedule"):
        rules.check_all(cfg)


def test_max_gpu_batch_by_size_names_phase_sizes_with_at_least_one_image():
    two = "phases=[{epochs: 1, image_size: 96, batch_size: 64}, {epochs: 1, image_size: 224, batch_size: 64}]"
    cfg = load_config(None, [two, "run.max_gpu_batch_by_size={224: 16}"])
    assert cfg.run.max_gpu_batch_by_size == {224: 16}
    with pytest.raises(ConfigError, match=r"^run.max_gpu_batch_by_size: 160 px is no phase's image size \(96, 224\)$"):
        load_config(None, [two, "run.max_gpu_batch_by_size={160: 16}"])
    with pytest.raises(
        ConfigError, match=r"^run.max_gpu_batch_by_size.224: expected an integer >= 1 \(images\), got 0$"
    ):
        load_config(None, [two, "run.max_gpu_batch_by_size={224: 0}"])
