"""The auto-tuner's schedule, search and cache, driven by a synthetic step-time function (no processes)."""

from __future__ import annotations

import functools
import json

import pytest
from support import ROOT, drive_tuner, tuner

from base.errors import ConfigError
from recipes.comm import tuner as tuning
from recipes.comm.plan import Settings
from recipes.config import load_config


def step_time(s: Settings) -> float:
    """A made-up network: more streams help up to 3, slicing helps a little, 8 MB buckets are best."""
    import math

    return 1.0 / min(s.streams, 3) + 0.05 * abs(math.log2(s.bucket_mb / 8)) + 0.02 / s.slices


@pytest.mark.parametrize("method", ["bayes", "grid"])
def test_search_respects_the_budget_and_keeps_the_fastest(method):
    space = tuning.search_space([2, 4, 8, 16, 32], [1, 2, 3, 4], [1, 2, 4])
    start = Settings(2.0, 1, 1)
    t = tuner(space, start, max_candidates=10, warmup_steps=3, steps_per_window=2, windows=3, method=method)
    seen, steps = drive_tuner(t, step_time)
    assert len(t.trials) == 10
    assert len({tr.settings for tr in t.trials}) == 10  # never the same candidate twice
    assert steps == 3 + 10 * (1 + 3 * 2)  # warm-up, then per candidate one settling step and 3 windows of 2
    assert seen[0] == start
    win = t.winner()
    assert win.score == min(step_time(tr.settings) for tr in t.trials)
    assert all(len(tr.window_means) == 3 for tr in t.trials)


def test_bayes_finds_a_near_optimal_point_with_few_candidates():
    space = tuning.search_space([2, 4, 8, 16, 32], [1, 2, 3, 4], [1, 2, 4])
    t = tuner(space, Settings(2.0, 1, 1), max_candidates=10, method="bayes")
    drive_tuner(t, step_time)
    best = min(step_time(s) for s in space)
    assert t.winner().score <= best * 1.1  # 10 of 60 points measured, within 10% of the true optimum


def test_median_over_windows_ignores_an_outlier_window():
    t = tuner([Settings(8, 3, 2)], Settings(4, 1, 1), steps_per_window=2, windows=3)
    drive_tuner(t, step_time, outlier_every=5)  # one step in five is slow, so one window per candidate is inflated
    assert t.winner().settings == Settings(8, 3, 2)
    assert all(tr.score < 10 for tr in t.trials)


def test_grid_with_a_small_budget_spreads_over_the_space():
    space = tuning.search_space([2, 4, 8, 16, 32], [1, 2, 3, 4], [1, 2, 4])
    t = tuner(space, Settings(8, 4, 2), max_candidates=5)
    drive_tuner(t, step_time)
    tried = [tr.settings for tr in t.trials]
    assert tried[0] == Settings(8, 4, 2)
    assert {s.bucket_mb for s in tried[1:]} >= {2.0, 32.0}  # both ends of the grid, not just its start


def test_cache_round_trip(tmp_path):
    path = tmp_path / "sub" / "tune.json"
    t = tuner([Settings(16, 3, 2)], Settings(4, 1, 1))
    drive_tuner(t, step_time)
    key = tuning.cache_key("resnet50", 8, "nccl", "float32", "none", "2nodes-x4")
    assert tuning.cache_load(path, key) is None
    tuning.cache_store(path, key, t)
    assert tuning.cache_load(path, key) == Settings(16.0, 3, 2)
    other = tuning.cache_key("resnet50", 16, "nccl", "float32", "none", "2nodes-x4")
    assert tuning.cache_load(path, other) is None
    data = json.loads(path.read_text())
    assert [c["streams"] for c in data[key]["candidates"]] == [1, 3]
    assert "model=resnet50|world=8|pg=nccl|dtype=float32|wire=none|net=2nodes-x4" in data
    path.write_text("{not json")
    assert tuning.cache_load(path, key) is None  # a broken cache means "tune again", never a crash


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("comm.streams=0", "comm.streams: expected an integer > 0, got 0"),
        ("comm.slices=-1", "comm.slices: expected an integer > 0"),
        ("comm.bucket_mb=0", "comm.bucket_mb: expected a number > 0"),
        ("comm.tune_streams=[]", "comm.tune_streams: expected a non-empty list"),
    ],
)
def test_bad_settings_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):  # the config's domains stop them before any backend is made
        load_config(None, ["comm.backend=multistream", override])


def test_bad_enum_is_a_config_error():
    with pytest.raises(ConfigError, match="comm.concurrency: expected one of 'auto', 'overlap', 'serialize'"):
        load_config(None, ["comm.concurrency=parallel"])


# ---------------------------------------------------------------------------------------------------------
# The model's starting point: calibrated compute (recipes/timemodel/) and the link probe's figures.

RECORD = ["comm.tune_start=model", "comm.link_gbit=32", "comm.flow_gbit=10"]
MS = "comm.backend=multistream"  # the tuner is multistream's: its keys are that backend's


@pytest.fixture(scope="module")
def record():
    """The record's config on its cluster (16 x 8 V100 32 GB, 32 Gbit/s, 10 Gbit/s per flow) and ResNet-50's
    gradients with their CPU-profiled ready times."""

    from recipes import timemodel as tm

    cfg = load_config(str(ROOT / "configs" / "dawnbench_158s.yaml"), RECORD)
    prof = tm.profile_model(cfg.model.name)  # the key calibrated_compute uses: profiled once
    space = tuning.search_space(cfg.comm.tune_bucket_mb, cfg.comm.tune_streams, cfg.comm.tune_slices)
    return cfg, list(prof.specs), prof, space


def exposed_ms(specs, compute, settings: Settings, cfg) -> float:
    from recipes.comm import stepmodel as sm

    net = sm.Network(16, 8, 32.0, 10.0, 50e-6)
    return (
        sm.predict_step(
            "multistream", specs, compute, net, settings=settings, compression=cfg.comm.compression
        ).exposed_s
        * 1000
    )


def test_model_start_uses_the_calibrated_compute_of_the_runs_gpu(record):
    from recipes import timemodel as tm

    cfg, specs, prof, space = record
    compute, what = tm.calibrated_compute(cfg, specs, 128, 8, "Tesla V100-SXM2-32GB")
    v100 = tm.published("v100-32gb")
    step = 256 * v100.per_image_s(96) / v100.host_efficiency  # the first phase: 96 px, 32768 / 128 per GPU
    assert compute.forward_s + compute.backward_s == pytest.approx(step)
    assert 0.06 < step < 0.08 and "v100-32gb, 96 px, 256 per GPU" in what
    assert compute.ready == prof.ready
    ranked, note = tuning.model_start(
        cfg.comm,
        specs,
        space,
        16,
        8,
        "Tesla V100-SXM2-32GB",
        compute_start=functools.partial(tm.calibrated_compute, cfg),
    )
    assert ranked == tuning.model_ranking(specs, space, 16, 8, cfg.comm, compute)
    assert ranked[0][1] > step  # a step is the compute plus what communication it does not hide
    assert f"compute {step * 1000:.0f} ms per step" in note and ranked[0][0].label() in note
    fast, _ = tm.calibrated_compute(cfg, specs, 128, 8, "NVIDIA A100-SXM4-80GB")
    a100 = tm.published("a100")
    assert fast.backward_s < 0.7 * compute.backward_s  # faster than a V100, but at 96 px the host's floor bounds it
    assert fast.forward_s + fast.backward_s == pytest.approx(a100.step_floor[1] / a100.host_efficiency)
    assert tm.calibrated_compute(cfg, specs, 128, 8, None) == (None, "no calibrated compute on the CPU")
    h200, what = tm.calibrated_compute(cfg, specs, 128, 8, "NVIDIA H200")  # measured here: the floor too
    assert h200.forward_s + h200.backward_s == pytest.approx(tm.published("h200").step_floor[1] / a100.host_efficiency)
    none, why = tm.calibrated_compute(cfg, specs, 128, 8, "NVIDIA B200")
    assert none is None and "comm.gpu_profile" in why


def test_a_longer_compute_step_hides_more_so_the_start_moves(record):
    """With no compute every gradient waits for the link together: 8 MB buckets on the 4 communicators a 10 Gbit/s
    flow cap needs. The longer backward runs, the more buckets go out under it, until only the last one is exposed:
    then small buckets win, and the exposed communication of the start falls with the compute."""
    from recipes import timemodel as tm

    cfg, specs, prof, space = record
    bare = tuning.model_ranking(specs, space, 16, 8, cfg.comm)[0][0]
    assert bare == Settings(8.0, 4, 1)
    v100 = tm.published("v100-32gb")
    starts, exposed = [], []
    for size, batch in ((96, 32), (96, 256), (224, 256)):  # 40 (the host's floor), 69 and 254 ms of compute
        comp = tm.step_compute(v100, size, batch, 8, prof)
        start = tuning.model_ranking(specs, space, 16, 8, cfg.comm, comp)[0][0]
        starts.append(start)
        exposed.append(exposed_ms(specs, comp, start, cfg))
        assert exposed[-1] <= exposed_ms(specs, comp, bare, cfg) + 1e-9  # never worse than the bare model's pick
    assert exposed[0] > 25 and exposed[1] < 20 and exposed[2] < 4  # ms after backward's end (29.1, 15.3, 3.3)
    assert starts[0] == bare and starts[2].bucket_mb == 2.0  # 224 px: the smallest bucket in the space
    long = tm.step_compute(v100, 224, 256, 8, prof)
    assert exposed_ms(specs, long, bare, cfg) > 3 * exposed[2]  # 15.3 ms with the bare model's start


def probe_file(tmp_path, **kw):
    doc = {"hosts": ["a", "b"], "flows": 4, "measured": "2026-12-04T10:00:00+00:00", "pairs": [{}]}
    doc.update(link_gbit=3.1, flow_gbit=0.98, latency_us=48.2)
    doc.update(kw)
    f = tmp_path / "network.json"
    f.write_text(json.dumps(doc))
    return f


def test_the_link_probes_file_replaces_the_config_link(tmp_path, record):
    cfg, specs, _, space = record
    f = probe_file(tmp_path)
    probed = load_config(None, [*RECORD, MS, f"comm.network_file={f}"]).comm
    link = tuning.link_figures(probed)
    assert (link.link_gbit, link.flow_gbit, link.latency_us) == (3.1, 0.98, 48.2)
    assert str(f) in link.source and "2 hosts" in link.source
    slow = tuning.model_ranking(specs, space, 16, 8, probed)
    assert slow[0][1] > 5 * tuning.model_ranking(specs, space, 16, 8, cfg.comm)[0][1]  # 3.1 against 32 Gbit/s
    nocap = tuning.link_figures(
        load_config(None, [MS, f"comm.network_file={probe_file(tmp_path, flow_gbit=None)}"]).comm
    )
    assert nocap.flow_gbit is None


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("{oops", "not valid JSON"),
        ("[]", "expected an object"),
        ('{"link_gbit": NaN, "flow_gbit": 1, "latency_us": 1}', "NaN is not a JSON number"),
        (json.dumps({"link_gbit": 1e308, "flow_gbit": 1, "latency_us": 1}), "comm.link_gbit's domain"),
        (json.dumps({"link_gbit": 3, "flow_gbit": 1, "latency_us": 1e300}), "latency_us"),
        (json.dumps({"hosts": ["a"], "pairs": []}), "no host pair"),
        (json.dumps({"link_gbit": "fast", "flow_gbit": 1, "latency_us": 1}), "link_gbit"),
        (json.dumps({"link_gbit": 3, "flow_gbit": -1, "latency_us": 1}), "flow_gbit"),
        (json.dumps({"link_gbit": 3, "flow_gbit": None}), "latency_us"),
        (json.dumps({"link_gbit": 1e-300, "flow_gbit": 1, "latency_us": 1}), "comm.link_gbit's domain (>= 0.001"),
        (json.dumps({"link_gbit": 3, "flow_gbit": 1e-300, "latency_us": 1}), "comm.flow_gbit's domain (>= 0.001"),
    ],
)
def test_a_bad_probe_file_is_a_one_line_config_error(tmp_path, text, key):
    f = tmp_path / "network.json"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        tuning.link_figures(load_config(None, [MS, f"comm.network_file={f}"]).comm)
    assert "\n" not in str(e.value) and str(f) in str(e.value) and key in str(e.value)
    with pytest.raises(ConfigError, match="does not exist"):
        tuning.link_figures(load_config(None, [MS, f"comm.network_file={tmp_path / 'none.json'}"]).comm)
    with pytest.raises(ConfigError, match="expected a regular file"):
        tuning.link_figures(load_config(None, [MS, "comm.network_file=/dev/zero"]).comm)


def test_a_measured_gpu_profile_replaces_the_published_rates(tmp_path, record):
    from recipes import timemodel as tm

    _, specs, _, _ = record
    doc = {"gpu": "NVIDIA H200", "torch": "2.9", "date": "2026-12-04", "commit": "0123456789ab", "model": "resnet50"}
    doc |= {
        "channels_last": True,
        "dtype": "bf16",
        "rates": [{"image_size": 96, "batch_size": 256, "images_per_s": 8e3}],
    }
    f = tmp_path / "gpu.json"
    f.write_text(json.dumps(doc))
    measured = load_config(str(ROOT / "configs" / "dawnbench_158s.yaml"), [*RECORD, f"comm.gpu_profile={f}"])
    comp, what = tm.calibrated_compute(measured, specs, 128, 8, "NVIDIA H200")
    eff = tm.load_gpu_profile(f).host_efficiency
    assert comp.forward_s + comp.backward_s == pytest.approx(256 / 8e3 / eff)  # 32 ms alone, more in a host of 8
    assert "NVIDIA H200 (measured 2026-12-04" in what
    f.write_text(json.dumps(doc | {"dtype": "fp8"}))
    with pytest.raises(ConfigError, match=rf"^comm.gpu_profile: {f}: dtype: expected"):
        tm.calibrated_compute(measured, specs, 128, 8, "NVIDIA H200")
