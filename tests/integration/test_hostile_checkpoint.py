"""Malformed checkpoints, generated: every entry removed, mistyped or out of range is one CheckpointError that names
the file and the entry, found by the loader before any reader uses it (exit 2 and one line from train.py)."""

from __future__ import annotations

import copy
import math
import re
import subprocess
import sys

import pytest
import torch
from support import ROOT, quiet_env, tiny_config

from base.errors import CheckpointError
from recipes.config import to_dict
from recipes.rundir import checkpoint_files as ckpt
from recipes.rundir.payload import RESUME_ENTRIES, STATE_FIELDS, Checkpoint
from recipes.rundir.resume import compare
from recipes.trainer import train

WRONG_TYPES = (0, -1, 1.5, "x", True, [], {}, [1], {"a": 1}, math.nan)
OPTIONAL = ("comm", "config", "run_id", "world_size", "num_train", "model_info", "bn_per_rank")


def _set(tree: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for p in parents:
        tree = tree[int(p)] if isinstance(tree, list) else tree[p]
    if value is _DELETE:
        del tree[last]
    elif isinstance(tree, list):
        tree[int(last)] = value
    else:
        tree[last] = value


_DELETE = object()


def _cases(good: dict) -> list[tuple[str, str, object]]:
    """(entry the error must name, dotted key, value) for every hostile change to a good checkpoint."""
    out = [(k, k, v) for k in good if k != "model" for v in WRONG_TYPES if not isinstance(v, type(good[k]))]
    out += [(k, k, _DELETE) for k in RESUME_ENTRIES]
    for name in STATE_FIELDS:
        bad = (-1, -0.5, "1", None, math.inf, math.nan, True) + (() if name in ("history", "forced") else ([],))
        out += [("state", f"state.{name}", v) for v in bad]
    out += [("state", f"state.{k}", _DELETE) for k in ("epoch", "step")] + [("state", "state", {})]
    out += [("state", "state.history", [1]), ("state", "state.unknown_field", 1)]
    out += [("world_size", "world_size", v) for v in (0, -2)]
    out += [("rng", "world_size", 2)]  # one RNG state, but written by two processes
    out += [("num_train", "num_train", 0), ("run_id", "run_id", "")]
    rng = good["rng"][0]
    out += [("rng", "rng", []), ("rng", "rng.0", 5), ("rng", "rng.0.python", [3, [1, 2], None])]
    out += [("rng", "rng.0.python", "abc"), ("rng", f"rng.0.{'python'}", [3, list(range(625)), "g"])]
    out += [("rng", "rng.0.numpy.keys", torch.zeros(3, dtype=torch.int64)), ("rng", "rng.0.numpy.kind", "PCG")]
    out += [("rng", "rng.0.numpy.pos", -7), ("rng", "rng.0.numpy", _DELETE), ("rng", "rng.0.torch", torch.zeros(3))]
    out += [("rng", "rng.0.torch", "state"), ("rng", "rng.0.cuda", [1, 2])]
    out += [("rng", "rng", [rng, rng])]  # two ranks' RNG states in a checkpoint of one process
    for key, value in (
        ("num_classes", 0),
        ("num_classes", -1),
        ("num_classes", "4"),
        ("num_classes", 3),  # the class list has 4
        ("classes", "abcd"),
        ("classes", [1, 2, 3, 4]),
        ("name", 5),
        ("num_params", -1),
    ):
        out.append(("model_info", f"model_info.{key}", value))
    out += [("bn_per_rank", "bn_per_rank", [{"x": 1}]), ("bn_per_rank", "bn_per_rank", ["a"])]
    out += [("bn_per_rank", "bn_per_rank", [{}, {}])]  # two ranks' statistics, one process
    out += [("optimizer", "optimizer", {}), ("optimizer", "optimizer.param_groups", 5)]
    out += [("optimizer", "optimizer.param_groups", [{"lr": 0.1}]), ("optimizer", "optimizer.state", [])]
    out += [("model", "model", {"w": 1}), ("model", "model", [torch.zeros(1)])]
    return out


def _use(state: dict, path: str, cfg, classes, num_train) -> None:
    """What a resume does with a checkpoint before it touches any part: type it, read the state, compare recipes."""
    ck = Checkpoint.from_dict(state, path)
    st = ck.training_state()
    compare(ck, cfg, classes, num_train, 1)
    assert st.step >= 0


@pytest.fixture(scope="module")
def good(tiny_checkpoint):
    return ckpt.load(tiny_checkpoint)


def test_every_hostile_entry_is_one_line_naming_the_file_and_the_entry(good, tiny_root, tmp_path):
    cfg = tiny_config(tiny_root, tmp_path)
    classes, num_train = good["model_info"]["classes"], good["num_train"]
    _use(copy.deepcopy(good), "ok.pt", cfg, classes, num_train)  # the unchanged checkpoint resumes
    cases = _cases(good)
    assert len(cases) > 150
    survived = []
    for entry, key, value in cases:
        state = dict(good)  # the tensors are shared; the entry a case changes inside is copied
        top = key.split(".")[0]
        if "." in key and top == "optimizer":
            state[top] = {**good[top], "param_groups": copy.deepcopy(good[top]["param_groups"])}
        elif "." in key:
            state[top] = copy.deepcopy(good[top])
        _set(state, key, value)
        try:
            _use(state, "x/ckpt-00000008.pt", cfg, classes, num_train)
        except CheckpointError as e:
            msg = str(e)
            assert "\n" not in msg and "'x/ckpt-00000008.pt'" in msg, (key, value, msg)
            assert f"'{entry}'" in msg or f"{entry}." in msg, (key, value, msg)
        except Exception as e:  # a traceback where one line is promised
            survived.append(f"{key}={repr(value)[:60]}: {type(e).__name__}: {e}")
        else:
            survived.append(f"{key}={repr(value)[:60]}: accepted")
    assert not survived, "\n".join(survived)


def test_a_checkpoint_of_the_model_only_cannot_be_resumed(good, tiny_root, tmp_path):
    with pytest.raises(CheckpointError, match=r"^checkpoint 'm.pt' cannot be resumed: no 'optimizer' entry$"):
        _use({"model": good["model"]}, "m.pt", tiny_config(tiny_root, tmp_path), [], 1)


@pytest.mark.parametrize("entry", OPTIONAL)
def test_a_checkpoint_without_an_optional_entry_still_resumes(good, tiny_root, tmp_path, entry):
    state = {k: v for k, v in good.items() if k != entry}
    _use(state, "old.pt", tiny_config(tiny_root, tmp_path), good["model_info"]["classes"], good["num_train"])


def test_files_on_disk_go_through_the_same_checks(good, tmp_path):
    path = tmp_path / "ckpt-00000008.pt"
    torch.save({**good, "world_size": 0}, path)
    with pytest.raises(CheckpointError, match=r"ckpt-00000008.pt': entry 'world_size' must be an integer >= 1"):
        ckpt.load_checkpoint(path)


@pytest.mark.slow
def test_train_resume_from_a_checkpoint_that_does_not_fit_is_exit_2_and_one_line(good, tiny_root, tmp_path):
    """The optimizer state passes the shape check but not the optimizer (one more parameter group)."""
    bad = copy.deepcopy(good)
    bad["optimizer"]["param_groups"].append(dict(bad["optimizer"]["param_groups"][0], params=[10_000]))
    path = tmp_path / "bad.pt"
    torch.save(bad, path)
    cfg = to_dict(tiny_config(tiny_root, tmp_path))
    args = [f"data.root={tiny_root}", f"run.out_dir={tmp_path}", "run.name=r"]
    r = subprocess.run(
        [sys.executable, "train.py", "-c", "tests/tiny.yaml", "--resume", str(path), *args],
        cwd=ROOT,
        env=quiet_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "entry 'optimizer' does not fit" in lines[0] and str(path) in lines[0], r.stderr
    assert "Traceback" not in r.stderr and cfg["run"]["name"] == "tiny"
    assert not (tmp_path / "r" / "config.yaml").exists()  # refused before the run's files were written


@pytest.mark.parametrize("change", [("optim.name=lars",), ("run.amp=fp16",), ("optim.name=hybrid", "run.amp=bf16")])
def test_force_with_another_optimizer_or_precision_starts_that_state_afresh_saying_so(
    tiny_root, tmp_path, capsys, change
):
    three = "phases=[{epochs: 3, image_size: 32, batch_size: 12}]"
    train(tiny_config(tiny_root, tmp_path, three), stop_after_epochs=1)
    capsys.readouterr()
    s = train(tiny_config(tiny_root, tmp_path, three, "checkpoint.resume=force", *change), stop_after_epochs=1)
    out = capsys.readouterr().out
    assert s["steps"] == 8 and all(math.isfinite(r["top1"]) for r in s["history"])
    assert [d.split(":")[0] for d in s["resume_forced"][0]["differences"]] == [c.split("=")[0] for c in change]
    for c in change:
        key, new = c.split("=")
        part = {"optim.name": "optimizer", "run.amp": "scaler"}[key]
        assert f"-> '{new}': the {part} state starts afresh" in out


def _first_buffer(opt_state: dict) -> tuple[int, str]:
    """(parameter index, state key) of the first per-parameter tensor in an optimizer state_dict."""
    for idx, st in opt_state["state"].items():
        for key, value in st.items():
            if key != "step" and isinstance(value, torch.Tensor) and value.numel() > 1:
                return idx, key
    raise AssertionError("the tiny checkpoint's optimizer keeps no per-parameter tensor")


@pytest.mark.parametrize(
    "change, expected",
    [
        ("shape", r"is a float32 tensor of shape \(3,\): expected the parameter's float32 tensor of shape"),
        ("not-a-tensor", "must be a tensor, got int"),
        ("step", "state 'step' must be a finite count >= 0, got -1.0"),
        ("scale", "entry 'scaler' key 'scale' must be a finite number > 0, got -1.0"),
        ("interval", "entry 'scaler' key 'growth_interval' must be an integer >= 1, got 0"),
        ("comm", r"entry 'comm' key 'streams' must be in comm.streams's domain \(> 0, <= 64\), got 1000"),
    ],
)
def test_optimizer_and_scaler_state_are_checked_against_the_run_at_load(good, tiny_root, tmp_path, change, expected):
    """A momentum buffer of another shape once reached torch's fused SGD and segfaulted the trainer (exit 139)."""
    bad = {**good, "optimizer": copy.deepcopy(good["optimizer"]), "scaler": dict(good["scaler"] or {})}
    idx, key = _first_buffer(bad["optimizer"])
    if change == "shape":
        bad["optimizer"]["state"][idx][key] = torch.zeros(3)
    elif change == "not-a-tensor":
        bad["optimizer"]["state"][idx][key] = 5
    elif change == "step":
        bad["optimizer"]["state"][idx]["step"] = torch.tensor(-1.0)
    elif change == "scale":
        bad["scaler"] = {"scale": -1.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}
    elif change == "interval":
        bad["scaler"] = {"scale": 1.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 0}
    else:  # checked at the door whatever the run's backend: 1,000 streams hung creating process groups
        bad["comm"] = {"bucket_mb": 8.0, "streams": 1000, "slices": 1}
    path = tmp_path / "bad.pt"
    torch.save(bad, path)
    with pytest.raises(CheckpointError) as e:
        train(tiny_config(tiny_root, tmp_path), resume_from=str(path))
    msg = str(e.value)
    assert "\n" not in msg and f"checkpoint '{path}" in msg and "': entry '" in msg, msg
    assert re.search(expected, msg), msg
