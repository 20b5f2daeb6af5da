"""Every numeric flag of the entry points is bounded and finite: a generated check over their parsers, so a new
flag that takes a bare int or float fails here until it gets bounds."""

from __future__ import annotations

import argparse

import pytest

import evaluate
import train
from recipes.argtypes import bounded_float
from recipes.evaluation.cli import _NUMBERS
from scripts import predict

PARSERS = {"train.py": train.parser, "evaluate.py": evaluate.parser, "predict.py": predict.parser}
BAD = ["-1", "nan", "inf", "-inf", "1e308", "99999999999999999999", "x", ""]


def test_predict_refuses_a_process_count_that_does_not_divide_the_batch(capsys):
    assert predict.main(["--hosts", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: --hosts/--gpus-per-host: 3 x 8 = 24 processes do not divide the global batch of 32768: choose a "
        "process count that does"
    ]


def test_predict_outputs_are_checked_before_the_computation(tmp_path, capsys):
    (tmp_path / "real").write_text("x")
    (tmp_path / "link.json").symlink_to(tmp_path / "real")
    for flag, path, words in (
        ("--json", tmp_path, "is a directory"),
        ("--json", tmp_path / "no" / "p.json", "does not exist"),
        ("--png", tmp_path / "link.json", "is a symbolic link"),
    ):
        assert predict.main([flag, str(path)]) == 2
        err = capsys.readouterr()
        assert err.err.startswith(f"error: {flag}: ") and words in err.err and err.out == "", err
    assert (tmp_path / "real").read_text() == "x"


def numeric_flags():
    for name, make in PARSERS.items():
        for action in make()._actions:
            if action.option_strings and action.type is not None:
                yield name, action


# evaluate.py checks its numbers after parsing, from one table (recipes/evaluation/cli.py _NUMBERS), so that an
# out-of-range value is refused before the checkpoint is loaded and tests/integration/test_hostile_evaluate.py
# generates its cases from the same table.
CHECKED_AFTER_PARSING = {("evaluate.py", flag) for flag, *_ in _NUMBERS}


def test_no_numeric_flag_is_unbounded():
    bare = [
        f"{n} {a.option_strings[0]}"
        for n, a in numeric_flags()
        if a.type in (int, float) and (n, a.option_strings[0]) not in CHECKED_AFTER_PARSING
    ]
    assert bare == [], "use recipes.argtypes.bounded_int/bounded_float for these"


@pytest.mark.parametrize(
    "name, action",
    [(n, a) for n, a in numeric_flags() if a.type not in (int, float)],
    ids=lambda x: getattr(x, "dest", x),
)
def test_out_of_bounds_values_are_refused_at_the_argument(name, action):
    bounded = [a for a in BAD if _refused(action, a)]
    # Every flag refuses non-finite, absurd and non-numeric text; -1 is refused by all but none here allow negatives.
    assert set(bounded) == set(BAD), f"{name} {action.option_strings[0]} accepted {set(BAD) - set(bounded)}"


def _refused(action, text) -> bool:
    try:
        action.type(text)
    except argparse.ArgumentTypeError as e:
        assert repr(text) in str(e) and "expected" in str(e)
        return True
    return False


def test_the_refusal_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        train.main(["--stop-after-epochs", "-1"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "error: argument --stop-after-epochs: expected an integer in [1, 10,000]"
    )


def test_an_open_lower_bound_refuses_the_bound_itself():
    parse = bounded_float(0, 1, low_open=True)
    assert parse("0.5") == 0.5 and parse("1e-9") == 1e-9
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected a number in \(0, 1\], got '0'"):
        parse("0")
    closed = bounded_float(0.001, 10, zero=True)  # 0 means "none"; any other value is a plausible rate
    assert closed("0") == 0 and closed("0.001") == 0.001
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected 0 or a number in \[0.001, 10\], got '1e-300'"):
        closed("1e-300")


@pytest.mark.parametrize("flag", ["--link-gbit", "--flow-gbit", "--intra-gbyte", "--efficiency"])
@pytest.mark.parametrize("value", ["0", "1e-300", "-0"])
def test_predict_rates_have_a_plausible_lower_bound(capsys, flag, value):
    """--link-gbit 0 once ended in a ZeroDivisionError traceback, 1e-300 in results of 300 digits."""
    if flag == "--flow-gbit" and value in ("0", "-0"):
        return  # 0 = no per-flow cap
    with pytest.raises(SystemExit) as e:
        predict.parser().parse_args([flag, value])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and f"argument {flag}: expected" in err, err
