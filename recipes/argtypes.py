"""argparse types for numbers given on a command line: finite and inside stated bounds, refused at the argument.

`type=bounded_int(1, 10_000)` makes argparse say `argument --stop-after-epochs: expected an integer in [1, 10,000],
got '-1'` (exit 2, one line) instead of letting a negative, zero, NaN, infinite or absurd value reach the code, where
it would train for nothing, spin, or fail deep inside a library.
"""

from __future__ import annotations

import argparse
import math


def _shown(v) -> str:
    return f"{v:,}" if isinstance(v, int) else f"{v:g}"


def bounded_int(lo: int, hi: int):
    """An argparse type: an integer in [lo, hi]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected an integer in [{_shown(lo)}, {_shown(hi)}], got {text!r}")
        return value

    parse.__name__ = "integer"
    return parse


def bounded_float(lo: float, hi: float, *, low_open: bool = False, zero: bool = False):
    """An argparse type: a finite number in [lo, hi] (or (lo, hi] with low_open); with `zero`, also exactly 0 (a
    flag whose 0 means "none", whose other values need a plausible lower bound: a rate of 1e-300 is no rate)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and (lo < value if low_open else lo <= value) and value <= hi
        if not ok and not (zero and value == 0):
            left = "(" if low_open else "["
            also = "0 or " if zero else ""
            raise argparse.ArgumentTypeError(
                f"expected {also}a number in {left}{_shown(lo)}, {_shown(hi)}], got {text!r}"
            )
        return value

    parse.__name__ = "number"
    return parse


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one `error:` line and exit 2, like every other user error of the project
    (argparse's own print the usage block first)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")
