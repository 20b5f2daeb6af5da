"""predict.py and `train.py --plan` take the GPU and dtype from the config (a preset's run.gpu and run.amp), print
them with whether the rates are measured, published or derived, and refuse names they do not know at the argument."""

from __future__ import annotations

import typing

import pytest
import yaml
from support import ROOT

import train
from recipes import memory
from recipes.config.schema import RunConfig
from scripts import predict

PRESET = str(ROOT / "configs" / "presets" / "a100_4x8.yaml")


def test_a_preset_is_predicted_on_its_own_gpu_and_dtype(capsys):
    assert predict.main(["-c", PRESET, "--record-s", "0"]) == 0
    assert "GPU: a100 (run.gpu of the config), dtype: fp16 (run.amp of the config)" in capsys.readouterr().out
    assert predict.main(["-c", PRESET, "--record-s", "0", "run.amp=bf16"]) == 0
    out = capsys.readouterr().out
    assert "GPU: a100 (run.gpu of the config), dtype: bf16 (run.amp of the config)" in out
    assert "rates: derived (the published AMP fp16 figures, taken for bf16)" in out
    assert "cluster: 4 hosts x 8 a100," in out


def test_bf16_on_a_gpu_with_fp16_figures_only_is_refused_not_given_fp16_figures(capsys):
    v100 = str(ROOT / "configs" / "presets" / "v100_1x8.yaml")
    assert predict.main(["-c", v100, "--dtype", "bf16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--dtype: v100-32gb trains in fp16, got 'bf16'" in err


def test_unknown_gpu_names_are_refused_at_the_argument(capsys):
    with pytest.raises(SystemExit) as e:
        predict.main(["--gpu", "a100-40gb"])  # a memory size, not a rate table
    assert e.value.code == 2 and "argument --gpu: invalid choice: 'a100-40gb'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        train.main(["-c", PRESET, "--plan", "--gpu", "a100-41gb"])
    assert e.value.code == 2 and "argument --gpu: invalid choice: 'a100-41gb'" in capsys.readouterr().err


def test_plan_reads_the_gpu_from_the_config_and_prints_it(tmp_path, capsys):
    args = ["-c", PRESET, "--plan", "--num-images", "1281167", f"run.out_dir={tmp_path}"]
    assert train.main(args) == 0
    out = capsys.readouterr().out
    assert "GPU: a100 (run.gpu of the config), dtype: fp16 (run.amp)" in out
    assert "per GPU on a100 (80 GiB" in out
    assert train.main([*args, "--gpu", "h100"]) == 0
    assert "GPU: h100 (--gpu), dtype: fp16" in capsys.readouterr().out


def test_run_gpu_names_are_memorys_table_and_every_preset_names_its_gpu_and_run():
    allowed = typing.get_args(typing.get_type_hints(RunConfig)["gpu"])
    assert set(allowed) == {"", *memory.GPU_MEMORY_GIB}
    names = set()
    for path in sorted((ROOT / "configs" / "presets").glob("*.yaml")):
        run = yaml.safe_load(path.read_text())["run"]
        assert run["name"] == path.stem and run["gpu"] in memory.GPU_MEMORY_GIB, path.name
        names.add(run["name"])
    assert len(names) == 15  # 3 GPU families x 5 cluster shapes, each its own run directory
