"""The DAWNBench JSON entry (recipes/dawnbench.py) and the files a finished run leaves for a submission."""

from __future__ import annotations

import datetime
import json
import os

import pytest
from support import ROOT, tiny_config

from base.errors import ConfigError
from recipes.config import load_config
from recipes.dawnbench import LAUNCHER_ENV, entry
from recipes.trainer import train

RECORD = [
    "optim.name=sgd",
    "optim.lr=25.0",
    "optim.final_lr=0.2",
    "optim.warmup_epochs=14",
    "optim.momentum=0.98",
    "optim.momentum_end=0.90",
    "optim.momentum_schedule=cyclic",
    "run.amp=fp16",
    "run.target_top5=93",
    "phases=[{epochs: 13, image_size: 96, batch_size: 32768}, {epochs: 11, image_size: 128, batch_size: 32768},"
    " {epochs: 3, image_size: 224, batch_size: 32768}, {epochs: 1, image_size: 288, batch_size: 16384,"
    " rect_val: true}]",
]
SUMMARY = {
    "world_size": 128,
    "epochs": 28,
    "steps": 1159,
    "time_to_target_seconds": 158.0,
    "train_seconds": 158.0,
    "wall_seconds": 171.5,
    "final_top1": 76.1,
    "final_top5": 93.04,
    "images_per_s": 230000.0,
}


def test_entry_fields_as_in_the_dawnbench_repository():
    extra = [
        "dawnbench.author=Team X",
        "dawnbench.cost_per_hour=329.6",
        "dawnbench.model=ResNet-50",
        "dawnbench.code_url=https://x",
    ]
    cfg = load_config(ROOT / "configs" / "base.yaml", [*RECORD, *extra])
    e = entry(cfg, SUMMARY, "16 machine(s) x 8 x Tesla V100-SXM2-32GB", datetime.date(2026, 3, 17), commit="abc")
    assert list(e) == [
        "version",
        "author",
        "authorEmail",
        "framework",
        "codeURL",
        "commitHash",
        "model",
        "hardware",
        "costPerHour",
        "timestamp",
        "misc",
        "usedBlacklist",
        "qualifies",  # ours: SUMMARY has no validation count, so this entry does not qualify, and says why
        "notQualifyingBecause",
    ]
    assert e["version"] == "v1.0" and e["author"] == "Team X" and e["model"] == "ResNet-50"
    assert e["framework"].startswith("PyTorch 2.")
    assert e["hardware"] == "16 machine(s) x 8 x Tesla V100-SXM2-32GB"
    assert e["costPerHour"] == 329.6 and e["timestamp"] == "2026-03-17"
    m = e["misc"]
    assert [p["image_size"] for p in m["imageSize"]] == [96, 128, 224, 288]
    assert [p["epochs"] for p in m["imageSize"]] == [13, 11, 3, 1] and m["imageSize"][3]["rect_val"] is True
    assert m["batchSize"] == [{"batch_size": 32768, "epochs": 27}, {"batch_size": 16384, "epochs": 1}]
    assert m["schedule"]["max_lr"] == 25.0 and m["schedule"]["min_lr"] == 0.2
    assert (m["schedule"]["momentum"], m["schedule"]["max_momentum"], m["schedule"]["min_momentum"]) == (
        "cyclic",
        0.98,
        0.9,
    )
    assert m["warmup_epochs"] == 14 and m["target"] == {"top5": 93.0}
    assert m["mixed_precision"] is True and m["amp_dtype"] == "fp16"
    assert m["iterations"] == 1159 and m["processes"] == 128
    assert m["cost_usd"] == pytest.approx(329.6 * 158.0 / 3600, abs=1e-4)


def test_optional_fields_are_left_out_when_not_configured():
    cfg = load_config(ROOT / "configs" / "base.yaml", [])
    e = entry(cfg, SUMMARY, "1 machine(s) x 1 x CPU (x86_64)")
    assert "costPerHour" not in e and "codeURL" not in e and "commitHash" not in e
    assert e["author"] == e["authorEmail"] == ""  # required by the format: present, empty until configured
    assert e["usedBlacklist"] is False and e["misc"]["mixed_precision"] is False
    assert "cost_usd" not in e["misc"]
    assert e["model"] == cfg.model.name
    assert datetime.date.fromisoformat(e["timestamp"]) == datetime.date.today()
    with pytest.raises(ConfigError, match="dawnbench.cost_per_hour: expected a number >= 0, got -1.0"):
        load_config(ROOT / "configs" / "base.yaml", ["dawnbench.cost_per_hour=-1"])


def test_a_finished_run_leaves_the_submission_files(tiny_root, tmp_path, capsys):
    run_dir = tmp_path / "sub"
    train(
        tiny_config(tiny_root, tmp_path, "dawnbench.author=Us", "dawnbench.cost_per_hour=3.06", "run.target_top5=90"),
        run_dir=run_dir,
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    e = json.loads((run_dir / "dawnbench.json").read_text())
    assert e["author"] == "Us" and e["costPerHour"] == 3.06
    assert e["commitHash"] and e["usedBlacklist"] is False
    assert summary["val_count"] == e["misc"]["val_images_counted"] > 0 and summary["val_excluded"] == 0
    # the same entry and TSV under the entries repository's file name; 20 validation images and a 90% target are
    # no DAWNBench result (nor 4 classes), and the name, the top-level field and the printed line say so
    named = run_dir / f"us_{e['model'].replace('_', '')}_1x1-cpu_pytorch.not-qualifying.json"
    assert json.loads(named.read_text()) == e and named.with_suffix(".tsv").is_file()
    assert e["qualifies"] is False and len(e["notQualifyingBecause"]) == 3  # target, 4 classes, 20 images
    assert "DAWNBench entry: does NOT qualify: its target is not DAWNBench's top-5 >= 93%" in capsys.readouterr().out
    assert e["hardware"].startswith("1 machine(s) x 1 x CPU (")
    import torch

    assert e["misc"]["environment"]["torch"] == torch.__version__  # recipes.environment.collect()
    assert set(e["misc"]["environment"]) >= {"cuda", "cudnn", "nccl", "dali", "driver", "gpu_model", "gpu_count"}
    assert e["misc"]["iterations"] == summary["steps"] and e["misc"]["epochs"] == summary["epochs"] == 2
    assert e["misc"]["time_to_target_seconds"] == summary["time_to_target_seconds"]
    assert e["misc"]["cost_usd"] == pytest.approx(3.06 * summary["time_to_target_seconds"] / 3600, abs=1e-4)
    tsv = (run_dir / "dawnbench.tsv").read_text().splitlines()
    assert tsv[0] == "epoch\thours\ttop1Accuracy\ttop5Accuracy" and len(tsv) == 3
    # summary.json carries what compare_runs needs: the per-epoch history with wall-clock time, the comm counters.
    assert [r["epoch"] for r in summary["history"]] == [1, 2]
    assert all(r["wall_seconds"] >= r["train_seconds"] > 0 for r in summary["history"])
    assert summary["comm"]["backend"] == summary["comm_backend"] == "ddp"
    assert summary["comm"]["steps"] == 0 and summary["comm"]["comm_seconds_per_step"] is None  # one process


ENTRIES = ROOT / "tests" / "data" / "dawnbench_entries"


def _types(d: dict, prefix: str = "") -> dict[str, type]:
    """{dotted key: type} of a JSON entry, nested mappings flattened; int and float count as one number type."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_types(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = float if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v)
    return out


@pytest.mark.parametrize(
    "published",
    ["alibabacloud_resnet50_gn6e_16_machine_tensorflow.json", "alibabacloud_resnet50_gn6e_1_machine_tensorflow.json"],
)
def test_train_entry_keys_and_types_match_a_real_entry(published):
    """Every top-level field of the record's entries is in ours with the same type; and every misc field we share
    with them (same name) has their type: booleans are booleans, numbers numbers."""
    real = json.loads((ENTRIES / published).read_text())
    who = ["dawnbench.author=Us", "dawnbench.author_email=u@x", "dawnbench.cost_per_hour=329.6"]
    cfg = load_config(ROOT / "configs" / "dawnbench_158s.yaml", who)
    ours = entry(cfg, {**SUMMARY, "val_count": 48238, "val_excluded": 1762}, "16 machine(s) x 8 x V100", commit="abc")
    theirs, mine = _types(real), _types(ours)
    for key in (k for k in theirs if "." not in k):
        assert key in mine and mine[key] is theirs[key], key
    shared = [k for k in theirs if k in mine]
    assert {"misc.mixed_precision", "misc.use_nesterov", "misc.warmup_epochs", "misc.schedule.max_lr"} <= set(shared)
    for key in shared:
        assert mine[key] is theirs[key], key
    for ours_p, real_p in zip(ours["misc"]["imageSize"], real["misc"]["imageSize"], strict=False):
        assert set(real_p) <= set(ours_p) and all(type(ours_p[k]) is type(real_p[k]) for k in real_p)
    assert ours["usedBlacklist"] is True and ours["misc"]["val_images_counted"] == 48238


def test_the_instance_told_to_the_launcher_reaches_the_hardware_field():
    from recipes.environment import Environment

    versions = ("2.14.1", "13.0", "9.10.2", "2.27.7", "1.50.0", "580.82.07")
    env = Environment(*versions, "NVIDIA H100", 8, "aws", "p5.48xlarge")
    e = entry(load_config(ROOT / "configs" / "base.yaml"), SUMMARY, "2 machine(s) x 8 x NVIDIA H100", environment=env)
    assert e["hardware"] == "2 machine(s) x 8 x NVIDIA H100, aws p5.48xlarge"
    assert e["misc"]["environment"]["nccl"] == "2.27.7" and e["misc"]["environment"]["instance_type"] == "p5.48xlarge"


def test_entries_say_whether_they_qualify():
    from recipes.dawnbench import qualification_line

    who = ["dawnbench.author=Us", "dawnbench.author_email=u@x"]
    cfg = load_config(ROOT / "configs" / "dawnbench_158s.yaml", who)
    full = {**SUMMARY, "val_count": 48238, "val_excluded": 1762, "num_classes": 1000}
    e = entry(cfg, full, "x")
    assert e["qualifies"] is True and "notQualifyingBecause" not in e
    assert qualification_line(e) == "DAWNBench entry: qualifies (top-5 >= 93% on every validation image)"
    short = entry(cfg, {**full, "time_to_target_seconds": None, "final_top5": 92.31}, "x")
    assert short["qualifies"] is False and short["notQualifyingBecause"] == [
        "it did not reach its target (top-5 92.31% at the end, target 93%)"
    ]
    subset = entry(cfg, {**full, "val_count": 10000, "val_excluded": 0}, "x")
    assert subset["notQualifyingBecause"] == ["it evaluated 10,000 validation images, not ImageNet's 50,000"]
    assert qualification_line(subset) == (
        "DAWNBench entry: does NOT qualify: it evaluated 10,000 validation images, not ImageNet's 50,000"
    )
    # A 4-class run with a home-made blacklist that makes the count add up is no ImageNet result.
    fake = entry(cfg, {**full, "num_classes": 4, "val_count": 12, "val_excluded": 49988}, "x")
    assert fake["notQualifyingBecause"] == [
        "it classifies 4 classes, not ImageNet's 1,000",
        "its blacklist left out 49,988 validation images, not the devkit's 1,762",
    ]
    no_list = entry(cfg, {**full, "val_count": 50000, "val_excluded": 0}, "x")
    assert no_list["qualifies"] is True  # every image counted, no blacklist: also a DAWNBench result
    top1 = entry(load_config(ROOT / "configs" / "base.yaml", ["run.target_top1=76"]), full, "x")
    assert top1["notQualifyingBecause"] == ["its target is not DAWNBench's top-5 >= 93% (set run.target_top5=93)"]


def test_trust_ratio_hyperparameters_under_the_record_entry_names():
    real = json.loads((ENTRIES / "alibabacloud_resnet50_gn6e_16_machine_tensorflow.json").read_text())["misc"]
    cfg = load_config(ROOT / "configs" / "dawnbench_158s.yaml", ["dawnbench.author=Us", "dawnbench.author_email=u@x"])
    m = entry(cfg, SUMMARY, "x")["misc"]
    assert (m["etta"], m["min_trust_ratio"], m["max_trust_ratio"]) == (
        real["etta"],
        real["min_trust_ratio"],
        real["max_trust_ratio"],
    )
    assert m["lars_momentum"] == "tf" and m["use_lars"] is True
    assert entry(load_config(ROOT / "configs" / "base.yaml"), SUMMARY, "x")["misc"]["use_lars"] is False


def test_record_configs_refuse_to_start_without_the_required_fields(tmp_path, capsys):
    import train as train_cli
    from recipes.dawnbench import check_required

    with pytest.raises(ConfigError, match="dawnbench.author: the DAWNBench entries format requires it"):
        check_required(load_config(ROOT / "configs" / "dawnbench_158s.yaml", []))
    with pytest.raises(ConfigError, match="dawnbench.author_email"):
        check_required(load_config(ROOT / "configs" / "dawnbench_8gpu.yaml", ["dawnbench.author=Us"]))
    check_required(load_config(ROOT / "configs" / "base.yaml", []))  # not required: a run not to submit
    rc = train_cli.main(
        [
            "-c",
            str(ROOT / "configs" / "dawnbench_8gpu.yaml"),
            "data.backend=synthetic",
            f"run.out_dir={tmp_path}",
            "dawnbench.author=Us",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "dawnbench.author_email" in err and not (tmp_path / "dawnbench_8gpu").exists()


def test_file_name_follows_the_entries_repository_pattern(tiny_root, tmp_path):
    import torch

    from recipes.dawnbench import file_stem

    cfg = load_config(ROOT / "configs" / "base.yaml", ["dawnbench.author=Alibaba Cloud", "dawnbench.model=ResNet-50"])
    # [author name]_[model name]_[hardware tag]_[framework], like alibabacloud_resnet50_gn6e_16_machine_tensorflow
    assert file_stem(cfg, 16, 8, torch.device("cpu")) == "alibabacloud_resnet50_2x8-cpu_pytorch"


def test_50000_links_to_few_images_do_not_qualify_as_imagenet(tmp_path):
    """A made-up set with 1,000 class folders and 50,000 validation links to one image once qualified."""
    from data.folder import distinct_files

    val = tmp_path / "val"
    (val / "n01").mkdir(parents=True)
    (val / "n02").mkdir()
    one = val / "n01" / "ILSVRC2012_val_00000001.JPEG"
    one.write_bytes(b"jpeg")
    os.link(one, val / "n01" / "ILSVRC2012_val_00000002.JPEG")
    (val / "n02" / "ILSVRC2012_val_00000003.JPEG").symlink_to(one)
    assert distinct_files(val) == 1
    (val / "n02" / "ILSVRC2012_val_00000004.JPEG").write_bytes(b"jpeg")  # a copy: the same image
    assert distinct_files(val) == 1
    (val / "n02" / "ILSVRC2012_val_00000005.JPEG").write_bytes(b"jpeg" + bytes(9000))  # another image
    (val / "n02" / "ILSVRC2012_val_00000006.JPEG").write_bytes(b"jpeg" + bytes(9000) + b"x")  # other size
    assert distinct_files(val) == 3
    cfg = load_config(ROOT / "configs" / "dawnbench_158s.yaml", ["dawnbench.author=Us", "dawnbench.author_email=u@x"])
    full = {**SUMMARY, "val_count": 48238, "val_excluded": 1762, "num_classes": 1000}
    assert entry(cfg, {**full, "val_files": 50_000}, "x")["qualifies"] is True
    linked = entry(cfg, {**full, "val_files": 1}, "x")
    assert linked["notQualifyingBecause"] == [
        "its 50,000 validation images are 1 distinct images (links to or copies of the same images), not ImageNet's "
        "validation set"
    ]


def test_the_entry_names_how_the_run_was_really_launched():
    """A plain `torchrun --standalone` run is no scripts/launch.py run: the entry says what started the ranks."""
    cfg = load_config(ROOT / "configs" / "base.yaml", [])

    def backend(environ: dict) -> str:
        return entry(cfg, SUMMARY, "x", environ=environ)["misc"]["deployment backend"]

    assert backend({"TORCHELASTIC_RUN_ID": "none", "RANK": "0"}) == "torchrun"
    assert backend({"HOROVOD_RANK": "0"}) == "horovodrun"
    assert backend({}) == "python train.py (one process)"
    launched = {"TORCHELASTIC_RUN_ID": "x", LAUNCHER_ENV: "scripts/launch.py (torchrun c10d)"}
    assert backend(launched) == "scripts/launch.py (torchrun c10d)"
