"""Keys that do not apply: the keys of a seam's section (optim.*, data.*, model.*) that the chosen part does not read,
from its record (base/registry.py `SEAMS`).

A value set for such a key changes nothing (sgd has no trust ratio; Lamb has Adam's betas, not optim.momentum; the
synthetic input pipeline reads no folder, DALI no timm augmentation): the command line says so in one line per key
(`inert_settings`), and `--print-config` marks every inert key (`marked_yaml`).
"""

from __future__ import annotations

import dataclasses

from base import registry
from recipes.config.load import to_yaml
from recipes.config.schema import Config


def _chosen(cfg: Config, section: str):
    """(the section's config, the choosing key's dotted name and value, the chosen record)."""
    seam = registry.SEAMS[section]
    part = getattr(cfg, section)
    name = getattr(part, seam.key)
    return part, f"{section}.{seam.key}={name}", seam.records[name]


def inert_keys(cfg: Config) -> list[str]:
    """The dotted keys of every seam's section that its chosen part does not read, in schema order."""
    out = []
    for section, seam in registry.SEAMS.items():
        part, _, record = _chosen(cfg, section)
        read = set(seam.shared) | set(record.reads)
        out += [f"{section}.{f.name}" for f in dataclasses.fields(part) if f.name not in read]
    return out


def _readers(section: str, name: str) -> list[str]:
    return [r.name for r in registry.SEAMS[section].records.values() if name in r.reads]


def inert_settings(cfg: Config) -> list[str]:
    """One line per inert key whose value is not the default: set, but not read."""
    out = []
    for key in inert_keys(cfg):
        section, name = key.split(".", 1)
        part, chosen, _ = _chosen(cfg, section)
        value = getattr(part, name)
        if value != getattr(type(part)(), name):
            readers = ", ".join(_readers(section, name)) or "none"
            out.append(f"{key}={value!r} is not read by {chosen} (read by {readers}): it changes nothing")
    return out


def marked_yaml(cfg: Config) -> str:
    """The resolved config as YAML (`to_yaml`), each inert key followed by a comment that says so."""
    inert = set(inert_keys(cfg))
    lines, section = [], ""
    for line in to_yaml(cfg).splitlines():
        if line and not line.startswith(" "):
            section = line.split(":", 1)[0]
        elif line.startswith("  ") and not line.startswith("   ") and ":" in line:
            key = f"{section}.{line.strip().split(':', 1)[0]}"
            if key in inert:
                line += f"  # inert: not read by {_chosen(cfg, section)[1]}"
        lines.append(line)
    return "\n".join(lines) + "\n"
