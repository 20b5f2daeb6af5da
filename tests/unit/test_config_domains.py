"""Every config key's domain: out-of-domain, NaN, infinite, zero, negative, empty and wrong-typed values give exit 2
and one `error:` line naming the key and what is allowed, for every key of the schema (a loop and a property test)."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import types
import typing
from typing import Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import ROOT

import train
from base.errors import ConfigError
from recipes.config import Config, load_config, reference_table
from recipes.config.schema import field_of, section_fields

# The allowed values of each domain, written out again here (an oracle independent of recipes/config/).
ORACLE = {
    ">0": lambda v: v > 0,
    ">=0": lambda v: v >= 0,
    "(0,1]": lambda v: 0 < v <= 1,
    "[0,1]": lambda v: 0 <= v <= 1,
    "[0,1)": lambda v: 0 <= v < 1,
    "[0,100]": lambda v: 0 <= v <= 100,
}
OUTSIDE = {  # override texts outside each domain
    ">0": ["0", "-1", "-0.5"],
    ">=0": ["-1", "-0.5"],
    "(0,1]": ["0", "1.5", "-0.1", "2"],
    "[0,1]": ["-0.1", "1.5", "2"],
    "[0,1)": ["1", "1.5", "-0.1", "2"],
    "[0,100]": ["-1", "100.5", "1000"],
    "nonempty": ["''", "[]", "'   '"],
    "name": ["''", "a/b", "..", ".", "../x"],
}


def _bound(d: str):
    """(op, limit) of a bound domain word such as `<=4096` or `>=0.05`, else None."""
    for op in ("<=", ">="):
        if d.startswith(op) and d not in ORACLE:
            text = d[2:]
            return op, float(text) if any(c in text for c in ".e") else int(text)
    return None


def oracle(d: str):
    if d in ORACLE:
        return ORACLE[d]
    op, limit = _bound(d)
    return (lambda v: v <= limit) if op == "<=" else (lambda v: v >= limit)


def outside(d: str) -> list[str]:
    if d in OUTSIDE:
        return OUTSIDE[d]
    op, limit = _bound(d)
    if op == "<=":
        return [str(limit + 1), str(limit * 10)]
    return [repr(limit / 2), repr(limit * 0.999)]


def _plain(tp):
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0]
    return tp


def schema_keys():
    """(override key, type, domain) for every leaf key, phases through phases.0."""
    out = []

    def walk(cls, prefix):
        for name, (f, tp) in section_fields(cls).items():  # a seam's section: every part's own keys too
            if dataclasses.is_dataclass(tp):
                walk(tp, f"{prefix}{name}.")
            elif typing.get_origin(tp) is list and dataclasses.is_dataclass(typing.get_args(tp)[0]):
                out.append((f"{prefix}{name}", tp, f.metadata["domain"]))
                walk(typing.get_args(tp)[0], f"{prefix}{name}.0.")
            else:
                out.append((f"{prefix}{name}", tp, f.metadata["domain"]))

    walk(Config, "")
    return out


KEYS = schema_keys()


def wrong_typed(tp) -> list[str]:
    p = _plain(tp)
    origin = typing.get_origin(p)
    if origin is Literal:
        return ["no-such-choice", "3", "[]"]
    if origin is list:
        return ["abc", "5", "{a: 1}"]
    if origin is dict or dataclasses.is_dataclass(p):
        return ["abc", "5", "[1]"]
    return {
        bool: ["maybe", "3", "[]", "{a: 1}"],
        int: ["1.5", "abc", "[1]", "{a: 1}", "true", ".nan", ".inf"],
        float: ["abc", "[1]", "{a: 1}", "true", ".nan", ".inf", "-.inf", "nan", "inf"],
        str: ["[1]", "{a: 1}"],
    }[p]


def bad_values(tp, domain: str) -> list[str]:
    p = _plain(tp)
    values = wrong_typed(tp)
    for d in domain.split():
        values += (
            outside(d) if not (typing.get_origin(p) is list and d != "nonempty") else [f"[{v}]" for v in outside(d)]
        )
    if typing.get_origin(p) is list and p is not list and typing.get_args(p)[0] is float:
        values += ["[.nan]", "[.inf]"]
    return values


def test_every_key_declares_its_domain_or_needs_none():
    """Numbers and lists always have a domain; only booleans, choices and free text (a URL, a name) may have none."""
    for key, tp, domain in KEYS:
        p = _plain(tp)
        if p in (int, float) or typing.get_origin(p) is list:
            assert domain, f"{key}: a number or list without a domain"
        for d in domain.split():
            assert d in OUTSIDE or _bound(d), f"{key}: domain {d!r} has no test values"


CASES = [(key, value) for key, tp, domain in KEYS for value in bad_values(tp, domain)]
PHASE = "{epochs: 2, image_size: 32, batch_size: 8}"


def _yaml_file(tmp_path, key: str, value: str):
    """A config file that sets `key` (dotted) to the YAML text `value`."""
    parts = key.split(".")
    if parts[0] == "phases" and len(parts) == 3:
        phase = {"epochs": "2", "image_size": "32", "batch_size": "8", parts[2]: value}
        text = "phases:\n  - {" + ", ".join(f"{k}: {v}" for k, v in phase.items()) + "}\n"
    elif len(parts) == 2:
        text = f"{parts[0]}:\n  {parts[1]}: {value}\n"
    else:
        text = f"{parts[0]}: {value}\n"
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def _one_error_line(rc: int, err: str, key: str, what: str) -> None:
    assert rc == 2, f"{what} accepted"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ConfigError: ") and "Traceback" not in err, err
    assert key in lines[0] and "expected" in lines[0], lines[0]


@pytest.mark.parametrize("key, value", CASES, ids=[f"{k}={v}" for k, v in CASES])
def test_out_of_domain_value_exits_2_with_one_line(key, value, capsys, tmp_path):
    """In a YAML file and as a command-line override (where a string key takes the text as it is: data.root=123
    is the folder '123', so only the YAML file can give a string key a list)."""
    rc = train.main(["--print-config", "-c", str(_yaml_file(tmp_path, key, value))])
    _one_error_line(rc, capsys.readouterr().err, key, f"{key}: {value} in a file")
    if _plain(dict((k, t) for k, t, _ in KEYS)[key]) is str and value[:1] in "[{":
        return
    base = [f"phases=[{PHASE}]"] if key.startswith("phases.") else []
    rc = train.main(["--print-config", *base, f"{key}={value}"])
    _one_error_line(rc, capsys.readouterr().err, key, f"{key}={value}")


def test_messages_name_the_allowed_range():
    cases = {
        "data.val_batch_size=0": "data.val_batch_size: expected an integer > 0, got 0",
        "run.seed=100000000000000000000000": "run.seed: expected an integer <= 2,147,483,647, got "
        "100000000000000000000000",
        "optim.label_smoothing=2": "optim.label_smoothing: expected a number in [0, 1), got 2.0",
        "optim.momentum=nan": "optim.momentum: expected a finite number in [0, 1), got nan",
        "run.target_top5=101": "run.target_top5: expected a number in [0, 100], got 101.0",
        "run.name=a/b": "run.name: expected a string that is a single path component (not empty, no '/', not '.' "
        "or '..'), got 'a/b'",
        "comm.tune_streams=[1, 0]": "comm.tune_streams.1: expected an integer > 0, got 0",
        "comm.tune_slices=[]": "comm.tune_slices: expected a non-empty list, got []",
    }
    for override, message in cases.items():
        with pytest.raises(ConfigError) as e:
            load_config(None, [override])
        assert str(e.value) == message


# Keys also checked against other keys (their schema field's `cross` metadata) load or not by more than their domain.
CROSS_KEY = {k for k, _, _ in KEYS if field_of(k).metadata["cross"]}
NUMERIC = [(k, tp, d) for k, tp, d in KEYS if _plain(tp) in (int, float) and k not in CROSS_KEY]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
@pytest.mark.parametrize("key, tp, domain", NUMERIC, ids=[k for k, _, _ in NUMERIC])
def test_numbers_are_accepted_exactly_inside_their_domain(key, tp, domain, data):
    """Property: for any int or float (NaN and infinities included), the config loads iff the value has the key's
    type, is finite and lies in the domain; otherwise one ConfigError line names the key."""
    value = data.draw(st.one_of(st.integers(-(10**6), 10**6), st.floats(allow_nan=True, allow_infinity=True)))
    is_int = isinstance(value, int)
    valid = (is_int or _plain(tp) is float) and math.isfinite(value)
    valid = valid and all(oracle(d)(value) for d in domain.split())
    base = [f"phases=[{PHASE}]"] if key.startswith("phases.") else []
    try:
        cfg = load_config(None, [*base, f"{key}={value!r}"])
    except ConfigError as e:
        assert not valid, f"{key}={value!r} refused: {e}"
        assert "\n" not in str(e) and str(e).startswith(key + ":"), str(e)
        return
    assert valid, f"{key}={value!r} accepted"
    node = cfg
    for part in key.split("."):
        # another plug-in's key is kept as given (inert), not readable as the chosen one's: its flat view holds it
        node = (
            node[int(part)] if part.isdigit() else node.flat()[part] if hasattr(node, "flat") else getattr(node, part)
        )
    assert node == value


def test_reference_shows_each_domain():
    table = reference_table()
    assert "| `optim.momentum` | a number | finite, in [0, 1) |" in table
    assert "| `run.name` | a string | a single path component (not empty, no '/', not '.' or '..') |" in table
    assert "| `comm.tune_streams` | a list of an integer | not empty, > 0, <= 64 |" in table
    assert "| `data.val_crop_ratio` | a number | finite, in (0, 1], >= 0.05 | `0.875`" in table
    assert "| `data.max_image_pixels` | an integer | > 0, <= 2,147,483,647 | `89478485` |" in table


def test_strict_yaml_extends_and_plan_errors(tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text("optim:\n  lr: 0.1\n  momentum: 0.9\n  lr: 0.2\n")
    with pytest.raises(ConfigError) as e:
        load_config(dup)
    assert str(e.value) == f"{dup}: line 4, column 3: not valid YAML: duplicate key 'lr' (first at line 2)"
    secret = tmp_path / "secret.txt"
    secret.write_text("root: hunter2\n")
    ext = tmp_path / "ext.yaml"
    listed = "extends: expected a YAML file name or a list of them, got"
    for target, message in [
        (str(secret), f"extends: '{secret}' is not a .yaml/.yml file"),
        ("5", f"{listed} 5"),
        ("[a.yaml, 7]", f"{listed} ['a.yaml', 7]"),
    ]:
        ext.write_text(f"extends: {target}\n")
        with pytest.raises(ConfigError) as e:
            load_config(ext)
        assert str(e.value) == f"{ext}: {message}" and "hunter2" not in str(e.value)
    for flags, limit in ((["--world-size", "0"], "1,048,576"), (["--num-images", "-3"], "1,000,000,000")):
        p = subprocess.run(
            [sys.executable, "train.py", "-c", "configs/quickstart.yaml", "--plan", *flags],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 2 and p.stderr.strip().splitlines() == [
            f"error: argument {flags[0]}: expected an integer in [1, {limit}], got '{flags[1]}' (see train.py --help)"
        ]
