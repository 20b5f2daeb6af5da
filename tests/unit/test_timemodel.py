"""recipes/timemodel.py: calibration on the two published Alibaba runs within 10% per phase (fitted), the published
constants equal the TSVs, a GPU profile file replaces the published rates, bad profile files give one-line errors,
and the model against three fast.ai entries it was not fitted on."""

from __future__ import annotations

import json

import pytest
from support import ROOT

from recipes import timemodel as tm

ENTRIES = ROOT / "tests" / "data" / "dawnbench_entries"


@pytest.fixture(scope="module")
def prof():
    return tm.profile_model("resnet50")


def tsv_phase_seconds(name: str, epochs: list[int]) -> list[float]:
    """Training clock per phase of a DAWNBench TSV: hours at each phase's last row, differenced."""
    hours = [float(line.split("\t")[1]) for line in (ENTRIES / name).read_text().strip().splitlines()[1:]]
    ends, total = [], 0
    for n in epochs:
        total += n
        ends.append(hours[total - 1] * 3600)
    return [b - a for a, b in zip([0.0, *ends[:-1]], ends, strict=True)]


@pytest.mark.parametrize("run", tm.CALIBRATION_RUNS, ids=lambda r: r.source)
def test_calibration_constants_are_the_published_tsv(run):
    published = tsv_phase_seconds(run.source, [r[2] for r in run.rows])
    assert run.phase_s == pytest.approx(published, abs=0.01)


def test_record_is_158_s_on_the_training_clock():
    assert sum(tm.ALIBABA_16X8.phase_s) == pytest.approx(157.55, abs=0.01)  # the TSV's hours, 0.043763889 h


@pytest.mark.parametrize("run", tm.CALIBRATION_RUNS, ids=lambda r: r.source)
def test_calibration_within_10_percent_per_phase(prof, run):
    est = tm.run_estimate(run, prof)
    for p, pub in zip(est.phases, run.phase_s, strict=True):
        assert abs(p.total("train") / pub - 1) < 0.10, (p.phase, p.total("train"), pub)
    assert abs(est.total("train") / sum(run.phase_s) - 1) < 0.10
    lo, mid, hi = est.range("train")
    assert lo < mid < hi


def test_multi_host_terms_appear_only_with_hosts(prof):
    one, sixteen = (tm.run_estimate(r, prof) for r in tm.CALIBRATION_RUNS)
    assert all(p.step_ms["exposed comm"] == 0 and p.step_ms["sync"] == 0 for p in one.phases)
    assert all(p.step_ms["exposed comm"] > 10 and p.step_ms["sync"] > 0 for p in sixteen.phases)
    names = {t.name for t in sixteen.phases[1].terms}
    assert {"compute", "intra-host", "exposed comm", "sync", "pipeline rebuild", "autotune", "validation"} <= names
    assert sixteen.total("wall") > sixteen.total("train")  # validation, BN allreduce, start-up
    assert sixteen.widest("wall")[0] in names | {"start-up"}


def test_compute_is_per_resolution_not_per_pixel():
    v = tm.published("v100")
    # Alibaba's 1 x 8 entry: at 96 px a GPU reaches well under the per-pixel rate of 224 px
    per_pixel_96 = v.per_image_s(224) * (96 / 224) ** 2
    assert v.per_image_s(96) > 1.3 * per_pixel_96
    assert 1 / v.per_image_s(224) == pytest.approx(1200.0)  # NVIDIA's PyTorch figure, one V100 16 GB
    assert v.host_efficiency == pytest.approx(8322 / 9600)
    assert v.per_image_s(160) == pytest.approx((v.per_image_s(128) + v.per_image_s(224)) / 2, rel=0.3)


def test_gradient_profile_comes_from_the_layers_flops(prof):
    """Backward in reverse layer order at twice each layer's forward FLOPs: the classifier's gradients are ready
    first, the stem's last, and ResNet-50's forward is a third of a step (no timing: the same on every machine)."""
    assert len(prof.specs) == len(prof.ready) == 161
    assert list(prof.ready) == sorted(prof.ready) and prof.ready[-1] == 1.0
    assert prof.specs[0].name.startswith("fc.") and prof.ready[0] < 0.01  # the classifier: ~4 MFLOP of 12 GFLOP
    assert 0.33 < prof.forward_share < 1 / 3 + 0.01  # 1/3, plus the stem's missing input gradient
    assert prof.ready[len(prof.ready) // 2] == pytest.approx(0.5, abs=0.15)  # FLOPs spread through the stages
    assert tm.profile_model("resnet50", 160).ready == pytest.approx(prof.ready, abs=0.01)  # convolutions scale alike


def profile_doc(**kw) -> dict:
    doc = {
        "gpu": "NVIDIA H100 80GB HBM3",
        "torch": "2.14.1",
        "date": "2026-12-03",
        "commit": "0123456789abcdef",
        "model": "resnet50_tweaked",
        "channels_last": True,
        "dtype": "bf16",
        "rates": [
            {"image_size": 128, "batch_size": 256, "images_per_s": 9000.0},
            {"image_size": 224, "batch_size": 256, "images_per_s": 3000.0},
        ],
    }
    doc.update(kw)
    return doc


def test_profile_file_replaces_published_rates(tmp_path, prof):
    f = tmp_path / "gpu.json"
    f.write_text(json.dumps(profile_doc()))
    rates = tm.load_gpu_profile(f)
    assert 1 / rates.per_image_s(224) == pytest.approx(3000.0)
    assert 1 / rates.per_image_s(128) == pytest.approx(9000.0)
    phases = [tm.Phase(1, 100, 256, 224)]
    cluster = tm.Cluster(1, 8)
    be = tm.backends()[0]
    measured = tm.estimate(phases, cluster, rates, backend=be, prof=prof).phases[0].step_ms["compute"]
    published = tm.estimate(phases, cluster, tm.published("v100"), backend=be, prof=prof).phases[0].step_ms["compute"]
    assert measured == pytest.approx(256 / 3000 * 1000)
    assert published == pytest.approx(256 / 1200 * 1000)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "(top level)"),
        (json.dumps(profile_doc(dtype="fp8")), "dtype"),
        (json.dumps(profile_doc(gpu="")), "gpu"),
        (json.dumps(profile_doc(channels_last="yes")), "channels_last"),
        (json.dumps(profile_doc(rates=[])), "rates"),
        (json.dumps(profile_doc(rates=[{"image_size": 224, "batch_size": 256, "images_per_s": -1}])), "rates[0]."),
        (json.dumps(profile_doc(rates=[{"image_size": "224", "batch_size": 256, "images_per_s": 1}])), "rates[0]."),
    ],
)
def test_bad_profile_file_is_a_one_line_error(tmp_path, text, key):
    f = tmp_path / "bad.json"
    f.write_text(text)
    with pytest.raises(tm.ProfileError) as e:
        tm.load_gpu_profile(f)
    msg = str(e.value)
    assert "\n" not in msg and str(f) in msg and key in msg


def test_missing_profile_and_unknown_gpu_are_errors(tmp_path):
    with pytest.raises(tm.ProfileError, match="cannot read"):
        tm.load_gpu_profile(tmp_path / "nope.json")
    with pytest.raises(ValueError, match="make gpu-check"):
        tm.published("h100")
    with pytest.raises(ValueError, match="--dtype"):
        tm.published("v100", "bf16")
    with pytest.raises(ValueError, match="--gpu: expected"):
        tm.published("k80")


def test_predict_api_returns_an_ordered_range():
    lo, mid, hi = tm.predict(16, 8, "v100-32gb", "fp16")
    assert lo < mid < hi
    assert lo < 157.55 < hi  # our multistream on the record's cluster: the record is inside the calibrated range
    wall = tm.predict(16, 8, "v100-32gb", "fp16", clock="wall")
    assert wall[1] > mid


def test_out_of_sample_fastai_entries(prof):
    """Three fast.ai V100 entries (4, 8, 16 hosts x 8, 25 Gbit/s), never fitted on: the errors docs/scaling.md
    reports. The 16-host run is under-predicted (its 128 px steps were slower than a 10 Gbit/s flow explains)."""
    rows = tm.out_of_sample(ENTRIES / "out_of_sample.json", prof)
    assert len(rows) == 3
    errors = {r["source"].split("_p3_")[1][:2]: r["mid"] / r["published_s"] - 1 for r in rows}
    assert abs(errors["4_"]) < 0.10
    assert abs(errors["8_"]) < 0.15
    assert -0.40 < errors["16"] < 0
    for r in rows:
        assert r["low"] < r["mid"] < r["high"]
