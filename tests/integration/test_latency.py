"""The DAWNBench latency protocol: image selection, statistics, agreement, rounds, the CLI's JSON and entry."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from support import ROOT

import evaluate
from data.folder import scan_split
from data.transforms import normalize
from recipes.evaluation.accuracy import config_from_checkpoint, load_model
from recipes.evaluation.inference import Runner
from recipes.evaluation.latency import Prefetcher, load_image, run_protocol, select_images
from recipes.rundir import checkpoint_files as ckpt


def test_select_images_is_a_seeded_sorted_subset():
    a = select_images(100, 10, seed=0)
    assert len(a) == 10 and len(set(a.tolist())) == 10 and (np.diff(a) > 0).all()
    assert (a == select_images(100, 10, seed=0)).all() and not (a == select_images(100, 10, seed=1)).all()
    assert (select_images(5, 10) == np.arange(5)).all() and (select_images(5, 0) == np.arange(5)).all()


def _ranked(order: list[int]) -> torch.Tensor:
    logits = torch.zeros(1, 10)
    for rank, c in enumerate(order):
        logits[0, c % 10] = 10.0 - rank
    return logits


def _cls(image: torch.Tensor) -> int:
    return int(image.to(torch.int64).sum()) % 10


def test_protocol_statistics_agreement_and_rounds(tiny_root):
    val = scan_split(tiny_root, "val")
    files, labels = val.files[:10], val.labels[:10]
    calls = []

    def ref(image):
        calls.append("ref")
        c = _cls(image)
        return _ranked([c + i for i in range(10)])

    def other(image):  # c % 3 == 0: reference class outside the top-5; == 1: at rank 2; else identical
        calls.append("other")
        c = _cls(image)
        if c % 3 == 0:
            return _ranked([c + 5 + i for i in range(10)])
        if c % 3 == 1:
            return _ranked([c + 1, c] + [c + i for i in range(2, 10)])
        return _ranked([c + i for i in range(10)])

    cpu = torch.device("cpu")
    out = run_protocol(
        [Runner("ref", ref, cpu), Runner("other", other, cpu)], files, labels, 32, crop_ratio=0.875, warmup=2, chunk=4
    )
    classes = np.array([_cls(load_image(f, 32, 0.875)) for f in files])
    r, o = out["results"]["ref"], out["results"]["other"]
    assert r["images"] == o["images"] == 10
    assert r["top1"] == pytest.approx(100.0 * np.mean(classes == np.array(labels)))
    assert r["agreement_top1"] == r["agreement_top5"] == 100.0 and o["agreement_with"] == "ref"
    assert o["agreement_top1"] == pytest.approx(100.0 * np.mean(classes % 3 == 2))
    assert o["agreement_top5"] == pytest.approx(100.0 * np.mean(classes % 3 != 0))
    for res in (r, o):
        ex, inc = res["latency_ms"]["excluding_preprocessing"], res["latency_ms"]["including_preprocessing"]
        assert 0 < ex["min"] <= ex["median"] <= ex["p99"] <= ex["max"]
        assert inc["mean"] == pytest.approx(ex["mean"] + out["preprocessing_ms"]["mean"])
        assert res["images_per_s"]["excluding_preprocessing"] == pytest.approx(1e3 / ex["mean"])
    # 3 rounds of 4, 4, 2 images; the contender that starts alternates: ref, other | other, ref | ref, other
    switches = [c for i, c in enumerate(calls) if i == 0 or calls[i - 1] != c]
    assert switches == ["ref", "other", "ref", "other"]
    assert calls.count("ref") == 10 + 2 + 2  # timed + warm-up + one untimed call at each later round


def test_latency_cli_writes_json_and_dawnbench_entry(tiny_checkpoint, tiny_root, tmp_path, capsys):
    out, entry = tmp_path / "latency.json", tmp_path / "entry.json"
    threads = torch.get_num_threads()
    try:
        rc = evaluate.main(
            [
                str(tiny_checkpoint),
                "--data",
                str(tiny_root),
                "--latency",
                "--images",
                "12",
                "--optimize",
                "fuse",
                "--warmup",
                "1",
                "--threads",
                "1",
                "--price-per-hour",
                "3.6",
                "--hardware",
                "test box",
                "--author",
                "Ada Lovelace",
                "--out",
                str(out),
                "--entry",
                str(entry),
            ]
        )
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| `none` |" in printed and "| `fuse` |" in printed and "cost (fuse): $" in printed
    res = json.loads(out.read_text())
    # the ratio column says which way it reads: this mode's median latency over the baseline's
    cells = {ln.split(" | ")[0]: [c.strip() for c in ln.strip("|").split("|")] for ln in printed.splitlines()}
    head, row = cells["| mode"], cells["| `fuse`"]
    median = {m: r["latency_ms"]["excluding_preprocessing"]["median"] for m, r in res["results"].items()}
    assert row[head.index("latency vs none")] == f"{median['fuse'] / median['none']:.2f}x"
    assert (res["images"], res["batch_size"], res["image_size"], res["threads"]) == (12, 1, 32, 1)
    assert set(res["results"]) == {"none", "fuse"}
    # top-1 of the eager model on the same 12 images, counted here image by image
    ck = ckpt.load_checkpoint(tiny_checkpoint)
    model = load_model(ck, config_from_checkpoint(ck)).eval()
    val = scan_split(tiny_root, "val", classes=ck.model_info.classes)
    pick = select_images(len(val), 12, 0)
    with torch.no_grad():
        hits = sum(
            int(model(normalize(load_image(val.files[i], 32, 0.875), False)).argmax()) == val.labels[i] for i in pick
        )
    fuse = res["results"]["fuse"]
    assert res["results"]["none"]["top1"] == pytest.approx(100.0 * hits / 12)
    assert fuse["top1"] == pytest.approx(100.0 * hits / 12) and fuse["agreement_top1"] == 100.0
    mean = fuse["latency_ms"]["excluding_preprocessing"]["mean"]
    assert fuse["cost_usd"]["per_image"]["excluding_preprocessing"] == pytest.approx(3.6 * mean / 3.6e6)
    e = json.loads(entry.read_text())
    assert e == res["dawnbench"]
    assert (e["latency"], e["top5Accuracy"], e["hardware"]) == (mean, fuse["top5"], "test box")
    # USD per image, as every real entry (3.1228484e-07 for 0.637 ms on a T4 at 1.764 USD/h)
    assert e["cost"] == pytest.approx(3.6 * mean / 3.6e6) and e["misc"]["optimize"] == "fuse"
    real = json.loads(
        (ROOT / "tests/data/dawnbench_entries/AlibabaCloud_resnet26d_1t4_ecs_pytorch_tensorRT.json").read_text()
    )
    for key, value in real.items():  # every field of the real entry, with its type (codeURL is optional)
        if key == "codeURL":
            continue
        assert key in e and type(e[key]) in ({int, float} if type(value) in (int, float) else {type(value)}), key
    assert e["misc"]["images"] == 12 and e["misc"]["all_validation_images"] is False
    assert e["misc"]["latency_including_preprocessing_ms"] > e["latency"]
    # ours, as in the training entry: whether it is a DAWNBench result, and why not (the checkpoint names nobody)
    assert (e["author"], e["authorEmail"], e["qualifies"]) == ("Ada Lovelace", "", False)
    why = ["it measured 12 validation images, not ImageNet's 50,000 (--images 0 on the whole set)"]
    why += ["its authorEmail is empty (--author, --author-email)"]
    assert e["notQualifyingBecause"] == [r for r in e["notQualifyingBecause"] if r.startswith("its top-5 is")] + why
    assert f"DAWNBench inference entry: does NOT qualify: {'; '.join(e['notQualifyingBecause'])}" in printed


def test_latency_caps_images_and_refuses_torchrun(tiny_checkpoint, tiny_root, tmp_path, capsys, monkeypatch):
    out = tmp_path / "l.json"
    assert (
        evaluate.main(
            [
                str(tiny_checkpoint),
                "--data",
                str(tiny_root),
                "--latency",
                "--images",
                "1000",
                "--warmup",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "has 20 images, fewer than --images 1000: measuring all of them" in capsys.readouterr().out
    assert json.loads(out.read_text())["images"] == 20
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert evaluate.main([str(tiny_checkpoint), "--data", str(tiny_root), "--latency"]) == 2
    assert "run it without torchrun" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_prefetcher_delivers_every_image_on_the_device():
    dev = torch.device("cuda")
    host = [torch.full((1, 3, 8, 8), i, dtype=torch.uint8).pin_memory() for i in range(5)]
    got = [x for x in Prefetcher(dev)(host)]
    assert all(x.device.type == "cuda" for x in got)
    assert [int(x[0, 0, 0, 0]) for x in got] == list(range(5))


def test_an_inference_entry_qualifies_on_the_whole_set_at_93_percent():
    from recipes.evaluation.latency import inference_qualification

    out = {"images": 50_000, "results": {"int8": {"top5": 93.0}}}
    assert inference_qualification(out, "int8", "Ada", "ada@example.org") == []
    out["results"]["int8"]["top5"] = 92.99
    assert inference_qualification(out, "int8", "Ada", " ") == [
        "its top-5 is 92.99%, under DAWNBench's 93%",
        "its authorEmail is empty (--author, --author-email)",
    ]
