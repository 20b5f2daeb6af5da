"""Strict YAML: the parser every config file, override value and run directory's config.yaml goes through.

YAML's safe loader with four refusals a config needs: a key given twice in one mapping, a key that is not a
scalar, a number too long to be a config's (or a YAML 1.1 base-60 one), and aliases that expand a small file into
billions of values. `show` is the bounded repr every config error message prints a value with.
"""

from __future__ import annotations

import re
import reprlib
from typing import Any

import yaml

from base.errors import ConfigError

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 2, 4, 4, 60, 60


def show(value: Any) -> str:
    """repr() of a value for an error message, bounded: a huge or deeply nested value is abbreviated, never built."""
    return _REPR.repr(value)


# A config has a few hundred values; aliases that repeat aliases ("billion laughs") expand a small file into
# billions. The composed node graph is small (an alias is one shared node), so its expanded size is counted
# there, before anything is constructed.
MAX_YAML_VALUES = 100_000
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error (not: the last one wins) and
    a key must be a scalar. The standard merge key (`<<: *defaults`) works: the mapping's own keys override the
    merged ones, as YAML specifies."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                kind = "list" if isinstance(key_node, yaml.SequenceNode) else "mapping"
                raise yaml.constructor.ConstructorError(
                    None, None, f"a key must be a name, got a {kind}", key_node.start_mark
                )
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                name = key if isinstance(key, str) and len(key) < 60 else show(key)
                first = seen[key].line + 1
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key '{name}' (first at line {first})", key_node.start_mark
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


# A config's numbers fit in 64 bits: a longer one is a mistake, and a few thousand digits are a traceback in int()
# (Python's 4,300-digit limit) or an overflow later.
MAX_NUMBER_CHARS = 40
_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
# YAML 1.2's numbers, as YAML 1.1's (0x, 0o-style octal, underscores) but without base 60: `1:30` is the string
# '1:30' (the schema then says what it expected), not 90, and a 2.4 MB `1:1:...:1` is never multiplied out.
_INT_RE = re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$")
_FLOAT_RE = re.compile(
    r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9_]+(?:[eE][-+][0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)


def _number_text(loader: yaml.SafeLoader, node) -> None:
    """Refuse a number too long to be a config's, or a base-60 one given with an explicit `!!int`/`!!float`."""
    text = node.value
    where = f"line {node.start_mark.line + 1}: "
    if len(text) > MAX_NUMBER_CHARS:
        raise ConfigError(f"{where}a number of {len(text):,} characters: expected at most {MAX_NUMBER_CHARS}")
    if ":" in text:
        raise ConfigError(f"{where}{text!r} is not a number (base 60 is YAML 1.1's, not read here)")


def _construct_int(loader, node):
    _number_text(loader, node)
    return yaml.SafeLoader.construct_yaml_int(loader, node)


def _construct_float(loader, node):
    _number_text(loader, node)
    return yaml.SafeLoader.construct_yaml_float(loader, node)


_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT_TAG, _FLOAT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(_INT_TAG, _INT_RE, list("-+0123456789"))
_StrictLoader.add_implicit_resolver(_FLOAT_TAG, _FLOAT_RE, list("-+0123456789."))
_StrictLoader.add_constructor(_INT_TAG, _construct_int)
_StrictLoader.add_constructor(_FLOAT_TAG, _construct_float)


def _expanded_size(root) -> int:
    """Values a composed YAML node graph expands to (aliases counted every time they are used)."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise yaml.constructor.ConstructorError(None, None, "an alias refers to itself", node.start_mark)
        active.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(n) for n in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        active.discard(key)
        sizes[key] = min(total, MAX_YAML_VALUES + 1)
        return sizes[key]

    return size(root)


def parse_yaml(text: str):
    """YAML text -> plain data, strictly (see _StrictLoader), refusing a document that expands to more than
    MAX_YAML_VALUES values. Raises yaml.YAMLError, or ConfigError for the size."""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node) > MAX_YAML_VALUES:
            raise ConfigError(
                f"the YAML expands to more than {MAX_YAML_VALUES:,} values (aliases that repeat aliases); "
                "a config has a few hundred"
            )
        return loader.construct_document(node)
    except RecursionError:
        raise ConfigError("the YAML is nested too deeply") from None
    finally:
        loader.dispose()
