"""Keys that do not apply: keys of another part given to a seam's section (optim.*, comm.*, data.*, model.*), which the
chosen part's config does not hold (recipes/config/schema.py `PluginSection.unread`; each part's keys are its config
class, recipes/config/plugins.py).

A value set for such a key changes nothing (sgd has no trust ratio; Lamb has Adam's betas, not optim.momentum; the
synthetic input pipeline reads no folder, DDP no comm.streams): the command line says so in one line per key whose
value is not its default (`inert_settings`), and `--print-config` marks every one (`marked_yaml`).
"""

from __future__ import annotations

from base import registry
from recipes.config.load import to_yaml
from recipes.config.schema import Config, PluginSection, default_of, knob_fields


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
                line += f"  # inert: not read by {getattr(cfg, section).choice}"
        lines.append(line)
    return "\n".join(lines) + "\n"
