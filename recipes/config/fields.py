"""How a schema field is declared (`_f`: default, help, domain, and what the tests and the loader read of it) and
what a domain allows; recipes/config/schema.py declares the fields."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import field
from typing import Any, Literal


def _f(
    default: Any = dataclasses.MISSING,
    help: str = "",
    factory: Any = None,
    domain: str = "",
    trains: bool = True,
    *,
    unbounded: str = "",
    cross: Any = None,
) -> Any:
    """A schema field: default (or factory), meaning, and `domain`: the values allowed besides the type
    (keys of DOMAINS, space-separated; on a list, "nonempty" is about the list and the others about its items).
    `trains=False`: the value does not change what is trained (logging, output, where the data lives, timeouts),
    so a resume may change it; on a section, every key of the section.
    `unbounded`: why a number without an upper bound is safe whatever its size (its consumer takes any finite
    value); a number without one and without a `<=` domain is refused by tests/unit/test_hostile_config.py.
    `cross`: the rule against other keys the value is also checked by, beyond its domain (a
    recipes/config/rules.py `Rule`: the loader runs every declared one)."""
    meta = {"help": help, "domain": domain, "trains": trains, "unbounded": unbounded, "cross": cross}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# Why a number may be unbounded (`unbounded=`): what its consumer does with any finite value.
_FACTOR = "a rate or factor: an absurd value gives non-finite steps, which run.on_nonfinite handles"
_FIGURE = "a figure only computed with (network, price): never allocates or loops"
_COUNT = "a step count or number of files the code compares against: never allocates or loops over it"


def _is_name(v: str) -> bool:
    return bool(v.strip()) and "/" not in v and "\\" not in v and "\0" not in v and v not in (".", "..")


# Domain -> (test, what the error and the reference say). Every number is also required to be finite.
DOMAINS: dict[str, tuple[Any, str]] = {
    ">0": (lambda v: v > 0, "> 0"),
    ">=0": (lambda v: v >= 0, ">= 0"),
    "(0,1]": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "[0,1]": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "[0,1)": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "[0,100]": (lambda v: 0 <= v <= 100, "in [0, 100]"),
    "nonempty": (lambda v: len(v) > 0 and (not isinstance(v, str) or bool(v.strip())), "that is not empty"),
    "name": (_is_name, "that is a single path component (not empty, no '/', not '.' or '..')"),
}


_BOUND = re.compile(r"(<=|>=)(-?[0-9][0-9_.e+]*)")


def domain_rule(d: str) -> tuple[Any, str]:
    """(test, text) of one domain word: a key of DOMAINS, or a bound such as `<=4096` or `>=0.05` (a limit of what
    the code can do with the value: a thread count, an image size, a seed NumPy accepts)."""
    if d in DOMAINS:
        return DOMAINS[d]
    m = _BOUND.fullmatch(d)
    if not m:
        raise KeyError(f"unknown domain {d!r}")
    op, text = m.groups()
    limit = float(text) if any(c in text for c in ".e") else int(text)
    shown = f"{limit:,}" if isinstance(limit, int) else f"{limit:g}"
    if op == "<=":
        return (lambda v: v <= limit), f"<= {shown}"
    return (lambda v: v >= limit), f">= {shown}"


def domain_text(domain: str) -> str:
    """The allowed values of a domain, as the reference and the errors say them ('' = any value of the type)."""
    return ", ".join(domain_rule(d)[1].removeprefix("that is ") for d in domain.split())


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", bool: "true/false", str: "a string"}.get(tp, str(tp))


def _plain(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp
