"""Loading the typed configuration: YAML files with `extends:` inheritance, dotted `key=value` overrides.

`load_config(path, overrides)` returns a validated `Config`; any problem raises `ConfigError` with the file,
key, expected type and value named.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from base import reader, registry
from base.errors import ConfigError
from recipes.config.rules import check_all
from recipes.config.schema import (
    Config,
    PluginSection,
    _is_name,
    _plain,
    _type_name,
    domain_rule,
    domain_text,
    section_fields,
)
from recipes.config.yaml_strict import parse_yaml, show

# ---------------------------------------------------------------------------------------------------------
# Conversion of plain YAML data into the typed schema.


def _closest(full: str, valid: list[str]) -> str:
    """' (did you mean 'optim.lr'?)' for the valid key at the same level closest to the last part of `full`."""
    prefix, _, key = full.rpartition(".")
    match = difflib.get_close_matches(key, valid, n=1, cutoff=0.0)
    return f" (did you mean '{prefix + '.' if prefix else ''}{match[0]}'?)" if match else ""


def _convert(value: Any, tp: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    bad = ConfigError(f"{path}: expected {_type_name(tp)}, got {show(value)}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            choices = [a for a in typing.get_args(tp) if isinstance(a, str)]
            match = difflib.get_close_matches(value, choices, n=1, cutoff=0.5) if isinstance(value, str) else []
            raise ConfigError(f"{bad}{f' (did you mean {match[0]!r}?)' if match else ''}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, path)
            except ConfigError:
                continue
        raise bad
    if origin is list:
        if not isinstance(value, list):
            raise bad
        (item_tp,) = typing.get_args(tp)
        return [_convert(v, item_tp, f"{path}.{i}") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise bad
        k_tp, v_tp = typing.get_args(tp)
        return {_convert(k, k_tp, path): _convert(v, v_tp, f"{path}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad
        return _build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e30 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                raise bad from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if tp is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # YAML reads a folder named 160 as a number
        if not isinstance(value, str):
            raise bad
        return value
    raise bad


def _check_domain(value: Any, tp: Any, domain: str, path: str) -> None:
    """Raise ConfigError when a converted value lies outside its key's domain (or is a NaN/infinite number)."""
    if value is None:
        return
    parts = domain.split()
    if isinstance(value, list) and typing.get_origin(_plain(tp)) is list:
        if "nonempty" in parts and not value:
            raise ConfigError(f"{path}: expected a non-empty list, got []")
        item_tp = typing.get_args(_plain(tp))[0]
        for i, v in enumerate(value):
            _check_domain(v, item_tp, " ".join(d for d in parts if d != "nonempty"), f"{path}.{i}")
        return
    if isinstance(value, float) and not math.isfinite(value):
        extra = f" {domain_text(domain)}" if domain else ""
        raise ConfigError(f"{path}: expected a finite number{extra}, got {show(value)}")
    for d in parts:
        test, text = domain_rule(d)
        if not test(value):
            what = _type_name(_plain(tp))
            raise ConfigError(f"{path}: expected {what} {text}, got {show(value)}")


def _build(cls: type, data: dict, path: str) -> Any:
    """An instance of schema class `cls` from a YAML mapping (a seam's section: its parts' own keys flat in it)."""
    known = section_fields(cls)
    hints = {k: tp for k, (_, tp) in known.items()}
    fields = {k: f for k, (f, _) in known.items()}
    kwargs = {}
    for key, value in data.items():
        full = f"{path}.{key}" if path else str(key)
        if key not in fields:
            raise ConfigError(f"unknown key '{full}'{_closest(full, list(fields))}")
        kwargs[key] = _convert(value, hints[key], full)
        _check_domain(kwargs[key], hints[key], fields[key].metadata.get("domain", ""), full)
    for name, f in fields.items():
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            full = f"{path}.{name}" if path else name
            raise ConfigError(f"{full}: required key is missing ({f.metadata.get('help', '')})")
    return cls(**kwargs)


# Validation resizes the shorter side to size / val_crop_ratio before the center crop; beyond this the resized
# image alone is gigabytes.
MAX_VAL_RESIZE = 8192


def _validate(cfg: Config) -> None:
    """Checks that involve several keys (one key's own range is its domain, checked in _build): the schema's declared
    rules (recipes/config/rules.py), and those of the input pipeline's records."""
    if cfg.data.get("aug_splits") == 1:
        raise ConfigError(f"data.aug_splits: expected 0 (off) or an integer >= 2, got {cfg.data.aug_splits}")
    # Refused, not only warned (recipes/config/inert.py): augmentation the pipeline does not run would train
    # something else than the config says, and aug_splits also changes the loss (JSD) whatever the pipeline.
    pipeline = registry.INPUT_PIPELINES[cfg.data.backend]
    for key in ("auto_augment", "aug_splits"):
        if cfg.data.unread.get(key):
            readers = [r.name for r in registry.INPUT_PIPELINES.values() if key in r.reads]
            raise ConfigError(
                f"data.{key}: timm's PIL augmentations run on data.backend={'/'.join(readers)} only, "
                f"got data.backend={cfg.data.backend!r}"
            )
    check_all(cfg)  # the rules the schema's fields declare (`cross=`), each written once
    for i, phase in enumerate(cfg.phases):
        size = phase.val_image_size or phase.image_size
        if "val_crop_ratio" in pipeline.reads and round(size / cfg.data.val_crop_ratio) > MAX_VAL_RESIZE:
            raise ConfigError(
                f"data.val_crop_ratio: {cfg.data.val_crop_ratio} makes phase {i}'s validation resize the shorter "
                f"side to {round(size / cfg.data.val_crop_ratio):,} px for a {size} px crop (at most "
                f"{MAX_VAL_RESIZE:,})"
            )
    for name, root in cfg.data.get("roots", {}).items():
        if not _is_name(name) or not root.strip():
            raise ConfigError(f"data.roots: expected names mapped to non-empty paths, got {show(name)}: {show(root)}")


# ---------------------------------------------------------------------------------------------------------
# Files, inheritance and overrides (the YAML text itself is parsed by recipes/config/yaml_strict.py).


# A config is a few KB; YAML's pure-Python scanner takes about 2 s a megabyte, so a larger file is refused unread.
MAX_CONFIG_BYTES = 1024 * 1024


def _read_yaml(path: Path) -> dict:
    if not os.path.lexists(path):  # a FIFO or a folder is there: the reader says what it is
        raise ConfigError(f"{path}: config file not found")
    data = reader.read_bytes(path, what="config file", error=ConfigError, max_bytes=MAX_CONFIG_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (not UTF-8)") from None
    try:
        data = parse_yaml(text)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{path}:{where}: not valid YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_yaml_tree(path: str | Path, _seen: tuple = ()) -> dict:
    """Read a YAML config, resolving `extends:` (a path relative to the file, or a list of them)."""
    path = Path(path).resolve()
    if path in _seen:
        raise ConfigError(f"{path}: circular 'extends' chain: {' -> '.join(str(p) for p in _seen + (path,))}")
    data = _read_yaml(path)
    parents = data.pop("extends", None)
    if parents is None:
        return data
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) and p for p in parents):
        raise ConfigError(f"{path}: extends: expected a YAML file name or a list of them, got {show(parents)}")
    merged: dict = {}
    for parent in parents:
        if Path(parent).suffix.lower() not in (".yaml", ".yml"):
            # Not read at all: an error about its content would print a line of an arbitrary file.
            raise ConfigError(f"{path}: extends: '{parent}' is not a .yaml/.yml file")
        if not (path.parent / parent).is_file():  # name the file that asks for it, not only the missing one
            raise ConfigError(f"{path}: extends: '{parent}' not found ({path.parent / parent})")
        merged = _merge(merged, load_yaml_tree(path.parent / parent, _seen + (path,)))
    return _merge(merged, data)


def _set_dotted(tree: dict, dotted: str, raw: str) -> None:
    try:
        value = parse_yaml(raw) if raw != "" else ""
    except ConfigError as e:
        raise ConfigError(f"{dotted}: {e}") from None
    except yaml.YAMLError:
        value = raw
    keys = dotted.split(".")
    node: Any = tree
    schema: Any = Config
    for i, key in enumerate(keys):
        here = ".".join(keys[: i + 1])
        above = ".".join(keys[:i]) or "the config"
        last = i == len(keys) - 1
        if isinstance(node, list):
            if typing.get_origin(_plain(schema)) is not list:
                raise ConfigError(f"{above}: expected {_type_name(_plain(schema))}, got a list")
            if not key.isdigit() or int(key) >= len(node):
                # an index changes an existing item; say how to add one, which is what a new index usually meant
                hint = f"; {above}=[...] replaces the whole list (to add an item, give them all)"
                raise ConfigError(f"{here}: expected a list index below {len(node)}{hint}")
            idx = int(key)
            schema = typing.get_args(_plain(schema))[0]
            if last:
                node[idx] = value
            elif isinstance(node[idx], (dict, list)):
                node = node[idx]
            elif node[idx] is None:
                node[idx] = {} if dataclasses.is_dataclass(schema) else []
                node = node[idx]
            else:
                raise ConfigError(f"{here}: expected {_type_name(_plain(schema))}, got {show(node[idx])}")
            continue
        if not isinstance(node, dict):
            raise ConfigError(f"{above}: expected {_type_name(_plain(schema))}, got {show(node)}")
        if dataclasses.is_dataclass(schema):
            known = section_fields(schema)
            if key not in known:
                raise ConfigError(f"unknown key '{here}'{_closest(here, list(known))}")
            schema = known[key][1]
            if _plain(schema) is str and last and not isinstance(value, str) and value is not None:
                value = raw  # data.root=123 means the folder "123"
        elif typing.get_origin(_plain(schema)) is dict:
            schema = typing.get_args(_plain(schema))[1]
        else:
            raise ConfigError(f"{above}: expected {_type_name(_plain(schema))}, cannot set '{dotted}'")
        if last:
            node[key] = value
        else:
            if not isinstance(node.get(key), (dict, list)):
                if node.get(key) is not None:
                    raise ConfigError(f"{here}: expected {_type_name(_plain(schema))}, got {show(node[key])}")
                node[key] = {} if dataclasses.is_dataclass(schema) or typing.get_origin(schema) is dict else []
            node = node[key]


def parse_override(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise ConfigError(f"override '{text}': expected key=value (for example optim.lr=0.4)")
    key, raw = text.split("=", 1)
    if not key:
        raise ConfigError(f"override '{text}': empty key")
    return key.strip(), raw


_KEY_START = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*=")


def split_overrides(text: str) -> list[str]:
    """`key=value` overrides from one string (make's OVERRIDES=): a new one starts at a word that begins with
    `key=` once the brackets and quotes of the previous one are closed, so values may hold spaces
    ('data.roots={160: /data/imagenet-160} phases.0.root=160' is two overrides)."""
    out: list[str] = []
    for word in text.split():
        prev = out[-1] if out else ""
        closed = all(prev.count(a) == prev.count(b) for a, b in ("{}", "[]", "()")) and prev.count("'") % 2 == 0
        closed = closed and prev.count('"') % 2 == 0
        if not out or (closed and _KEY_START.match(word)):
            out.append(word)
        else:
            out[-1] += " " + word
    return out


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Load a YAML config (with `extends:`), apply `key=value` overrides, validate, return a `Config`."""
    tree = load_yaml_tree(path) if path is not None else {}
    if "phases" not in tree and any(o.startswith("phases.") for o in overrides):
        tree["phases"] = [dataclasses.asdict(p) for p in Config().phases]
    for text in overrides:
        _set_dotted(tree, *parse_override(text))
    try:
        cfg = _build(Config, tree, "")
    except ConfigError as e:
        where = f"{path}: " if path is not None else ""
        # A value given on the command line is that value's fault, not the file's: name the override.
        given = [parse_override(o) for o in overrides] if path is not None else []  # no file: nothing to tell apart
        # (a value with a line break or control character is shown quoted: the error stays one line)
        blamed = next(
            (
                f"{k}={v if v.isprintable() else show(v)}"
                for k, v in reversed(given)
                if str(e).startswith((f"{k}:", f"{k}."))
            ),
            None,
        )
        raise ConfigError(f"command line ({blamed}): {e}" if blamed else f"{where}{e}") from None
    _validate(cfg)
    return cfg


def config_from_dict(data: dict, source: str = "") -> Config:
    """A validated `Config` from plain data (a checkpoint's `config`, a parsed YAML tree without `extends:`)."""
    try:
        cfg = _build(Config, data, "")
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}" if source else str(e)) from None
    _validate(cfg)
    return cfg


def to_dict(cfg: Config) -> dict:
    """The config as plain data, each seam's section flat (as the YAML writes it: `PluginSection.flat`)."""
    out = dataclasses.asdict(cfg)
    for f in dataclasses.fields(cfg):
        if isinstance(getattr(cfg, f.name), PluginSection):
            out[f.name] = getattr(cfg, f.name).flat()
    return out


def to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False)
