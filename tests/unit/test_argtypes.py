"""Every numeric flag of the entry points is bounded and finite: a generated check over their parsers, so a new
flag that takes a bare int or float fails here until it gets bounds."""

from __future__ import annotations

import argparse

import pytest

import evaluate
import train

PARSERS = {"train.py": train.parser, "evaluate.py": evaluate.parser}
BAD = ["-1", "nan", "inf", "-inf", "1e308", "99999999999999999999", "x", ""]


def numeric_flags():
    for name, make in PARSERS.items():
        for action in make()._actions:
            if action.option_strings and action.type is not None:
                yield name, action


def test_no_numeric_flag_is_unbounded():
    bare = [f"{n} {a.option_strings[0]}" for n, a in numeric_flags() if a.type in (int, float)]
    assert bare == [], "use recipes.argtypes.bounded_int/bounded_float for these"


@pytest.mark.parametrize("name, action", list(numeric_flags()), ids=lambda x: getattr(x, "dest", x))
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
