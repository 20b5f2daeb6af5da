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
    assert set(rules.declared(Config)) == {rules.BY_SIZE, rules.WARMUP, rules.TRUST_CLIP, rules.HOP_ON_HOST}
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


def test_hop_level_on_nccl_is_refused_at_load_before_anything_is_written(tmp_path):
    import train

    hop = ["comm.backend=multistream", "comm.balance=true", "comm.balance_level=hop"]
    want = "comm.balance_level=hop: the hop-balanced ring runs on gloo process groups, not NCCL ({}); use "
    want += "comm.balance_level=communicator on GPUs"
    with pytest.raises(ConfigError) as e:
        load_config(None, [*hop, "dist.backend=nccl"])
    assert str(e.value) == want.format("dist.backend=nccl")
    with pytest.raises(ConfigError) as e:
        load_config(None, [*hop, "run.device=cuda"])
    assert str(e.value) == want.format("dist.backend=auto with run.device=cuda: nccl")
    load_config(None, [*hop, "run.device=cpu"])  # gloo: the network lab's hosts
    load_config(None, [*hop, "run.device=auto"])  # known at start-up only, where multistream refuses NCCL
    # a hierarchy that runs the ring on the host makes it legal (comm.hierarchy=host)
    cfg = load_config(None, [*hop, "run.device=cpu"])
    on_host = dataclasses.replace(cfg, dist=dataclasses.replace(cfg.dist, backend="nccl"))
    object.__setattr__(on_host.comm, "hierarchy", "host")
    rules.hop_level_on_host(on_host)
    out = tmp_path / "runs"
    assert train.main([*hop, "dist.backend=nccl", f"run.out_dir={out}"]) != 0
    assert not out.exists()  # refused before the run directory
