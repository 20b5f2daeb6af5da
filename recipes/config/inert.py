"""Keys that do not apply: the optim.* keys the chosen optimizer does not read, from its record (recipes/registry.py).

A value set for such a key changes nothing (sgd has no trust ratio; Lamb has Adam's betas, not optim.momentum): the
command line says so in one line per key (`inert_settings`), and `--print-config` marks every inert key
(`marked_yaml`).
"""

from __future__ import annotations

import dataclasses

from recipes import registry
from recipes.config.load import to_yaml
from recipes.config.schema import Config, OptimConfig


def inert_keys(cfg: Config) -> list[str]:
    """The dotted optim.* keys that `cfg.optim.name` does not read, in schema order."""
    read = set(registry.OPTIM_SHARED_KEYS) | set(registry.OPTIMIZERS[cfg.optim.name].reads)
    return [f"optim.{f.name}" for f in dataclasses.fields(OptimConfig) if f.name not in read]


def _readers(key: str) -> list[str]:
    return [r.name for r in registry.OPTIMIZERS.values() if key.split(".", 1)[1] in r.reads]


def inert_settings(cfg: Config) -> list[str]:
    """One line per inert key whose value is not the default: set, but not read."""
    default = OptimConfig()
    out = []
    for key in inert_keys(cfg):
        name = key.split(".", 1)[1]
        value = getattr(cfg.optim, name)
        if value != getattr(default, name):
            out.append(
                f"{key}={value!r} is not read by optim.name={cfg.optim.name} (read by {', '.join(_readers(key))}): "
                "it changes nothing"
            )
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
                line += f"  # inert: not read by optim.name={cfg.optim.name}"
        lines.append(line)
    return "\n".join(lines) + "\n"
