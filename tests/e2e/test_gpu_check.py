"""scripts/gpu_check.py on a machine without a GPU: the one line and exit 0, --help, and its pure helpers."""

import importlib.util
import json
import subprocess
import sys

import pytest
import torch
from support import ROOT

SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the check would run")
def test_no_gpu_prints_one_line_and_exits_0(tmp_path):
    out = tmp_path / "gpu.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines() == ["gpu-check: no CUDA GPU present: nothing GPU-only ran"]
    assert not out.exists()  # nothing ran, nothing written


def test_help():
    p = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0
    assert "--out" in p.stdout and "--steps" in p.stdout


def test_reference_numbers():
    mod = _module()
    assert mod.NVIDIA_RN50_AMP_8XA100 == 16621.0
    assert round(mod.NVIDIA_RN50_AMP_PER_GPU) == 2078
    assert "2,078/GPU" in mod.NVIDIA_REF
    assert mod.SIZES == (96, 128, 224, 288)


def test_markdown_table_and_failures():
    mod = _module()
    rows = [
        mod.row("a", "pass", 2077.6, "img/s", "x|y"),
        mod.row("b", "fail: exit 1", None),
        mod.row("c", "skip: horovod not importable (ImportError)", 1.2345, "ms"),
    ]
    lines = mod.markdown_table(rows).splitlines()
    assert lines[0] == "| check | result | number | unit | reference |"
    assert lines[2] == "| a | pass | 2,078 | img/s | x\\|y |"
    assert lines[3] == "| b | fail: exit 1 |  |  |  |"
    assert lines[4] == "| c | skip: horovod not importable (ImportError) | 1.23 | ms |  |"
    assert mod.failed(rows) == ["b"]
    json.dumps(rows)  # the rows are what --out writes


def test_guard_turns_an_exception_into_a_failed_row():
    mod = _module()
    rows = []
    with mod.guard(rows, "check x"):
        raise RuntimeError("no nvJPEG\nmore")
    assert rows == [mod.row("check x", "fail: RuntimeError: no nvJPEG")]
    with mod.guard(rows, "check y"):
        rows.append(mod.row("check y", "pass", 1.0))
    assert mod.failed(rows) == ["check x"]
