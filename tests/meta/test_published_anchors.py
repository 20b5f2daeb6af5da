"""The published throughputs the code pins (the time model's rate tables, the GPU check's floors) equal the rows
kept with their source in tests/data/published/, so a changed constant must change the copy of its source too."""

from __future__ import annotations

import json

from support import ROOT

from recipes import timemodel as tm
from scripts.gpu_check import gpu_check_env

DLE = json.loads((ROOT / "tests/data/published/nvidia_dle_rn50v15_pytorch_training.json").read_text())
ROWS = {(r["system"].split(" (")[1].rstrip(")"), r["gpus"]): r["images_per_s"] for r in DLE["rows"]}
TABLES = {"v100": "8x V100 16GB", "v100-32gb": "8x V100 32GB", "a100": "8x A100 80GB"}


def test_the_time_models_published_rates_are_the_sources_rows():
    assert DLE["source"].startswith("NVIDIA/DeepLearningExamples") and "commit" in DLE["source"]
    for gpu, system in TABLES.items():
        rates = tm.PUBLISHED[gpu]
        one, eight = ROWS[system, 1], ROWS[system, 8]
        at224 = next(r for r in rates.rates if r.image_size == 224)
        assert at224.images_per_s == one, gpu
        assert rates.host_efficiency == eight / (8 * one), gpu  # the 8-GPU scaling of the same table
        assert f"{one:,}" in rates.source and f"{eight:,}" in rates.host_source, gpu


def test_the_gpu_checks_floors_are_the_sources_rows():
    assert gpu_check_env.NVIDIA_RN50_AMP_8XA100 == ROWS["8x A100 80GB", 8]
    assert gpu_check_env.NVIDIA_RN50_AMP_V100 == ROWS["8x V100 16GB", 1]


AWS = json.loads((ROOT / "tests/data/published/aws_ec2_on_demand_gpu_prices.json").read_text())
PRICES = {r["instance"]: r for r in AWS["rows"]}


def test_the_presets_prices_are_the_price_lists_rows():
    from scripts import gen_presets

    assert "us-east-1" in AWS["source"] and "commit" in AWS["source"]
    families = {
        "v100": ("p3dn.24xlarge", "V100 32 GB"),
        "a100": ("p4de.24xlarge", "A100 80 GB"),
        "h100": ("p5.48xlarge", "H100 80 GB"),
    }
    assert set(gen_presets.INSTANCE_PRICES) == set(families)
    for family, (instance, gpu) in families.items():
        row = PRICES[instance]
        assert (row["region"], row["gpu"]) == ("us-east-1", gpu)
        assert gen_presets.INSTANCE_PRICES[family] == (instance, row["usd_per_hour"], row["gpus"]), family
        assert gen_presets.PRICE_PER_GPU_HOUR[family] == row["usd_per_hour"] / row["gpus"], family
    # What the README quotes per GPU-hour is the same division.
    v100, a100, h100 = (f"${PRICES[i]['usd_per_hour'] / 8:.2f}" for i, _ in families.values())
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"(V100 32 GB {v100}, A100 80 GB {a100}, H100 {h100}: AWS's on-demand list prices in us-east-1" in readme


def test_the_fastai_entries_cost_is_the_p3_16xlarge_list_price():
    """The DAWNBench entries state only a total per hour; per machine it is the p3.16xlarge row (unchanged since)."""
    entries = AWS["dawnbench_entries"]["rows"]
    assert [e["machines"] for e in entries] == [16, 8, 4]
    for e in entries:
        assert e["cost_per_hour"] / e["machines"] == PRICES[e["instance"]]["usd_per_hour"] == 24.48, e["entry"]
