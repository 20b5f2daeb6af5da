"""A preset's `Run:` line, started as its header writes it, on the sample data.

The 15 presets (configs/presets/, written by scripts/gen_presets.py) share three Run lines, the same but for their
own name: `python train.py` on one GPU, `torchrun --nproc-per-node 8 train.py` on one host and `python
scripts/launch.py --hostfile hosts.txt` on several; their configs differ in GPU, precision and batch, which
tests/e2e/test_shipped_configs.py loads, plans and trains for every preset. Here one preset of each shape runs its
own line: first as its `--plan`, which must name every start-up check the sample data fails at once, then for real
until its first optimizer step. What is appended is what the sample needs: its root (after the line's own
data.root), no blacklist file, the 160 px copy being the sample itself, and a first phase small enough for a CPU
(32 px, 16 images, fp32). The launcher's line runs on two local "hosts" of one process each (`--transport local
--gpus-per-host 1`).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, free_port, two_local_hosts, wait_for_step

PRESETS = ROOT / "configs" / "presets"
SHAPES = ("h100_1gpu", "v100_1x8", "a100_2x8")  # one per Run line: train.py, torchrun, scripts/launch.py


def run_line(preset: str) -> list[str]:
    """The header's `Run: COMMAND`, as words."""
    text = (PRESETS / f"{preset}.yaml").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("#") and "Run: " in ln)
    return shlex.split(line.split("Run: ", 1)[1])


def as_typed(words: list[str], hostfile) -> list[str]:
    """The words a shell would run here: `python` is this interpreter, `torchrun` the venv's, hosts.txt a file of
    two local hosts."""
    program = {"python": [sys.executable], "torchrun": [str(Path(sys.executable).parent / "torchrun")]}[words[0]]
    return [*program, *(str(hostfile) if w == "hosts.txt" else w for w in words[1:])]


def sample_fit(root) -> list[str]:
    return [
        "data.val_blacklist=''",
        f"data.roots={{160: {root}}}",
        "phases.0.image_size=32",
        "phases.0.batch_size=16",
        "run.amp=none",
        "log.every_steps=1",
    ]


def test_every_preset_has_one_of_the_three_run_lines():
    """Each preset's line is the started line of its shape with only its own name in place of that preset's: what
    the started line reaches, theirs reaches, and their configs train in tests/e2e/test_shipped_configs.py."""
    shapes = {" ".join(run_line(p.stem)[:2]) for p in PRESETS.glob("*.yaml")}
    assert shapes == {"python train.py", "torchrun --nproc-per-node", "python scripts/launch.py"}
    started = {" ".join(run_line(p)[:2]): p for p in SHAPES}
    assert set(started) == shapes
    for path in PRESETS.glob("*.yaml"):
        shape = started[" ".join(run_line(path.stem)[:2])]
        assert run_line(path.stem) == [w.replace(shape, path.stem) for w in run_line(shape)], path.name


@pytest.mark.slow
@pytest.mark.parametrize("preset", SHAPES)
def test_a_presets_run_line_plans_every_problem_at_once_then_trains(preset, tiny_root, tmp_path):
    words = run_line(preset)
    assert words[-1] == "data.root=/data/imagenet"
    hostfile = two_local_hosts(tmp_path)
    local = ["--transport", "local", "--gpus-per-host", "1", "--port", str(free_port())]
    launcher = "scripts/launch.py" in words
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

    # --plan: the train.py part of a torchrun line (one process plans what every rank would run)
    plan = words[words.index("train.py") - 1 :] if words[0] == "torchrun" else words
    plan = [*as_typed(["python", *plan[1:]] if words[0] == "torchrun" else plan, hostfile)]
    plan += [*(local if launcher else []), f"data.root={tiny_root}", "--plan"]
    p = subprocess.run(plan, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert "data.val_blacklist: " in out and "ILSVRC2012_validation_blacklist.txt' not found" in out, out[-3000:]
    assert "phases.0.root: '160' is not in data.roots" in out, out[-3000:]

    # the line itself, with the sample's overrides: its first optimizer step
    run_dir = tmp_path / "run"
    argv = as_typed(words, hostfile) + (local if launcher else [])
    argv += ["--run-dir", str(run_dir), f"data.root={tiny_root}", *sample_fit(tiny_root)]
    if words[0] == "torchrun":  # its rendezvous on a free port (the line's default 29500 may be taken here)
        argv.insert(1, f"--master-port={free_port()}")
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        wait_for_step(run_dir, proc, 1, timeout=400)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
