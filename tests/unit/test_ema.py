"""recipes/ema.py: timm's ModelEmaV3 as the trainer drives it, against the closed form of an exponential average."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from recipes.ema import create_ema, update_ema


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))


def _set_all(model: nn.Module, value: float) -> None:
    """Every floating-point entry of the state_dict to `value`, BN's batch counter to 10 x `value`."""
    with torch.no_grad():
        for name, t in model.state_dict().items():
            t.fill_(int(10 * value) if name.endswith("num_batches_tracked") else value)


def closed_form(values: list[float], decay: float) -> float:
    """The average after len(values) updates: the first copies (timm's decay is 0 at step 1), then
    ema_k = decay * ema_(k-1) + (1 - decay) * w_k, i.e. d^(N-1) w_1 + (1 - d) sum_(k>=2) d^(N-k) w_k."""
    n = len(values)
    return decay ** (n - 1) * values[0] + (1 - decay) * sum(decay ** (n - k) * values[k - 1] for k in range(2, n + 1))


def test_ema_after_n_steps_is_the_closed_form_for_weights_and_bn_statistics():
    model, decay = _net(), 0.75
    ema = create_ema(model, enabled=True, decay=decay, warmup=False)
    values = [1.0, 5.0, -2.0, 3.0, 0.5]
    for step, v in enumerate(values, start=1):
        _set_all(model, v)
        update_ema(ema, model, step)
    expected = closed_form(values, decay)
    state = ema.module.state_dict()
    for name in ("0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var"):
        assert torch.allclose(state[name], torch.full_like(state[name], expected), rtol=0, atol=1e-6), name
    assert int(state["1.num_batches_tracked"]) == 5  # integer buffers are copied, not averaged (timm)
    assert expected == pytest.approx(0.75**4 * 1 + 0.25 * (0.75**3 * 5 - 0.75**2 * 2 + 0.75 * 3 + 0.5))


def test_warmup_uses_timms_decay_schedule_capped_at_the_decay():
    model = _net()
    ema = create_ema(model, enabled=True, decay=0.5, warmup=True)
    assert ema.get_decay(1) == 0.0  # the first update copies
    assert ema.get_decay(2) == pytest.approx(1 - 2 ** (-2 / 3))  # 0.37: below the cap
    assert ema.get_decay(100) == 0.5


def test_ema_is_a_copy_and_off_means_none():
    model = _net()
    ema = create_ema(model, enabled=True, decay=0.9, warmup=False)
    assert not ema.module.training  # evaluated in eval mode
    assert all(a is not b for a, b in zip(ema.module.parameters(), model.parameters(), strict=True))
    assert create_ema(model, enabled=False, decay=0.9, warmup=False) is None
    update_ema(None, model, 1)  # a no-op without an EMA
