"""checkpoint.resume=force trains with the config's optimizer hyperparameters, not the checkpoint's.

`load_state_dict` brings back every group value the checkpoint saved; only lr and momentum are set each step, so
without `apply_config` a changed weight decay (or eta, trust clip, ...) was logged and recorded but not used.
"""

from __future__ import annotations

import pytest
import torch
from support import ROOT, tiny_config
from torch import nn

from recipes.config import load_config
from recipes.optim import apply_config, create_optimizer
from recipes.rundir import checkpoint_files as ckpt
from recipes.trainer import train


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, bias=False)
        self.bn = nn.BatchNorm2d(3)
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(self.bn(self.conv(x)).mean((2, 3)))


def _cfg(*overrides):
    return load_config(ROOT / "configs" / "base.yaml", list(overrides)).optim


# (optimizer, key, value in the checkpoint, value in the resumed config, the group key it sets, the expected
# value per group (weights, bn_bias))
CASES = [
    ("sgd", "weight_decay", "1e-4", "0.5", "weight_decay", (0.5, 0.0)),
    ("sgd", "no_bn_decay", "true", "false", "weight_decay", (1e-4, 1e-4)),
    ("sgd", "nesterov", "true", "false", "nesterov", (False, False)),
    ("lars", "weight_decay", "1e-4", "0.5", "weight_decay", (0.5, 0.0)),
    ("lars", "eta", "1e-3", "0.02", "eta", (0.02, 0.02)),
    ("lars", "nesterov", "true", "false", "nesterov", (False, False)),
    ("lars", "lars_momentum", "torch", "tf", "momentum_convention", ("tf", "tf")),
    ("lars", "adapt_bn_bias", "false", "true", "adapt", (True, True)),
    ("hybrid", "trust_clip_min", "1e-5", "0.01", "trust_min", (0.01, 0.01)),
    ("hybrid", "trust_clip_max", "1.0", "2.5", "trust_max", (2.5, 2.5)),
    ("hybrid", "eta", "1e-3", "0.02", "eta", (0.02, 0.02)),
    ("hybrid", "weight_decay", "1e-4", "5e-5", "weight_decay", (5e-5, 0.0)),
    ("lamb", "weight_decay", "1e-4", "0.5", "weight_decay", (0.5, 0.0)),
    ("lamb", "adapt_bn_bias", "false", "true", "always_adapt", (True, True)),
]


@pytest.mark.parametrize(("name", "key", "old", "new", "group_key", "want"), CASES, ids=lambda v: str(v))
def test_a_changed_optimizer_key_reaches_the_restored_optimizer(name, key, old, new, group_key, want):
    torch.manual_seed(0)
    model = Tiny()
    before = create_optimizer(_cfg(f"optim.name={name}", f"optim.{key}={old}"), model)
    model(torch.randn(4, 2, 6, 6)).sum().backward()
    before.step()
    saved = before.state_dict()

    cfg = _cfg(f"optim.name={name}", f"optim.{key}={new}")
    resumed = create_optimizer(cfg, model)
    resumed.load_state_dict(saved)
    assert tuple(g[group_key] for g in resumed.param_groups) != want  # the checkpoint's value came back

    changes = apply_config(resumed, cfg, model)
    assert tuple(g[group_key] for g in resumed.param_groups) == pytest.approx(want)
    assert any(f"{group_key} " in c for c in changes), changes
    assert resumed.state_dict()["state"].keys() == saved["state"].keys()  # the moments stay restored
    assert apply_config(resumed, cfg, model) == []  # nothing left to change


def test_lr_and_momentum_stay_with_the_schedule():
    model = Tiny()
    opt = create_optimizer(_cfg("optim.name=sgd"), model)
    for g in opt.param_groups:
        g["lr"], g["momentum"] = 0.37, 0.5
    assert apply_config(opt, _cfg("optim.name=sgd"), model) == []
    assert [(g["lr"], g["momentum"]) for g in opt.param_groups] == [(0.37, 0.5), (0.37, 0.5)]


def test_forced_resume_trains_with_the_new_weight_decay(tiny_root, tmp_path):
    """The defect end to end: the checkpoint written after the forced resume holds the config's value."""
    one = "phases=[{epochs: 1, image_size: 32, batch_size: 12}]"
    train(tiny_config(tiny_root, tmp_path, one))
    saved = ckpt.load(tmp_path / "tiny" / "checkpoint.pt")
    assert [g["weight_decay"] for g in saved["optimizer"]["param_groups"]] == [1e-4, 0.0]
    train(tiny_config(tiny_root, tmp_path, "optim.weight_decay=0.5", "checkpoint.resume=force"))
    resumed = ckpt.load(tmp_path / "tiny" / "checkpoint.pt")
    assert resumed["state"]["step"] == 8
    assert [g["weight_decay"] for g in resumed["optimizer"]["param_groups"]] == [0.5, 0.0]
