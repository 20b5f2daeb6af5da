"""recipes/comm/stepmodel.py's flows per communicator: the default keeps one flow, N flows lift a communicator's
per-flow cap N-fold up to the link, and the lab's multi-flow DDP is predicted from the same fit as the rest."""

from __future__ import annotations

import pytest

from recipes.comm import stepmodel as sm
from recipes.comm.plan import Settings, TensorSpec

SPECS = [TensorSpec(f"t{i}", (250_000,), "float32") for i in range(40)]  # 40 MB


def _step(backend, flows=None, **kw):
    net = sm.Network(4, 1, link_gbit=32.0, flow_gbit=10.0, latency_s=50e-6)
    return sm.predict_step(backend, SPECS, sm.no_overlap(SPECS), net, flows=flows, **kw)


def test_default_is_one_flow_as_before():
    assert _step("ddp").step_s == _step("ddp", flows=1).step_s
    assert "flows" not in _step("ddp").settings and "4 flows per communicator" in _step("ddp", flows=4).settings


def test_flows_lift_the_per_flow_cap_up_to_the_link():
    one, three, many = _step("ddp").step_s, _step("ddp", flows=3).step_s, _step("ddp", flows=16).step_s
    assert one / three == pytest.approx(3.0, rel=0.05)  # 10 -> 30 Gbit/s, under the 32 Gbit/s link
    assert three / many == pytest.approx(32 / 30, rel=0.05)  # then the link binds
    ms = _step("multistream", settings=Settings(8.0, 4, 2)).step_s
    assert many <= ms  # with all gradients ready at once, DDP on 16 flows is no slower than 4 communicators
    assert sm.NCCL_DEFAULT_FLOWS == {"generic": 1, "aws-ena": 16, "gcp-gvnic": 4}
    with pytest.raises(ValueError, match="flows: expected a positive integer, got 0"):
        _step("ddp", flows=0)
