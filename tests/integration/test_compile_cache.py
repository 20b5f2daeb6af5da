"""run.compile_cache: a second process on the same machine loads its compiled step from the persistent cache
(inductor's FX-graph and AOTAutograd caches: hits counted, no misses, fewer compile seconds), 'off' compiles cold,
and each input shape's compile seconds and cold/warm state are reported (the run summary's `compile` entry, held in
tests/integration/test_compile.py's compiled training)."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from support import ROOT, tiny_config

from base.errors import ConfigError
from models.factory import compile_unavailable, use_compile_cache

# Two input shapes through a small network, forward and backward, under compile_for_training; prints the report.
STEPS = """
import json, sys
import torch
from models.factory import compile_for_training, compile_report
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
model = compile_for_training(net, "default", shapes=2, cache=sys.argv[1])
for batch in (8, 8, 4):
    model(torch.randn(batch, 16)).square().mean().backward()
print(json.dumps(compile_report(model)))
"""

needs_compile = pytest.mark.skipif(
    compile_unavailable(torch.device("cpu")) is not None, reason="inductor on CPU needs a C++ compiler"
)


def _run(cache: str) -> dict:
    p = subprocess.run([sys.executable, "-c", STEPS, cache], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])["compile"]


@needs_compile
@pytest.mark.slow  # three compiles in subprocesses, 'off' beside the cold one (it reads and writes no cache folder)
def test_a_second_process_loads_the_compiled_step_from_the_cache(tmp_path):
    cache = str(tmp_path / "compile_cache")
    with ThreadPoolExecutor(2) as pool:
        off_run = pool.submit(_run, "off")
        cold = _run(cache)
        off = off_run.result()
    warm = _run(cache)
    assert sorted(cold) == sorted(warm) == ["4x16", "8x16"]
    for shape in cold:
        assert cold[shape]["cache"] == "cold" and cold[shape]["cache_misses"] >= 2  # forward and backward graphs
        assert warm[shape]["cache"] == "warm" and warm[shape]["cache_misses"] == 0 and warm[shape]["cache_hits"] >= 2
        assert 0 < warm[shape]["compile_s"] < cold[shape]["compile_s"]
    assert any((tmp_path / "compile_cache").rglob("*"))  # the cache is where run.compile_cache says
    assert {s["cache"] for s in off.values()} == {"cold"} and all(s["cache_hits"] == 0 for s in off.values())


def test_compile_cache_folder_that_cannot_be_made_is_named(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"run.compile_cache=.*file/sub: cannot create '.*file/sub'"):
        use_compile_cache(str(tmp_path / "file" / "sub"))
    with pytest.raises(ConfigError, match="a folder without spaces is needed"):
        use_compile_cache(str(tmp_path / "a b"))


def test_compile_cache_key_default_and_refusal(tmp_path):
    from recipes.config import load_config

    assert tiny_config(tmp_path, tmp_path).run.compile_cache == "auto"
    with pytest.raises(ConfigError, match="run.compile_cache"):
        load_config(None, ["run.compile_cache= "])
