"""The model factory (models/factory.py): the BN-tweaked ResNet-50 and the comparison models, built with timm."""

from __future__ import annotations

import pytest
import timm
import torch
from torch import nn

from base.errors import ConfigError
from models import MODELS, create_model
from recipes.config import ModelConfig


def _num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _last_bns(model: nn.Module) -> list[nn.BatchNorm2d]:
    """The BN closing the residual branch of every block (bn3 of a Bottleneck, bn2 of a BasicBlock)."""
    out = []
    for m in model.modules():
        if isinstance(m, timm.models.resnet.Bottleneck):
            out.append(m.bn3)
        elif isinstance(m, timm.models.resnet.BasicBlock):
            out.append(m.bn2)
    return out


def test_resnet50_tweaked_is_timm_resnet50d_with_zero_gamma():
    model = create_model(ModelConfig(name="resnet50_tweaked"), 1000)
    ref = timm.create_model("resnet50d", pretrained=False, num_classes=1000)
    assert _num_params(model) == _num_params(ref) == 25_576_264
    assert [(k, v.shape) for k, v in model.state_dict().items()] == [(k, v.shape) for k, v in ref.state_dict().items()]
    # ResNet-D: a deep stem of three 3x3 convolutions and average pooling before the 1x1 shortcut conv.
    assert [m.kernel_size for m in model.conv1 if isinstance(m, nn.Conv2d)] == [(3, 3)] * 3
    assert isinstance(model.layer2[0].downsample[0], nn.AvgPool2d)
    last = _last_bns(model)
    assert len(last) == 16  # 3 + 4 + 6 + 3 bottlenecks
    assert all(bool((bn.weight == 0).all()) for bn in last)
    others = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d) and all(m is not b for b in last)]
    assert others and all(bool((bn.weight == 1).all()) for bn in others)


def test_bn_settings_classes_and_no_zero_init():
    cfg = ModelConfig(name="resnet18", bn_momentum=0.01, bn_eps=1e-3, zero_init_last_bn=False)
    model = create_model(cfg, 7)
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and all(bn.momentum == 0.01 and bn.eps == 1e-3 for bn in bns)
    assert model.fc.out_features == 7
    assert not any(bool((bn.weight == 0).all()) for bn in _last_bns(model))


def test_comparison_models_match_timm():
    for name, timm_name in [(n, r.arch) for n, r in MODELS.items() if n == r.arch]:  # timm's own networks
        model = create_model(ModelConfig(name=name), 10)
        assert _num_params(model) == _num_params(timm.create_model(timm_name, num_classes=10)), name
        assert all(bool((bn.weight == 0).all()) for bn in _last_bns(model)), name


def test_channels_last_forward_matches_contiguous():
    torch.manual_seed(0)
    model = create_model(ModelConfig(name="resnet10t"), 5).eval()
    x = torch.randn(2, 3, 32, 32)
    ref = model(x)
    model = model.to(memory_format=torch.channels_last)
    assert model.fc.weight.is_contiguous() and model.conv1[0].weight.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(model(x.contiguous(memory_format=torch.channels_last)), ref, rtol=1e-4, atol=1e-5)


def test_unknown_model_names_the_choices():
    with pytest.raises(ConfigError, match=r"model.name: unknown model 'resnet51' \(expected one of resnet50_tweaked"):
        create_model(ModelConfig(name="resnet51"), 10)


def test_compile_for_training_shares_the_modules_parameters_and_none_is_eager():
    from torch._dynamo import config as dynamo_config

    from models.factory import compile_for_training

    # dynamo's own patch, not monkeypatch: pytest's undo deletes an attribute that is not in the module's __dict__,
    # and a deleted dynamo config is hidden for the rest of the process (test_compile then failed in the full suite).
    # The value before is whatever the process set (importing timm.optim sets it to 1,000,000).
    before = dynamo_config.recompile_limit
    with dynamo_config.patch(recompile_limit=8):
        net = nn.Linear(2, 2)
        assert compile_for_training(net, "none") is net
        compiled = compile_for_training(net, "default", shapes=12)  # compiled lazily: at its first call
        assert list(compiled.parameters()) == list(net.parameters())
        assert list(compiled.state_dict()) == ["_orig_mod.weight", "_orig_mod.bias"]  # why checkpoints keep `net`'s
        assert dynamo_config.recompile_limit == 13  # every phase's shape, and one to spare
    assert dynamo_config.recompile_limit == before  # restored, and still readable


def test_compile_without_a_cpp_compiler_is_named(monkeypatch):
    import shutil

    from models.factory import compile_unavailable

    monkeypatch.setattr(shutil, "which", lambda name: None)
    why = compile_unavailable(torch.device("cpu"))
    assert why == "inductor on CPU needs a C++ compiler (none of g++, c++, clang++ or $CXX is on PATH)"
    assert compile_unavailable(torch.device("cuda")) is None
