"""The reference table of every config key (docs/config.md, `python train.py --help-config`), and the plug-in tables
of docs/config.md, from the records of base/registry.py."""

from __future__ import annotations

import dataclasses
import typing

from base import registry
from recipes.config.schema import Config, Phase, PluginSection, _plain, _type_name, default_of, domain_text, own_class


def _row(key: str, f: dataclasses.Field, tp, default) -> str:
    allowed = domain_text(f.metadata.get("domain", "")) or "any"
    if _plain(tp) is float or typing.get_origin(_plain(tp)) is list and typing.get_args(_plain(tp))[0] is float:
        allowed = "finite" + (f", {allowed}" if allowed != "any" else "")
    return f"| `{key}` | {_type_name(tp)} | {allowed} | `{default!r}` | {f.metadata['help']} |"


def _plugin_rows(section: str) -> list[str]:
    """Each part's own keys under it (a key several parts share, under the first that reads it)."""
    seam, shown, rows = registry.SEAMS[section], set(), []
    for r in seam.records.values():
        cls = own_class(r)
        hints = typing.get_type_hints(cls)
        new = [f for f in dataclasses.fields(cls) if f.name not in shown]
        said = [f"{len(new)} below"] if new else []
        said += [", ".join(f"`{k}`" for k in r.reads if k in shown) + " (above)"] if len(new) < len(r.reads) else []
        rows.append(f"| **`{section}.{seam.key}={r.name}`** | | | | its own keys: {'; '.join(said) or 'none'} |")
        for f in new:
            rows.append(_row(f"{section}.{f.name}", f, hints[f.name], default_of(f)))
            shown.add(f.name)
    return rows


def reference_table() -> str:
    """Markdown table of every key, its type, default and meaning (docs/config.md); a seam's section lists the keys
    every part reads, then each part's own keys under it."""
    rows = ["| key | type | allowed | default | meaning |", "|---|---|---|---|---|"]

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        defaults = cls() if cls is not Phase else None
        for f in dataclasses.fields(cls):
            key = f"{prefix}{f.name}"
            tp = hints[f.name]
            if f.name == "own" and isinstance(defaults, PluginSection):
                rows.extend(_plugin_rows(cls.SEAM))
                continue
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
            rows.append(_row(key, f, tp, default))

    walk(Config, "")
    return "\n".join(rows)


def _reads_table(section: str, what: str) -> list[str]:
    """The records of one seam (base/registry.py SEAMS): its config class and the keys of the section it reads."""
    seam = registry.SEAMS[section]
    every = ", ".join(f"`{k}`" for k in seam.shared if k != seam.key)
    rows = [
        "",
        f"Every {what} reads {every}; the other `{section}.*` keys are its own config's (recipes/config/plugins.py), "
        "set in the same section: another one's key given to it is inert (a set value is warned about, "
        "`--print-config` marks it).",
        "",
        f"| `{section}.{seam.key}` | implementation | config | its own keys |",
        "|---|---|---|---|",
    ]
    for r in seam.records.values():
        reads = ", ".join(f"`{k}`" for k in r.reads) or "-"
        shown = f"`{r.impl}`" if hasattr(r, "impl") else f"timm `{r.arch}`"
        shown += f" ({r.label})" if hasattr(r, "label") else ""
        rows.append(f"| `{r.name}` | {shown} | `{r.config.rpartition(':')[2] or '-'}` | {reads} |")
    return rows


def plugin_tables() -> str:
    """Markdown tables of the registered allreduce backends, optimizers, input pipelines and models, from their
    records."""
    rows = [
        "| `comm.backend` | implementation | rows in the time model (scripts/predict.py) | wire format |",
        "|---|---|---|---|",
    ]
    for r in registry.ALLREDUCE_BACKENDS.values():
        shown = ", ".join(f'"{r.row_label(f)}"' for f in r.time_flows) or "none"
        wire = r.wire_dtype or ("`comm.compression`" if r.compression else "the gradients' dtype")
        rows.append(f"| `{r.name}` | `{r.impl}` | {shown} | {wire} |")
    rows += _reads_table("comm", "allreduce backend")
    rows += _reads_table("optim", "optimizer")
    rows += _reads_table("data", "input pipeline")
    rows += _reads_table("model", "model")
    return "\n".join(rows)


def backend_table() -> str:
    """docs/allreduce.md's table of the registered allreduce backends: what each is, what starts it, its wire format."""
    rows = ["| backend | what it is | started by | wire format |", "|---|---|---|---|"]
    for r in registry.ALLREDUCE_BACKENDS.values():
        wire = r.wire_dtype or ("`comm.compression`" if r.compression else "the gradients' dtype")
        rows.append(f"| `{r.name}` | {r.about} | {r.launcher} | {wire} |")
    return "\n".join(rows)


def backend_measures_table() -> str:
    """docs/allreduce.md's table of what each backend's CommStats time and count (its record's comm_* fields)."""
    rows = [
        "| backend | window (`comm_seconds`) | `wait_seconds` (after backward ended) | `bytes` |",
        "|---|---|---|---|",
    ]
    for r in registry.ALLREDUCE_BACKENDS.values():
        rows.append(f"| `{r.name}` | {r.comm_window} | {r.comm_wait} | {r.comm_bytes} |")
    return "\n".join(rows)


def optimizer_table() -> str:
    """docs/recipe.md's table of the registered optimizers: each update, and what its step reads and can do."""
    rows = [
        "| name | update of a tensor w with gradient g | reads momentum | a non-finite step is skipped | CUDA graph |",
        "|---|---|---|---|---|",
    ]
    for r in registry.OPTIMIZERS.values():
        momentum = "yes" if "momentum" in r.reads else "no (not logged)"
        skip = "on the device" if r.skips_on_device else "on the host"
        graph = "capturable" if r.capturable else "no"  # captured only inside a GPU proof (recipes/proofs.py)
        rows.append(f"| `{r.name}` | {r.about} | {momentum} | {skip} | {graph} |")
    return "\n".join(rows)
