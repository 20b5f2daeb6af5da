"""The benchmarks' --json files: what the docs' tables are regenerated from (docs/data/bench_*.json)."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from scripts.bench import bench_optim, bench_trainer, record


def test_the_file_names_its_command_date_torch_and_commit(tmp_path):
    out = tmp_path / "b.json"
    record.write_json(str(out), "scripts.bench.bench_x", ["--rounds", "3", "--json", str(out)], {"v": [1.0, 2.5]})
    doc = json.loads(out.read_text())
    assert doc["command"] == f"python -m scripts.bench.bench_x --rounds 3 --json {out}"
    assert doc["torch"] == torch.__version__
    assert len(doc["date"]) == 10 and doc["date"][4] == "-"
    assert doc["commit"] == "unknown" or len(doc["commit"].split("+")[0]) == 12
    assert doc["machine"]["threads"] == torch.get_num_threads()
    assert doc["results"] == {"v": [1.0, 2.5]}


@pytest.mark.parametrize("bad", ["missing/b.json", "."])
def test_an_unwritable_target_is_refused_before_measuring(tmp_path, monkeypatch, capsys, bad):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        bench_trainer.main(["--json", bad])
    assert "--json" in str(e.value) and bad.split("/")[0] in str(e.value)


def test_bench_trainer_json_holds_every_rounds_rate(tmp_path, capsys):
    out = tmp_path / "t.json"
    argv = ["--image-size", "32", "--batch", "4", "--steps", "2", "--rounds", "2", "--json", str(out)]
    assert bench_trainer.main(argv) == 0
    res = json.loads(out.read_text())["results"]
    assert (res["rounds"], res["steps"], res["batch"]) == (2, 2, 4)
    bare, ours = res["images_per_s"]["bare"], res["images_per_s"]["trainer"]
    assert len(bare) == len(ours) == 2 and min(bare + ours) > 0
    printed = capsys.readouterr().out
    assert f"| bare forward/backward/step | {statistics.median(bare):.1f} | 1.000 |" in printed
    ratio = statistics.median(ours) / statistics.median(bare)
    assert f"| trainer (`Trainer.train_one_epoch`) | {statistics.median(ours):.1f} | {ratio:.3f} |" in printed


def test_bench_optim_json_holds_every_steps_time(tmp_path, capsys):
    out = tmp_path / "o.json"
    assert bench_optim.main(["--model", "resnet18", "--quick", "--steps", "2", "--json", str(out)]) == 0
    res = json.loads(out.read_text())["results"]
    assert res["steps"] == 2 and res["model"] == "resnet18"
    times = res["step_s"]
    assert set(times) >= {"torch.optim.SGD(foreach=True) (baseline)", "optim.name=hybrid"}
    assert all(len(ts) == 2 and min(ts) > 0 for ts in times.values())
    base = statistics.median(times["torch.optim.SGD(foreach=True) (baseline)"])
    hybrid = statistics.median(times["optim.name=hybrid"])
    assert f"hybrid / SGD(foreach=True), medians: {hybrid / base:.2f}x (target <= 1.5x: " in capsys.readouterr().out


def test_bench_optim_verdict_fails_a_hybrid_step_over_one_and_a_half_sgd_steps():
    assert bench_optim.verdict(1.5) == "target <= 1.5x: met"
    assert bench_optim.verdict(1.51) == "target <= 1.5x: NOT met"
    assert bench_optim.verdict(4.88) == "target <= 1.5x: NOT met"  # the CPU step before the per-tensor multiply


def _jpegs(root, n: int) -> None:
    from PIL import Image

    (root / "train" / "c0").mkdir(parents=True)
    for i in range(n):
        Image.new("RGB", (40 + i, 30), (i, 2 * i, 3)).save(root / "train" / "c0" / f"{i}.JPEG")


def test_bench_input_times_the_header_scan_per_file(tmp_path):
    from types import SimpleNamespace

    from scripts.bench import bench_input

    _jpegs(tmp_path, 4)
    text, per_file = bench_input.scan_table(tmp_path, SimpleNamespace(threads=1, rounds=3))
    assert len(per_file) == 3 and min(per_file) > 0
    assert f"4 files, 1 threads, page cache warm: median {statistics.median(per_file):.0f} us per file" in text
    (tmp_path / "train" / "c0" / "1.JPEG").write_bytes(b"")  # the scan refuses it: the bench says which file
    with pytest.raises(SystemExit, match=r"1\.JPEG"):
        bench_input.scan_table(tmp_path, SimpleNamespace(threads=1, rounds=1))


def test_bench_inference_json_holds_each_modes_statistics(tmp_path, capsys):
    from PIL import Image

    from scripts.bench import bench_inference

    for split in ("train", "val"):
        for c in ("a", "b"):
            (tmp_path / split / c).mkdir(parents=True)
            for i in range(2):
                Image.new("RGB", (64, 48), (40 * i, 90, 7)).save(tmp_path / split / c / f"{i}.JPEG")
    out = tmp_path / "i.json"
    argv = ["--models", "resnet18", "--modes", "none,fuse", "--images", "3", "--calib-images", "2", "--warmup", "1"]
    argv += ["--image-size", "64", "--threads", "1", "--data", str(tmp_path), "--json", str(out)]
    assert bench_inference.main(argv) == 0
    res = json.loads(out.read_text())["results"]
    [rec] = res["models"]
    assert (rec["model"], rec["images"], rec["image_size"]) == ("resnet18", 3, 64)
    assert set(rec["results"]) == set(rec["build_s"]) == {"none", "fuse"}
    assert set(res["versions"]) == {"torchao", "onnxruntime", "onnx"}
    med = rec["results"]["fuse"]["latency_ms"]["excluding_preprocessing"]["median"]
    fuse = rec["results"]["fuse"]["latency_ms"]["excluding_preprocessing"]
    assert f"| `fuse` | {fuse['mean']:.3f} | {med:.3f} |" in capsys.readouterr().out
