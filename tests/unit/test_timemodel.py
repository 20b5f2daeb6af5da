"""recipes/timemodel/: a GPU profile file replaces the published rates, bad profile files give one-line errors, the
step floor, the input term and the predict API. (The published evidence, calibration and out of sample:
tests/lab/test_timemodel_evidence.py.)"""

from __future__ import annotations

import json

import pytest

from recipes import timemodel as tm


@pytest.fixture(scope="module")
def prof():
    return tm.profile_model("resnet50")


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
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected an object"),
        (json.dumps(profile_doc()).replace("]", ', {"image_size": 96, "batch_size": 8, "images_per_s": NaN}]'), "NaN"),
        (
            json.dumps(profile_doc()).replace("]", ', {"image_size": 96, "batch_size": 8, "images_per_s": 1e999}]'),
            "1e999",
        ),
        (json.dumps(profile_doc(dtype="fp8")), "dtype"),
        (json.dumps(profile_doc(gpu="")), "gpu"),
        (json.dumps(profile_doc(channels_last="yes")), "channels_last"),
        (json.dumps(profile_doc(rates=[])), "rates"),
        (json.dumps(profile_doc(rates=[{"image_size": 224, "batch_size": 256, "images_per_s": -1}])), "rates[0]."),
        (json.dumps(profile_doc(rates=[{"image_size": "224", "batch_size": 256, "images_per_s": 1}])), "rates[0]."),
        (
            json.dumps(profile_doc(rates=[{"image_size": 224, "batch_size": 256, "images_per_s": 1e-300}])),
            "rates[0].images_per_s: expected a number in [0.01, 1e+09]",
        ),
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
    with pytest.raises(tm.ProfileError, match="does not exist"):
        tm.load_gpu_profile(tmp_path / "nope.json")
    with pytest.raises(tm.ProfileError, match="expected a regular file"):
        tm.load_gpu_profile("/dev/zero")
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


def test_predict_api_ddp_is_the_one_flow_row():
    """backend="ddp" is DDP with one TCP flow per communicator (260 s on the record's 16 x 8 V100 cluster), not the
    4-flow row that shares its stepmodel name (153 s)."""
    one = tm.predict(16, 8, "v100-32gb", "fp16", backend="ddp")[1]
    four = tm.predict(16, 8, "v100-32gb", "fp16", backend="ddp (4 flows)")[1]
    assert 240 < one < 280 and 140 < four < 165
    with pytest.raises(ValueError, match="'ddp \\(4 flows\\)'.*got 'nccl'"):
        tm.predict(16, 8, "v100-32gb", "fp16", backend="nccl")


def test_h200_profile_has_a_step_floor_set_on_the_host():
    """The H200 profile: 96 and 128 px at 256 per GPU take the same ~36 ms that 224 px's per-pixel rate would do in
    10-18 ms: a floor. The model keeps every measured step within the spread and never goes under the floor."""
    g = tm.load_gpu_profile(tm.H200_PROFILE)
    lo, mid, hi = g.step_floor
    assert (lo, hi) == pytest.approx((256 / 7377.1, 256 / 6799.6), rel=1e-4)
    first = sorted(tm.split_floor(g.rates)[1])
    rerun = json.loads(tm.H200_RERUN.read_text())["rates"]
    waited = [  # steps whose GPU kernels ran under 90% of the step: the GPU waited for the host
        r["batch_size"] / r["images_per_s"]
        for r in rerun
        if r["kernel_ms_per_step"] / 1e3 < 0.9 * r["batch_size"] / r["images_per_s"]
    ]
    assert [r["image_size"] for r in rerun if r["batch_size"] / r["images_per_s"] in waited] == [96, 128]
    assert sorted(tm.HOST_FLOOR_STEPS) == pytest.approx(sorted(first + waited), rel=1e-4)
    lo2, mid2, hi2 = tm.measured("h200", "fp16").step_floor  # the H200's table takes the floor of both hosts
    assert (lo2, hi2) == pytest.approx((256 / 9874.1, 256 / 6155.3), rel=1e-4) and lo2 < mid2 < hi2
    for r in g.rates:
        assert g.step_s(r.image_size, r.batch_size) == pytest.approx(r.batch_size / r.images_per_s, rel=0.05)
    assert 256 * g.per_image_s(96) < 0.5 * mid  # the GPU's arithmetic alone is far under the floor
    for size, batch in ((96, 256), (96, 32), (128, 64), (160, 128)):
        assert g.step_s(size, batch) >= mid
    assert g.step_s(224, 256) == pytest.approx(256 / 4702.4)  # GPU-bound: the measured step


def test_the_floor_is_a_term_of_every_phase(prof):
    """estimate(): compute + step floor = the floor at 96 px on an H200; without the term the step would be 10 ms."""
    g = tm.published("h200")
    est = tm.estimate(
        [tm.Phase(1, 100, 256, 96), tm.Phase(1, 100, 256, 224)],
        tm.Cluster(1, 1),
        g,
        backend=tm.backends()[0],
        prof=prof,
    )
    small, large = (p.step_ms for p in est.phases)
    assert small["compute"] + small["step floor"] == pytest.approx(g.step_floor[1] * 1e3)
    assert small["step floor"] > 20.0
    assert large["step floor"] == 0.0
    floor = next(t for t in est.phases[0].terms if t.name == "step floor")
    assert floor.low <= floor.mid <= floor.high and "gpu_profile-h200" in floor.source


def test_published_stacks_without_a_floor_in_their_steps():
    """Alibaba's TF + XLA steps shrink with the pixels at every size: no floor there, so the calibration is unchanged;
    this trainer's published-rate tables get the host floor measured on the H200 as a lower bound only."""
    assert tm.PUBLISHED["v100-tf-xla"].step_floor == (0.0, 0.0, 0.0)
    assert tm.PUBLISHED["v100-pytorch-2018"].step_floor == (0.0, 0.0, 0.0)
    v = tm.published("v100")
    assert v.step_s(96, 256) == pytest.approx(256 * v.per_image_s(96))  # above the floor: the published rate
    assert v.step_s(96, 32) == pytest.approx(v.step_floor[1])


def test_h200_bf16_rows_and_the_h100_from_them():
    """bf16 rows equal the check file's; the H100 is 0.70-1.0 of the H200 where the GPU bounds the step, equal at the
    floor."""
    rows = {r["name"]: r["number"] for r in json.loads(tm.H200_CHECK.read_text())["rows"]}
    for size, (batch, ips) in tm.H200_BF16.items():
        assert rows[f"train step resnet50_tweaked bf16 {size}px b{batch}"] == pytest.approx(ips, abs=0.1)
    for dtype in tm.DTYPES:
        h200, h100 = tm.published("h200", dtype), tm.published("h100", dtype)
        t200, t100 = h200.step_s(224, 256), h100.step_s(224, 256)
        u = h100.uncertainty(224)
        assert t100 * (1 - u) <= t200 * 1.001 and t100 * (1 + u) >= t200 / 0.70 * 0.999
        assert h100.step_s(96, 256) == pytest.approx(h200.step_s(96, 256))
    assert tm.gpu_for_device("NVIDIA H200") == "h200" and tm.gpu_for_device("NVIDIA H100 80GB HBM3") == "h100"


def test_each_accumulated_micro_batch_waits_for_the_step_floor(prof):
    rates = tm.published("h100", "fp16")
    floor = rates.step_floor[1]
    cluster, be = tm.Cluster(2, 8), tm.backends()[0]

    def step(micro_batches):
        phase = tm.Phase(1, 100, 2048, 96, micro_batches=micro_batches)
        return tm.estimate([phase], cluster, rates, backend=be, prof=prof).phases[0].step_ms

    whole, cut = step(1), step(4)
    compute = 2048 * rates.per_image_s(96)
    assert compute > floor > compute / 4  # one 2048-image step hides the floor; a 512-image micro-batch does not
    assert whole["compute"] == cut["compute"] == pytest.approx(compute * 1e3)
    assert whole["step floor"] == 0.0
    assert cut["step floor"] == pytest.approx(4 * (floor - compute / 4) * 1e3)


def test_a_step_waits_for_the_input_pipeline_where_it_decodes_slower(prof):
    rate = tm.InputRate(8)
    assert rate.images_per_s(96) == pytest.approx(18729.0) and tm.InputRate(4).images_per_s(96) == pytest.approx(9364.5)
    rates, cluster, be = tm.published("h100", "fp16"), tm.Cluster(1, 1), tm.backends()[0]
    phase = tm.Phase(1, 100, 2048, 96)

    def wait(inputs):
        est = tm.estimate([phase], cluster, rates, backend=be, prof=prof, inputs=inputs)
        return est.phases[0].step_ms

    fed, none = wait(rate), wait(None)
    assert none["input wait"] == 0.0
    busy = sum(v for k, v in none.items() if k != "input wait")
    assert fed["input wait"] == pytest.approx(2048 / 18729.0 * 1e3 - busy)  # 109 ms of decoding per step
    assert wait(tm.InputRate(64))["input wait"] == 0.0  # enough threads: no wait
