"""The reference table of every config key (docs/config.md, `python train.py --help-config`), and the plug-in tables
of docs/config.md, from the records of base/registry.py."""

from __future__ import annotations

import dataclasses
import typing

from base import registry
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


def _reads_table(section: str, what: str) -> list[str]:
    """The records of one seam (base/registry.py SEAMS): which keys of the section each reads, which are inert."""
    seam = registry.SEAMS[section]
    every = ", ".join(f"`{k}`" for k in seam.shared if k != seam.key)
    keys = [f.name for f in dataclasses.fields(type(getattr(Config(), section))) if f.name not in seam.shared]
    rows = [
        "",
        f"Every {what} reads {every}; the other `{section}.*` keys only where listed (elsewhere they are inert: a set "
        "value is warned about, `--print-config` marks them).",
        "",
        f"| `{section}.{seam.key}` | implementation | also reads | inert |",
        "|---|---|---|---|",
    ]
    for r in seam.records.values():
        reads = ", ".join(f"`{k}`" for k in keys if k in r.reads) or "-"
        inert = ", ".join(f"`{k}`" for k in keys if k not in r.reads) or "-"
        shown = f"`{r.impl}`" if hasattr(r, "impl") else f"timm `{r.arch}`"
        shown += f" ({r.label})" if hasattr(r, "label") else ""
        rows.append(f"| `{r.name}` | {shown} | {reads} | {inert} |")
    return rows


def plugin_tables() -> str:
    """Markdown tables of the registered allreduce backends, optimizers, input pipelines and models, from their
    records."""
    rows = [
        "| `comm.backend` | implementation | rows in the time model (scripts/predict.py) | reads `comm.compression` |",
        "|---|---|---|---|",
    ]
    for r in registry.ALLREDUCE_BACKENDS.values():
        shown = ", ".join(f'"{r.row_label(f)}"' for f in r.time_flows) or "none"
        rows.append(f"| `{r.name}` | `{r.impl}` | {shown} | {'yes' if r.compression else 'no'} |")
    rows += _reads_table("optim", "optimizer")
    rows += _reads_table("data", "input pipeline")
    rows += _reads_table("model", "model")
    return "\n".join(rows)
