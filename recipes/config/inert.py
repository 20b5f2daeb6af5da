"""Keys that do not apply: keys of another part given to a seam's section (optim.*, comm.*, data.*, model.*), which the
chosen part's config does not hold (recipes/config/schema.py `PluginSection.unread`; each part's keys are its config
class, recipes/config/plugins.py).

A value set for such a key changes nothing (sgd has no trust ratio; Lamb has Adam's betas, not optim.momentum; the
synthetic input pipeline reads no folder, DDP no comm.streams): the command line says so in one line per key whose
value is not its default (`inert_settings`), and `--print-config` marks every one (`marked_yaml`).

The same holds for a key of the chosen part that takes effect only with another key's value (comm.balance_level
without comm.balance=true): ONLY_WITH declares each such family once, by its name's prefix.
"""

from __future__ import annotations

import dataclasses

from base import registry
from recipes.config.load import to_yaml
from recipes.config.schema import Config, PluginSection, default_of, knob_fields

# A key whose name starts with the prefix is read only when the key named beside it holds that value: the balancer's
# knobs under comm.balance, the tuner's under comm.autotune (each prefix's own switch aside).
ONLY_WITH: dict[str, tuple[str, object]] = {
    "comm.balance_": ("comm.balance", True),
    "comm.tune_": ("comm.autotune", True),
}


def _value(cfg: Config, dotted: str):
    section, name = dotted.split(".", 1)
    return getattr(getattr(cfg, section), name)


def dependent_inert(cfg: Config) -> dict[str, str]:
    """Every key of a chosen part that its switch turns off here -> what it needs ("comm.balance=true")."""
    out = {}
    for section, part in _sections(cfg).items():
        for f in dataclasses.fields(part.own):
            key = f"{section}.{f.name}"
            for prefix, (switch, needed) in ONLY_WITH.items():
                if key.startswith(prefix) and key != switch and _value(cfg, switch) != needed:
                    shown = str(needed).lower() if isinstance(needed, bool) else needed
                    out[key] = f"{switch}={shown}"
    return out


def _sections(cfg: Config) -> dict[str, PluginSection]:
    return {name: getattr(cfg, name) for name in registry.SEAMS}


def inert_keys(cfg: Config) -> list[str]:
    """The dotted keys given to every seam's section that its chosen part does not read, in the order given."""
    return [f"{name}.{k}" for name, part in _sections(cfg).items() for k in part.unread]


def _readers(section: str, name: str) -> list[str]:
    return [r.name for r in registry.SEAMS[section].records.values() if name in r.reads]


def inert_settings(cfg: Config) -> list[str]:
    """One line per inert key whose value is not its default: set, but not read."""
    out = []
    for section, part in _sections(cfg).items():
        for name, value in part.unread.items():
            if value != default_of(knob_fields(section)[name][0]):
                readers = ", ".join(_readers(section, name)) or "none"
                out.append(
                    f"{section}.{name}={value!r} is not read by {part.choice} (read by {readers}): it changes nothing"
                )
    for key, needs in dependent_inert(cfg).items():
        section, name = key.split(".", 1)
        value = _value(cfg, key)
        if value != default_of(knob_fields(section)[name][0]):
            out.append(f"{key}={value!r} is read only with {needs}, which is off here: it changes nothing")
    return out


def marked_yaml(cfg: Config) -> str:
    """The resolved config as YAML (`to_yaml`), each inert key followed by a comment that says so."""
    inert = set(inert_keys(cfg))
    dependent = dependent_inert(cfg)
    lines, section = [], ""
    for line in to_yaml(cfg).splitlines():
        if line and not line.startswith(" "):
            section = line.split(":", 1)[0]
        elif line.startswith("  ") and not line.startswith("   ") and ":" in line:
            key = f"{section}.{line.strip().split(':', 1)[0]}"
            if key in inert:
                line += f"  # inert: not read by {getattr(cfg, section).choice}"
            elif key in dependent:
                line += f"  # inert: read only with {dependent[key]}"
        lines.append(line)
    return "\n".join(lines) + "\n"
