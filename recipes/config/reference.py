"""The reference table of every config key (docs/config.md, `python train.py --help-config`)."""

from __future__ import annotations

import dataclasses
import typing

from recipes.config.schema import Config, Phase, _plain, _type_name, domain_text


def reference_table() -> str:
    """Markdown table of every key, its type, default and meaning (docs/config.md)."""
    rows = ["| key | type | allowed | default | meaning |", "|---|---|---|---|---|"]

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        defaults = cls() if cls is not Phase else None
        for f in dataclasses.fields(cls):
            key = f"{prefix}{f.name}"
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp):
                walk(tp, key + ".")
                continue
            if typing.get_origin(tp) is list and dataclasses.is_dataclass(typing.get_args(tp)[0]):
                allowed = domain_text(f.metadata.get("domain", "")) or "any"
                rows.append(f"| `{key}` | list | {allowed} | see below | {f.metadata['help']} |")
                walk(typing.get_args(tp)[0], key + "[].")
                continue
            if defaults is not None:
                default = getattr(defaults, f.name)
            else:
                default = "required" if f.default is dataclasses.MISSING else f.default
            allowed = domain_text(f.metadata.get("domain", "")) or "any"
            if _plain(tp) is float or typing.get_origin(_plain(tp)) is list and typing.get_args(_plain(tp))[0] is float:
                allowed = "finite" + (f", {allowed}" if allowed != "any" else "")
            rows.append(f"| `{key}` | {_type_name(tp)} | {allowed} | `{default!r}` | {f.metadata['help']} |")

    walk(Config, "")
    return "\n".join(rows)
