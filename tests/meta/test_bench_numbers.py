"""Figures the docs quote from the benchmarks (docs/data/bench_*.json) and from published DAWNBench entries
(tests/data/dawnbench_entries), recomputed here from those files: a rerun that moves a figure fails until the docs
say the new one."""

from __future__ import annotations

import json
import statistics

from support import ROOT

from recipes.timemodel import rates
from recipes.timemodel.imagenet import IMAGENET_TRAIN_IMAGES

ENTRIES = ROOT / "tests" / "data" / "dawnbench_entries"


def _flat(path: str) -> str:
    return " ".join((ROOT / path).read_text().split())


def _epoch_seconds(tsv: str) -> list[float]:
    """Each epoch's seconds: the TSV's hours column is the training clock at the end of each epoch."""
    rows = [line.split("\t") for line in (ENTRIES / tsv).read_text().splitlines()[1:] if line.strip()]
    hours = [0.0] + [float(r[1]) for r in rows]
    return [(b - a) * 3600 for a, b in zip(hours, hours[1:], strict=False)]


def test_fastai_1x8_epoch_medians_and_per_gpu_rate_are_the_entrys():
    """fast.ai's April 2018 1 x 8 entry: 18 epochs at 128 px, 23 at 224 px, 4 at 288 px (imagenet-fast's --small
    schedule); the time model's medians and the docs' 465 img/s per GPU at 224 px come from its TSV."""
    secs = _epoch_seconds("fastai_pytorch.tsv")
    assert len(secs) == 45
    medians = {sz: statistics.median(secs[a:b]) for sz, a, b in ((128, 0, 18), (224, 18, 41), (288, 41, 45))}
    for sz, m in medians.items():
        assert abs(m - rates.FASTAI_1X8_EPOCH_S[sz]) < 0.01, sz  # the constant keeps two decimals
    per_gpu = IMAGENET_TRAIN_IMAGES / medians[224] / 8
    assert f"fastai/imagenet-fast, {per_gpu:.0f} img/s per GPU at 224 px" in _flat("docs/scaling.md")


def test_fastai_8x8_per_gpu_rate_at_224_is_the_slope_between_its_batches():
    """The 8 x 8 entry runs 224 px at 128 images per GPU (epochs 14-16, global 8192) then 224 (epochs 17-28, 14336):
    a step's time against its per-GPU batch has the compute per image as its slope, fixed costs as its intercept."""
    secs = _epoch_seconds("fastai_resnet50_p3_8_machine_pytorch.tsv")
    step_128 = statistics.median(secs[14:17]) / (IMAGENET_TRAIN_IMAGES / 8192)
    step_224 = statistics.median(secs[17:29]) / (IMAGENET_TRAIN_IMAGES / 14336)
    per_gpu = (224 - 128) / (step_224 - step_128)
    assert 550 < per_gpu < 700  # a faster GPU rate than the 1 x 8 entry's 465, as the docs argue
    assert f"their own steps show ~{round(per_gpu, -1):.0f} img/s per GPU at 224 px" in _flat("docs/scaling.md")


# --- The benchmarks' tables: each doc quotes its bench's --json file (docs/data/bench_*-DATE.json) under a header
# naming the command, the machine, the date, the torch version and the commit, and every figure is recomputed here.

DATA = ROOT / "docs" / "data"
TRAINER = "bench_trainer-2026-12-05.json"
OPTIM = "bench_optim-2026-12-05.json"
INPUT = "bench_input-2026-12-05.json"
INFERENCE = "bench_inference-2026-12-05.json"
IMAGENET_FILES = 1_331_167  # train + val


def _bench(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def _assert_header(doc: dict, text: str) -> None:
    for part in (
        f"`{doc['command']}`",
        "2-core machine",
        doc["date"],
        f"torch {doc['torch']}",
        f"commit {doc['commit']}",
    ):
        assert part in text, part


def _listed(name: str, doc: dict) -> None:
    """docs/data/README.md lists the file with the command that wrote it."""
    assert f"| `{name}` | `{doc['command']}` |" in (DATA / "README.md").read_text()


def test_the_trainer_overhead_table_is_its_data_file():
    doc = _bench(TRAINER)
    res, text = doc["results"], _flat("docs/benchmarks.md")
    _assert_header(doc, text)
    _listed(TRAINER, doc)
    bare = statistics.median(res["images_per_s"]["bare"])
    ours = statistics.median(res["images_per_s"]["trainer"])
    assert len(res["images_per_s"]["bare"]) == res["rounds"]
    shape = f"{res['model']}, {res['image_size']} px, batch {res['batch']}, synthetic"
    assert f"| bare forward/backward/step ({shape}) | {bare:.1f} | 1.000 |" in text
    assert f"| trainer (`Trainer.train_one_epoch`) | {ours:.1f} | {ours / bare:.3f} |" in text
    assert f"median of {res['rounds']} rounds x {res['steps']} steps" in text
    assert f"The trainer costs {100 * (1 - ours / bare):.1f}% against the bare loop" in text


def test_the_optimizer_table_is_its_data_file():
    doc = _bench(OPTIM)
    res, text = doc["results"], _flat("docs/recipe.md")
    _assert_header(doc, text)
    _listed(OPTIM, doc)
    times = res["step_s"]
    base = times["torch.optim.SGD(foreach=True) (baseline)"]
    b_med, b_min = statistics.median(base), min(base)
    assert f"{res['steps']} steps of each optimizer on `{res['model']}`'s {res['tensors']} tensors" in text
    assert f"{res['values'] / 1e6:.1f} M values" in text
    for name, ts in times.items():
        assert len(ts) == res["steps"], name
        med = statistics.median(ts)
        row = f"| {name} | {med * 1e3:.2f} | {med / b_med:.2f}x | {min(ts) * 1e3:.2f} | {min(ts) / b_min:.2f}x |"
        assert row in text, row
    hybrid = statistics.median(times["optim.name=hybrid"]) / b_med
    assert f'The script prints "hybrid / SGD(foreach=True), medians: {hybrid:.2f}x"' in text
    sgd = statistics.median(times["optim.name=sgd"]) / b_med
    assert f"`optim.name=sgd` runs the baseline's own algorithm and reads {sgd:.2f}x" in text


def _input_medians(res: dict) -> dict[str, tuple[float, float, float, float]]:
    """Per pipeline: median, min, max images/s and median CPU ms/img over the rounds (the bench's own summary)."""
    out = {}
    for name, rounds in res["pipelines"].items():
        assert len(rounds) == res["rounds"], name
        ips, cpu = [r[0] for r in rounds], [r[1] for r in rounds]
        out[name] = (statistics.median(ips), min(ips), max(ips), statistics.median(cpu))
    return out


def test_the_input_table_and_its_ratios_are_the_data_file():
    doc = _bench(INPUT)
    res, text = doc["results"], _flat("docs/input.md")
    _assert_header(doc, text)
    _listed(INPUT, doc)
    m = _input_medians(res)
    full_ips = max(m["decode only (DALI, libjpeg-turbo)"][0], m["decode only (PIL)"][0])
    full_cpu = min(m["decode only (DALI, libjpeg-turbo)"][3], m["decode only (PIL)"][3])
    small_ips, small_cpu = m["decode only pre-resized (DALI)"][0], m["decode only pre-resized (DALI)"][3]
    for name, (med, lo, hi, cpu) in m.items():
        vs = f"{med / m[name.replace('dali', 'torch')][0]:.2f}x" if name.startswith("dali") else ""
        small = "pre-resized" in name
        pct = f"{100 * med / (small_ips if small else full_ips):.0f}%"
        pct_cpu = f"{100 * (small_cpu if small else full_cpu) / cpu:.0f}%"
        row = f"| {name} | {med:.0f} | {lo:.0f} - {hi:.0f} | {cpu:.2f} | {vs} | {pct} | {pct_cpu} |"
        row = " ".join(row.split())  # an empty cell, as _flat reads it
        assert row in text, row

    def ratio(a: str, b: str, i: int = 0) -> str:
        x, y = m[a][i], m[b][i]
        return f"{(x / y if i == 0 else y / x):.2f}x"

    pre, d128, d224 = ("dali 128 pre-resized", "dali 128"), ("dali 128", "torch 128"), ("dali 224", "torch 224")
    by_rate = f"By images/s: pre-resized 128 px phase vs full size (DALI) **{ratio(*pre)}**; DALI vs torchvision "
    by_rate += f"**{ratio(*d128)}** at 128 px, **{ratio(*d224)}** at 224 px."
    by_cpu = f"By CPU time per image: **{ratio(*pre, 3)}**; **{ratio(*d128, 3)}** and **{ratio(*d224, 3)}**."
    assert by_rate in text and by_cpu in text
    assert (
        f"Full size: {res['data']['full']}; pre-resized (its `--short-side 160` copy): {res['data']['pre-resized']}."
        in text
    )
    assert f"{res['rounds']} rounds in rotating order, medians" in text
    for stage, c in res["stages_cpu_ms"].items():
        assert f"| {stage} | {c['128']:.2f} | {c['224']:.2f} |" in text, stage
    reading = f"Reading it: DALI is {ratio(*d128)} torchvision at 128 px and {ratio(*d224)} at 224 px. The pre-resized "
    reading += f"128 px phase is {ratio(*pre)} the full-size path on the CPU. DALI reaches "
    reading += f"{100 * full_cpu / m['dali 128'][3]:.0f}% of the decode-only ceiling at 128 px and "
    reading += f"{100 * full_cpu / m['dali 224'][3]:.0f}% at 224 px (CPU time per image)."
    assert reading in text
    s = res["stages_cpu_ms"]
    whole, crop = s["decode the whole image"], s["decode the random crop only (fused)"]
    bilinear, nearest = s["+ resize, bilinear with antialias"], s["+ resize, nearest neighbour (for scale)"]
    full = s["+ resize (bilinear) + flip + normalize"]
    why = f"fusing the crop into the decode makes decoding {100 * (1 - crop['128'] / whole['128']):.0f}% cheaper than "
    why += f"the whole-image decode at 128 px, and DALI's CPU bilinear resize adds {bilinear['128'] - crop['128']:.2f} "
    why += f"ms/img at 128 px and {bilinear['224'] - crop['224']:.2f} ms/img at 224 px (nearest neighbour would add "
    why += f"{nearest['128'] - crop['128']:.2f}), flip + normalize another {full['128'] - bilinear['128']:.2f} and "
    why += f"{full['224'] - bilinear['224']:.2f}. On the pre-resized copy decoding drops to {small_cpu:.2f} ms/img"
    assert why in text


def test_the_header_scan_figures_are_the_data_file():
    doc = _bench(INPUT)
    scan = doc["results"]["header_scan_us_per_file"]
    us = statistics.median(scan)
    files = int(doc["results"]["data"]["full"].split()[0])
    text = _flat("docs/input.md")
    quoted = f"The scan took {us:.0f} us per file with {doc['results']['threads']} threads on the bench's {files} "
    assert quoted in text
    on8, on128 = IMAGENET_FILES / 8 * us / 1e6, IMAGENET_FILES / 128 * us / 1e6
    assert f"about {on8:.0f} s per rank for ImageNet's 1.33 M files on 8 ranks, and {on128:.1f} s on 128" in text
    for gone in ("49 us", "478 against 323 us", "about 1.5x as long"):
        assert gone not in text


def _medians(rec: dict) -> dict[str, float]:
    return {m: r["latency_ms"]["excluding_preprocessing"]["median"] for m, r in rec["results"].items()}


def _latency_row(mode: str, r: dict, base_median: float, build_s: float) -> str:
    ex, inc = r["latency_ms"]["excluding_preprocessing"], r["latency_ms"]["including_preprocessing"]
    cells = [f"`{mode}`", f"{ex['mean']:.3f}", f"{ex['median']:.3f}", f"{ex['p99']:.3f}", f"{inc['mean']:.3f}"]
    cells += [f"{1e3 / ex['mean']:.1f}", f"{r['top1']:.2f}", f"{r['top5']:.2f}"]
    cells += [f"{r['agreement_top1']:.2f}", f"{r['agreement_top5']:.2f}", f"{ex['median'] / base_median:.2f}x"]
    return "| " + " | ".join([*cells, f"{build_s:.0f}"]) + " |"


def test_the_inference_latency_tables_are_the_data_file():
    doc = _bench(INFERENCE)
    text = _flat("docs/evaluation.md")
    _assert_header(doc, text)
    _listed(INFERENCE, doc)
    for rec in doc["results"]["models"]:
        res, med = rec["results"], _medians(rec)
        title = f"### {rec['model']}, {rec['image_size']} px, batch 1, {rec['images']} images, cpu ({rec['threads']} "
        assert title in text
        for mode, r in res.items():
            row = _latency_row(mode, r, med["onnxruntime"], rec["build_s"][mode])
            assert row in text, row
        exact = min(("fuse", "compile"), key=med.get)
        assert (
            f"- best fp32-exact mode `{exact}`: {med[exact] / med['onnxruntime']:.2f}x ONNX Runtime's latency" in text
        )
        agree5 = res["int8"]["agreement_top5"]
        int8 = f"- `int8`: {med['int8'] / med['onnxruntime']:.2f}x ONNX Runtime fp32's latency, "
        int8 += f"top-5 agreement {agree5:.1f}%"
        assert int8 in text
        like = f"- like with like: `int8` {med['int8']:.2f} ms vs ONNX Runtime's static INT8 "
        like += f"{med['onnxruntime-int8']:.2f} ms ({med['int8'] / med['onnxruntime-int8']:.2f}x)"
        assert like in text
        assert (
            f"- preprocessing (decode, resize, crop): median {rec['preprocessing_ms']['median']:.2f} ms/image" in text
        )
    by = {rec["model"]: rec for rec in doc["results"]["models"]}
    m50, m26 = (_medians(by[name]) for name in ("resnet50_tweaked", "resnet26d"))
    e50, e26 = (min(m["fuse"], m["compile"]) / m["onnxruntime"] for m in (m50, m26))
    agree5 = by["resnet50_tweaked"]["results"]["int8"]["agreement_top5"]
    reading = f"INT8 (PT2E + AOTInductor) runs ResNet-50-D at {m50['int8'] / m50['onnxruntime']:.2f}x ONNX Runtime "
    reading += f"fp32 with {agree5:.1f}% top-5 agreement, and at {m50['int8'] / m50['onnxruntime-int8']:.2f}x "
    reading += f"(ResNet-50-D) and {m26['int8'] / m26['onnxruntime-int8']:.2f}x (ResNet-26-D) ONNX Runtime's own "
    reading += "static INT8 on the same model and calibration images. The best fp32-exact mode runs at "
    reading += f"{e50:.2f}x ONNX Runtime fp32 on ResNet-50-D and {e26:.2f}x on ResNet-26-D."
    assert reading in text
    assert "differed by up to 10% per row" not in text


def test_one_off_measurements_without_a_data_file_are_gone():
    recipe = _flat("docs/recipe.md")
    for gone in ("3 min 56 s", "1.1e-3 measured", "11 s with its on-disk cache"):
        assert gone not in recipe
    assert "adds about 3 minutes" not in _flat("README.md")  # the install time: no data file measured it
