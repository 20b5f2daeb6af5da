"""Hostile configs: YAML alias bombs, merge keys, keys that are not names, overrides into values of the wrong
shape, and numeric values the schema accepts: each class checked over generated cases (hypothesis)."""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import time
import types
import typing

import numpy as np
import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import train
from base.errors import CheckpointError, ConfigError
from data.sharding import train_shard
from recipes.config import Config, load_config
from recipes.config.load import MAX_VAL_RESIZE
from recipes.config.schema import domain_rule, field_of, section_fields
from recipes.config.yaml_strict import MAX_YAML_VALUES
from recipes.rundir import checkpoint_files
from recipes.schedule import Schedule

# capsys is read (and so emptied) once per example.
SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: ConfigError: "), lines[0]
    return lines[0]


# -- alias bombs --------------------------------------------------------------------------------------------


def _bomb(depth: int, fan: int) -> str:
    """A YAML flow list of `depth` lists; list i repeats list i-1 `fan` times (through an alias)."""
    levels = ["&a0 [" + ", ".join(["1"] * fan) + "]"]
    for i in range(1, depth):
        levels.append(f"&a{i} [" + ", ".join([f"*a{i - 1}"] * fan) + "]")
    return "[" + ", ".join(levels) + "]"


def _expanded(depth: int, fan: int) -> int:
    """Values `_bomb(depth, fan)` expands to: the outer list, and each level i of 1 + fan * size(i - 1)."""
    sizes = [1 + fan]
    for _ in range(1, depth):
        sizes.append(1 + fan * sizes[-1])
    return 1 + sum(sizes)


@SETTINGS
@given(depth=st.integers(1, 12), fan=st.integers(1, 12), where=st.sampled_from(["file", "override"]))
def test_alias_bombs_are_refused_by_their_expanded_size(depth, fan, where, tmp_path_factory, capsys):
    """Property: a document is refused iff it expands to more than MAX_YAML_VALUES values, within a second and
    with one short line (no repr of the value); smaller ones reach the schema, which names the key."""
    text = _bomb(depth, fan)
    size = _expanded(depth, fan)
    if where == "file":
        path = tmp_path_factory.mktemp("bomb") / "c.yaml"
        path.write_text(f"comm:\n  tune_streams: {text}\n")
        argv = ["--print-config", "-c", str(path)]
    else:
        argv = ["--print-config", f"comm.tune_streams={text}"]
    start = time.monotonic()
    rc = train.main(argv)
    assert time.monotonic() - start < 5
    assert rc == 2
    line = _one_line(capsys.readouterr().err)
    assert len(line) < 400, line
    if size > MAX_YAML_VALUES:
        assert f"expands to more than {MAX_YAML_VALUES:,} values" in line
    else:
        assert "comm.tune_streams.0: expected an integer" in line


def test_an_alias_that_contains_itself_is_refused(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("comm:\n  tune_streams: &a [*a]\n")
    assert train.main(["--print-config", "-c", str(path)]) == 2
    assert "an alias refers to itself" in _one_line(capsys.readouterr().err)


def test_deep_nesting_is_one_line(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("comm:\n  tune_streams: " + "[" * 5000 + "]" * 5000 + "\n")
    assert train.main(["--print-config", "-c", str(path)]) == 2
    _one_line(capsys.readouterr().err)


# -- numbers: YAML 1.2, bounded --------------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["file", "override"])
@pytest.mark.parametrize(
    "value, words",
    [
        ("1:30", "optim.lr: expected a number, got '1:30'"),  # YAML 1.1 read 90.0
        ("-1:30:00", "optim.lr: expected a number, got '-1:30:00'"),
        ("1:30.5", "optim.lr: expected a number, got '1:30.5'"),
        ("9" * 5000, "a number of 5,000 characters: expected at most 40"),  # a traceback in int()
        ("0." + "1" * 60, "a number of 62 characters: expected at most 40"),
        ("!!int 1:30", "'1:30' is not a number (base 60 is YAML 1.1's, not read here)"),
    ],
)
def test_numbers_are_yaml_1_2_and_bounded(tmp_path, capsys, route, value, words):
    if route == "file":
        path = tmp_path / "c.yaml"
        path.write_text(f"optim:\n  lr: {value}\n")
        args = ["-c", str(path)]
    else:
        args = [f"optim.lr={value}"]
    assert train.main(["--print-config", *args]) == 2
    line = _one_line(capsys.readouterr().err)
    assert words in line, line
    assert (str(tmp_path / "c.yaml") in line) if route == "file" else line.startswith("error: ConfigError: optim.lr")


def test_a_megabytes_long_base_60_number_is_refused_unread(tmp_path, capsys):
    """2.4 MB of `1:1:...:1` hung the loader (YAML 1.1 multiplies base-60 digits out); a config is a few KB."""
    path = tmp_path / "c.yaml"
    path.write_text("seed: " + ":".join(["1"] * 1_200_000) + "\n")
    assert train.main(["--print-config", "-c", str(path)]) == 2
    assert "bytes: expected at most 1,048,576" in _one_line(capsys.readouterr().err)


def test_ordinary_numbers_still_read_as_numbers():
    cfg = load_config(None, ["optim.lr=0.5", "optim.weight_decay=5e-5", "optim.momentum=.9", "data.workers=0x4"])
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.momentum, cfg.data.workers) == (0.5, 5e-5, 0.9, 4)


# -- merge keys ---------------------------------------------------------------------------------------------

OPTIM = {"lr": st.floats(0, 10), "momentum": st.floats(0, 0.99), "weight_decay": st.floats(0, 1)}


@SETTINGS
@given(
    base=st.fixed_dictionaries({}, optional=OPTIM),
    own=st.fixed_dictionaries({}, optional=OPTIM),
)
def test_merge_key_merges_as_yaml_specifies(base, own, tmp_path_factory):
    """Property: `<<: *anchor` gives the anchor's keys, the mapping's own keys win (YAML's merge key)."""
    path = tmp_path_factory.mktemp("merge") / "c.yaml"
    doc = {"phases": [{"epochs": 1, "image_size": 32, "batch_size": 8, "min_scale": 0.5}]}
    text = yaml.safe_dump(doc) + "optim:\n  <<: &base " + yaml.safe_dump(base, default_flow_style=True)
    text += "".join(f"  {k}: {v!r}\n" for k, v in own.items())
    path.write_text(text)
    cfg = load_config(path)
    for key, value in {**base, **own}.items():
        assert getattr(cfg.optim, key) == pytest.approx(value)
    defaults = Config().optim
    for key in set(OPTIM) - set(base) - set(own):
        assert getattr(cfg.optim, key) == getattr(defaults, key)


def test_merge_key_across_phases(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "phases:\n  - &p {epochs: 2, image_size: 32, batch_size: 8}\n  - {<<: *p, image_size: 64}\n"
        "  - <<: *p\n    epochs: 1\n"
    )
    cfg = load_config(path)
    assert [(p.epochs, p.image_size, p.batch_size) for p in cfg.phases] == [(2, 32, 8), (2, 64, 8), (1, 32, 8)]


def test_duplicate_own_key_is_still_an_error(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  <<: {lr: 1.0}\n  momentum: 0.5\n  momentum: 0.6\n")
    with pytest.raises(ConfigError, match="duplicate key 'momentum'"):
        load_config(path)


# -- shapes: keys that are lists, overrides into values of the wrong shape -----------------------------------

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(["x", "", "1e30", ".nan"]))
TREES = st.recursive(
    SCALARS,
    lambda kids: st.one_of(
        st.lists(kids, max_size=3), st.dictionaries(st.sampled_from(["epochs", "lr", "seed", "x"]), kids, max_size=3)
    ),
    max_leaves=8,
)
SECTIONS = ["run", "data", "optim", "comm", "phases", "phases.0", "data.roots", "checkpoint"]
OVERRIDE_KEYS = [
    "run.seed",
    "phases.0.epochs",
    "phases.1.image_size",
    "phases.0",
    "data.roots.160",
    "data.roots.160.x",
    "optim.lr.x",
    "comm.tune_streams.0",
    "comm.tune_streams.0.x",
    "run",
]
VALUES = ["5", "[5]", "{a: 1}", "'x'", "", "null", "[1, [2]]", "{[1]: 2}", "? [1, 2]\n: 3"]


def _complex_key_yaml(section: str) -> str:
    return f"{section}:\n  ? [1, 2]\n  : 3\n"


@SETTINGS
@given(
    section=st.sampled_from(SECTIONS),
    tree=TREES,
    listkey=st.booleans(),
    overrides=st.lists(st.tuples(st.sampled_from(OVERRIDE_KEYS), st.sampled_from(VALUES)), max_size=3),
)
def test_any_shape_gives_a_config_or_one_config_error(section, tree, listkey, overrides, tmp_path_factory):
    """Property: whatever value sits at a key, and whatever is overridden into it, loading returns a Config or
    raises one ConfigError line (never a TypeError, KeyError or IndexError from inside the loader)."""
    path = tmp_path_factory.mktemp("shape") / "c.yaml"
    if listkey:
        text = _complex_key_yaml(section.split(".")[0])
    else:
        node: dict = {}
        parts = section.split(".")
        if len(parts) == 2 and parts[1] == "0":
            node = {parts[0]: [tree]}
        elif len(parts) == 2:
            node = {parts[0]: {parts[1]: tree}}
        else:
            node = {parts[0]: tree}
        text = yaml.safe_dump(node)
    path.write_text(text)
    try:
        load_config(path, [f"{k}={v}" for k, v in overrides])
    except ConfigError as e:
        assert "\n" not in str(e), str(e)
        if listkey:
            assert "a key must be a name, got a list" in str(e)


def test_overriding_into_a_scalar_list_item_names_it(capsys):
    path_free = ["--print-config", "phases=[5]", "phases.0.epochs=3"]
    assert train.main(path_free) == 2
    assert "phases.0: expected a mapping, got 5" in _one_line(capsys.readouterr().err)


# -- numeric domains: every accepted value can be used -------------------------------------------------------


def _numeric_keys():
    out = []

    def plain(tp):
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            return [a for a in typing.get_args(tp) if a is not type(None)][0]
        return tp

    def walk(cls, prefix):
        for name, (f, tp) in section_fields(cls).items():  # a seam's section: every part's own keys too
            tp = plain(tp)
            if dataclasses.is_dataclass(tp):
                walk(tp, f"{prefix}{name}.")
            elif typing.get_origin(tp) is list and dataclasses.is_dataclass(typing.get_args(tp)[0]):
                walk(typing.get_args(tp)[0], f"{prefix}{name}.0.")
            elif tp in (int, float) or (typing.get_origin(tp) is list and typing.get_args(tp)[0] in (int, float)):
                out.append((f"{prefix}{name}", tp, f.metadata["domain"]))

    walk(Config, "")
    return out


NUMERIC = _numeric_keys()


# Keys without an upper bound, whose consumer takes any finite value of the type: the schema says so, and why, in
# each field's `unbounded` metadata (a rate or factor, a figure only computed with, a step count compared against).
# Fractions and percentages have interval domains, bounded on both sides.
ANY_FINITE = {k for k, *_ in NUMERIC if field_of(k).metadata["unbounded"]}


def _upper(domain: str):
    for d in domain.split():
        if d.startswith("<="):
            return domain_rule(d)
    return None


def _limit(domain: str):
    text = [d for d in domain.split() if d.startswith("<=")][0][2:]
    return float(text) if any(c in text for c in ".e") else int(text)


PHASE = "{epochs: 1, image_size: 32, batch_size: 8}"


@pytest.mark.parametrize("key, tp, domain", NUMERIC, ids=[k for k, _, _ in NUMERIC])
def test_every_unbounded_number_is_one_the_code_takes_whole(key, tp, domain):
    """A number without an upper bound must be one whose consumer takes any finite value (listed above); every
    bounded one accepts its bound and refuses just above it."""
    if any(d[0] in "([" for d in domain.split()) and _upper(domain) is None:
        return  # an interval: checked at both ends in test_config_domains.py
    if _upper(domain) is None:
        assert key in ANY_FINITE, f"{key}: no upper bound, and its consumer is not known to take any value"
        return
    assert key not in ANY_FINITE
    limit = _limit(domain)
    base = [f"phases=[{PHASE}]"] if key.startswith("phases.") else []
    is_list = typing.get_origin(tp) is list
    at = f"[{limit}]" if is_list else str(limit)
    above = limit + 1 if isinstance(limit, int) else limit * 1.5
    load_config(None, [*base, f"{key}={at}"])
    with pytest.raises(ConfigError, match=f"<= {limit:,}" if isinstance(limit, int) else "<="):
        load_config(None, [*base, f"{key}={f'[{above}]' if is_list else above}"])


def _max(key: str):
    domain = dict((k, d) for k, _, d in NUMERIC)[key]
    return _limit(domain)


def test_the_bounds_are_values_the_code_can_use():
    """Each bound is used the way the run uses it: seeds by torch, NumPy and the data order; thread counts;
    timeouts as a timedelta; bucket sizes as byte counts; validation resize sizes."""
    seed = _max("run.seed")
    ranks = _max("run.nodes") * _max("run.procs_per_node")
    torch.manual_seed(seed)
    torch.manual_seed(seed + 1000 * (ranks - 1))  # trainer: per-rank seed
    torch.Generator().manual_seed(seed * 7919 + 10**6)  # torch loader: seed * 7919 + epoch
    np.random.default_rng([seed, 10**6, 2**40])
    assert sorted(train_shard(10, 0, 1, 3, seed)) == list(range(10))
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(_max("run.threads"))
    finally:
        torch.set_num_threads(old)
    assert datetime.timedelta(seconds=_max("dist.timeout_s")).total_seconds() == _max("dist.timeout_s")
    assert int(_max("comm.bucket_cap_mb") * 1024 * 1024) < 2**63
    cfg = load_config(None, [f"phases=[{PHASE}]", f"data.val_crop_ratio={0.05}"])
    assert round(cfg.phases[0].image_size / cfg.data.val_crop_ratio) <= MAX_VAL_RESIZE
    with pytest.raises(ConfigError, match="validation resize"):
        load_config(None, ["phases=[{epochs: 1, image_size: 4096, batch_size: 8}]", "data.val_crop_ratio=0.05"])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    epochs=st.integers(1, _max("phases.0.epochs")),
    batch=st.integers(1, _max("phases.0.batch_size")),
    images=st.integers(1, 10**9),
)
def test_any_accepted_plan_is_laid_out_in_bounded_time(epochs, batch, images):
    """Property: any accepted epochs / batch size with any --num-images up to its bound lays out in well under a
    second per phase (no per-step work), with the iteration count the sharding rule gives."""
    cfg = load_config(None, [f"phases=[{{epochs: {epochs}, image_size: 64, batch_size: {batch}}}]"])
    start = time.monotonic()
    plan = Schedule(cfg.phases, cfg.optim, num_images=images, world_size=1)
    plan.table()
    assert plan.total_steps == epochs * math.ceil(images / batch)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num-images", "100000000000000000000"], "--num-images: expected an integer in [1, 1,000,000,000]"),
        (["--world-size", "0"], "--world-size: expected an integer in [1, 1,048,576]"),
    ],
)
def test_plan_arguments_are_bounded(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        train.main(["--plan", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: argument {message}, got {argv[1]!r} (see train.py --help)"]


def test_longest_plan_prints_and_plots_quickly(tmp_path, capsys):
    """The longest accepted plan (10^13 iterations) prints and plots in seconds (it hung before)."""
    start = time.monotonic()
    rc = train.main(
        [
            "--plan",
            "--num-images",
            "1000000000",
            "--world-size",
            "1",
            f"run.out_dir={tmp_path}",
            "phases=[{epochs: 10000, image_size: 4096, batch_size: 1}]",
        ]
    )
    assert rc == 0 and time.monotonic() - start < 60
    assert "total: 10000000000000 iterations in 10000 epochs" in capsys.readouterr().out
    assert (tmp_path / "run_plan.png").stat().st_size > 0


def test_a_fifo_given_as_config_or_checkpoint_is_not_a_regular_file(tmp_path, capsys):
    """A FIFO was "not found" (and a checkpoint FIFO would hang torch.load)."""
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    assert train.main(["--print-config", "-c", str(fifo)]) == 2
    assert "is not a regular file (a FIFO, device or socket): expected a regular file" in _one_line(
        capsys.readouterr().err
    )
    with pytest.raises(CheckpointError, match="is not a regular file"):
        checkpoint_files.load(fifo)
