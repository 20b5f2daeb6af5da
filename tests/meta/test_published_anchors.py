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
