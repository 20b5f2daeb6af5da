"""gpu_check's `speed` part (scripts/gpu_check/gpu_check_speed.py) in its CPU mode: the same code builds the record's
step (multistream engaged on a one-rank gloo group, hybrid LARS tf, channels_last), runs StepRunner and GraphStep
in paired rounds and writes the JSON after every part."""

from __future__ import annotations

import json
import subprocess
import sys

from support import ROOT

from scripts.gpu_check import gpu_check
from scripts.gpu_check.gpu_check_speed import table


def test_smoke_runs_the_record_step_eager_and_graphed_and_writes_every_part(tmp_path):
    out = tmp_path / "speed.json"
    cmd = [sys.executable, "-m", "scripts.gpu_check.gpu_check_speed", "--smoke", "--out", str(out)]
    cmd += ["--parts", "graph", "multistream"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["smoke"] is True and "multistream engaged" in report["step"]
    assert list(report["parts"]) == ["graph", "multistream"]
    graph = report["parts"]["graph"]["8"]
    assert list(graph["variants"]) == ["eager", "graphed"] and graph["rounds"] == 2
    for v in graph["variants"].values():
        assert v["wall_ms"] > 0 and v["images_per_s"] > 0 and v["kernel_ms"] is None  # no profiler kernels on CPU
    assert graph["variants"]["graphed"]["speedup_vs_eager"] > 0
    assert set(report["parts"]["multistream"]["variants"]) == {"no_backend", "multistream"}
    assert "| graph | 8 | 2 | graphed |" in p.stdout and "| multistream | 8 | 2 | multistream |" in p.stdout


def test_a_failing_variant_is_written_not_fatal():
    report = {
        "parts": {
            "graph": {
                "96": {
                    "image_size": 96,
                    "batch": 256,
                    "variants": {
                        "eager": {
                            "wall_ms": 25.0,
                            "kernel_ms": 12.5,
                            "kernels": 1200,
                            "wall_per_kernel": 2.0,
                            "images_per_s": 10240.0,
                        },
                        "graphed": {"error": "RuntimeError: capture failed"},
                    },
                }
            }
        }
    }
    text = table(report)
    assert "| graph | 96 | 256 | eager | 25.0 | 12.5 | 1200 | 2.00 | 10240 | - |" in text
    assert "| graph | 96 | 256 | graphed | RuntimeError: capture failed |" in text


def test_speed_is_a_part_of_its_own_outside_the_whole_check():
    assert "speed" in gpu_check.PARTS and "speed" not in gpu_check.WHOLE
    assert gpu_check.with_needs(["speed"]) == ["speed"]
