"""The step-time model on cases with known answers, DDP's bucket rule, and the tuner's start from the model."""

from __future__ import annotations

import pytest
from support import drive_tuner, tuner

from base import registry
from base.errors import ConfigError
from recipes.comm import stepmodel as sm
from recipes.comm import tuner as tuning
from recipes.comm.plan import Settings, TensorSpec
from recipes.config import load_config

MB = 2**20


def specs_of(*mbytes: float) -> list[TensorSpec]:
    return [TensorSpec(f"t{i}", (int(m * MB) // 4,), "float32") for i, m in enumerate(mbytes)]


def net(hosts=2, link=1.0, flow=None, latency=0.0, gpus=1, intra=150.0) -> sm.Network:
    return sm.Network(hosts, gpus, link_gbit=link, flow_gbit=flow, latency_s=latency, intra_gbyte=intra)


def seconds(nbytes: float, gbit: float) -> float:
    return nbytes * 8 / (gbit * 1e9)


@pytest.mark.parametrize("backend", sm.BACKENDS)
@pytest.mark.parametrize("hosts", [2, 4, 16])
def test_single_bucket_is_a_ring_allreduce(backend, hosts):
    """One 100 MB tensor, ready when backward ends: 2(H-1)/H x bytes over the link, plus 2(H-1) latencies (the bytes
    of its record's wire format: half for one that always sends 16-bit values)."""
    specs = specs_of(100)
    comp = sm.no_overlap(specs, 0.0)
    n = net(hosts, link=10.0, latency=1e-4)
    hv = sm.Horovod(cycle_s=1e-9, negotiation_s_per_rank=0.0)
    p = sm.predict_step(backend, specs, comp, n, settings=Settings(200, 1, 1), horovod=hv)
    wire = 0.5 if sm.wire_format(backend) in ("fp16", "bf16") else 1.0
    want = 2 * (hosts - 1) / hosts * seconds(wire * 100 * MB, 10.0) + 2 * (hosts - 1) * 1e-4
    assert p.messages == 1
    assert p.step_s == pytest.approx(want, rel=1e-6, abs=2e-9)
    assert p.hidden_s == pytest.approx(0.0, abs=1e-12) and p.exposed_s == pytest.approx(want, rel=1e-6, abs=2e-9)


def test_no_overlap_step_is_compute_plus_communication():
    specs = specs_of(10, 20, 30)
    comp = sm.Compute(forward_s=0.05, backward_s=0.1, ready=(1.0, 1.0, 1.0), optimizer_s=0.01)
    p = sm.predict_step("ddp", specs, comp, net(2, link=1.0), bucket_cap_mb=25)
    comm = seconds(60 * MB, 1.0)  # 1 Gbit/s, 2 hosts: bytes x 1; one communicator, so sequential buckets
    assert p.step_s == pytest.approx(0.05 + 0.1 + comm + 0.01, rel=1e-6)
    assert p.exposed_s == pytest.approx(comm, rel=1e-6)


def test_full_overlap_hides_communication():
    """Gradients ready early in a long backward: everything is hidden and the step is compute only."""
    specs = specs_of(8, 8)
    comp = sm.Compute(0.0, 10.0, ready=(0.1, 0.2))
    p = sm.predict_step("multistream", specs, comp, net(2, link=10.0), settings=Settings(8, 2, 1))
    assert p.step_s == pytest.approx(10.0)
    assert p.exposed_s == 0.0
    assert p.hidden_s == pytest.approx(p.comm_busy_s) and p.comm_busy_s > 0


def test_a_per_flow_cap_that_does_not_bind_changes_nothing():
    specs = specs_of(*[4] * 12)
    comp = sm.no_overlap(specs)
    for backend, kw in [*((n, sm.backend_kwargs(n)) for n in registry.ALLREDUCE_BACKENDS), ("per-tensor", {})]:
        free = sm.predict_step(backend, specs, comp, net(4, link=10.0), **kw).step_s
        loose = sm.predict_step(backend, specs, comp, net(4, link=10.0, flow=10.0), **kw).step_s
        assert loose == pytest.approx(free, rel=1e-9)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
def test_k_streams_on_an_uncapped_link_share_it(k):
    """Without a per-flow cap more communicators cannot beat the link: the same total time for every K."""
    specs = specs_of(64)
    p = sm.predict_step("multistream", specs, sm.no_overlap(specs), net(2, link=1.0), settings=Settings(64, k, k))
    assert p.messages == k
    assert p.step_s == pytest.approx(seconds(64 * MB, 1.0), rel=1e-6)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 6])
def test_k_streams_under_a_per_flow_cap(k):
    """Link 3 Gbit/s, 1 Gbit/s per flow: K flows reach min(link, K x cap)."""
    specs = specs_of(60)
    p = sm.predict_step("multistream", specs, sm.no_overlap(specs), net(2, 3.0, 1.0), settings=Settings(60, k, k))
    assert p.step_s == pytest.approx(seconds(60 * MB, min(3.0, k * 1.0)), rel=1e-6)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_serialized_streams_carry_one_flow_at_a_time(k):
    """comm.concurrency=serialize (where auto falls back on a driver older than R545): one collective in flight, so
    K communicators under a 1 Gbit/s per-flow cap reach one flow's rate, not min(link, K x cap)."""
    specs = specs_of(60)
    p = sm.predict_step(
        "multistream", specs, sm.no_overlap(specs), net(2, 3.0, 1.0), settings=Settings(60, k, k), serial=True
    )
    assert p.messages == k and p.step_s == pytest.approx(seconds(60 * MB, 1.0), rel=1e-6)
    assert p.settings.endswith(", serialized")
    keys = {"bucket_mb": 60, "streams": k, "slices": k}
    assert sm.backend_kwargs("multistream", None) == {"settings": Settings(8.0, 4, 2)}
    assert sm.pattern("multistream").settings({**keys, "concurrency": "serialize"})["serial"] is True
    assert "serial" not in sm.pattern("multistream").settings({**keys, "concurrency": "auto"})


def test_the_time_model_runs_multistream_as_the_driver_lets_it():
    """An old driver (R535) turns comm.concurrency=auto into serialize on NCCL: the time model's row follows; a
    new one, an explicit overlap, gloo or another backend do not change."""
    from recipes.timemodel.estimate import backends

    def serial(overrides=(), driver=None):
        cfg = load_config("configs/dawnbench_158s.yaml", list(overrides))
        return {b.label: bool(b.kwargs.get("serial")) for b in backends(cfg, driver)}

    assert serial(driver="535.183.01") == {**serial(), "multistream": True}
    assert not any(serial(driver="545.23.06").values()) and not any(serial().values())
    assert not any(serial(["dist.backend=gloo"], "535.183.01").values())
    assert serial(["comm.concurrency=serialize"])["multistream"] is True  # asked for: on any driver


def test_intra_host_stage_and_one_host():
    specs = specs_of(100)
    comp = sm.no_overlap(specs)
    one = sm.predict_step("ddp", specs, comp, net(1, gpus=8, intra=100.0))
    assert one.step_s == pytest.approx(2 * 7 / 8 * 100 * MB / 100e9 + 2 * 7 * 0.0, rel=1e-6)  # NVLink only
    assert sm.predict_step("ddp", specs, comp, net(1, gpus=1)).step_s == 0.0  # one process: nothing to reduce


def test_per_message_latency_counts_per_tensor():
    specs = specs_of(*[0.001] * 100)
    p = sm.predict_step("per-tensor", specs, sm.no_overlap(specs), net(4, link=1000.0, latency=1e-3))
    assert p.step_s == pytest.approx(100 * 2 * 3 * 1e-3, rel=0.01)


def test_ddp_buckets_follow_the_reducer_rule():
    specs = specs_of(0.5, 0.6, 10, 10, 10, 3)  # first bucket closes at >= 1 MB, then at >= 25 MB
    assert sm.ddp_buckets(specs, 25) == [[0, 1], [2, 3, 4], [5]]


def test_horovod_negotiation_grows_with_ranks():
    specs = specs_of(10)
    comp = sm.no_overlap(specs)
    hv = sm.Horovod(negotiation_s_per_rank=1e-3)
    small = sm.predict_step("horovod", specs, comp, net(2, link=10.0), horovod=hv).step_s
    big = sm.predict_step("horovod", specs, comp, net(16, link=10.0), horovod=hv).step_s
    ring = 2 * 15 / 16 * seconds(10 * MB, 10.0) - seconds(10 * MB, 10.0)
    assert big - small == pytest.approx(14e-3 + ring, rel=1e-3)


def test_recommend_picks_enough_streams_for_the_flow_cap():
    specs = specs_of(*[2] * 50)
    space = tuning.search_space([4, 8, 16], [1, 2, 3, 4], [1, 2])
    ranked = sm.recommend(specs, sm.no_overlap(specs), net(16, 32.0, 10.0, 50e-6), space)
    assert ranked[0][0].streams == 4  # 3 flows x 10 Gbit/s < 32 Gbit/s
    assert [r[1] for r in ranked] == sorted(r[1] for r in ranked)


def test_tuner_starts_from_the_model_and_reports_what_measurement_changed():
    specs = specs_of(*[2] * 50)
    cfg = load_config(
        None, ["comm.backend=multistream", "comm.tune_start=model", "comm.link_gbit=32", "comm.flow_gbit=10"]
    )
    space = tuning.search_space([4, 8, 16], [1, 2, 4], [1, 2])
    ranked = tuning.model_ranking(specs, space, 16, 8, cfg.comm)
    t = tuner(
        space,
        ranked[0][0],
        max_candidates=3,
        method="bayes",
        predicted=dict(ranked),
        start_note="started at the model's best",
    )
    assert t.current == ranked[0][0]
    # the measurement disagrees with the model's top pick
    seen, _ = drive_tuner(t, lambda s: 1.0 if s != ranked[1][0] else 0.5)
    assert [s for s in dict.fromkeys(seen)] == [r[0] for r in ranked[:3]]  # predicted order, 3 candidates
    assert t.winner().settings == ranked[1][0]
    assert "measurement changed it to" in t.summary() and "started at the model's best" in t.summary()
    assert all("predicted_s" in row for row in t.table())


def test_model_start_needs_the_link():
    cfg = load_config(None, ["comm.backend=multistream", "comm.tune_start=model"])
    with pytest.raises(ConfigError, match="comm.link_gbit"):
        tuning.model_ranking(specs_of(1), [Settings(8, 4, 2)], 2, 1, cfg.comm)
