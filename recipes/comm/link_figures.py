"""The link as the models take it: a host's link, the per-flow cap and the latency, from the link probe's file
(`scripts/launch.py --probe-network` writes <run dir>/network.json) or from config keys. The step-time model
(recipes/comm/stepmodel.py), the auto-tuner's model start and scripts/predict.py read it from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LinkFigures:
    """A host's link as the link probe measured it (scripts/launcher/netprobe.py writes <run dir>/network.json)."""

    link_gbit: float  # the slowest host pair's best rate
    flow_gbit: float | None  # one flow's rate when it is well below N flows' (a per-flow cap); None: no cap seen
    latency_us: float  # median one-way latency of a small message
    source: str  # the file, its hosts and when it was measured
    # every measured hop's connections (a pair's each direction, Gbit/s of each connection); () from older probes
    connections_gbit: tuple[tuple[float, ...], ...] = ()


def load_link_figures(path: str | Path) -> LinkFigures:
    """The link probe's figures from `path` (ConfigError with a one-line message naming the file and key)."""
    from base import reader
    from base.errors import ConfigError
    from recipes.config.schema import CommConfig, domain_rule, domain_text, section_fields

    path = Path(path)
    doc = reader.read_json_object(path, what="the link probe's figures", error=ConfigError, max_bytes=1 << 20)
    if "link_gbit" not in doc and isinstance(doc.get("pairs"), list) and not doc["pairs"]:
        raise ConfigError(f"{path}: the probe measured no host pair (one host): no link figures")
    domains = {k: f.metadata["domain"] for k, (f, _) in section_fields(CommConfig).items()}

    def number(key: str, low: float, optional: bool = False) -> float | None:
        """The figure `key`, inside the domain of the comm key of the same name (a link of 1e308 spins the model)."""
        v = doc.get(key)
        if optional and v is None:
            return None
        ok = not isinstance(v, bool) and isinstance(v, (int, float)) and v > low and math.isfinite(v)
        ok = ok and all(domain_rule(d)[0](v) for d in domains[key].split())
        if not ok:
            want = f"a number in comm.{key}'s domain ({domain_text(domains[key])})" + (" or null" if optional else "")
            raise ConfigError(f"{path}: {key}: expected {want} (scripts/launch.py --probe-network), got {v!r}")
        return float(v)

    link, flow, lat = number("link_gbit", 0.0), number("flow_gbit", 0.0, True), number("latency_us", -1e-9)
    hosts = doc.get("hosts")
    where = f"{len(hosts)} hosts, " if isinstance(hosts, list) else ""
    source = f"link probe {path} ({where}measured {doc.get('measured', '?')})"
    return LinkFigures(link, flow, lat, source, _probe_connections(doc, path))


def _probe_connections(doc: dict, path: Path) -> tuple[tuple[float, ...], ...]:
    """Each pair's per-connection rates, both directions (netprobe's `connections_gbit`), where the probe wrote them."""
    from base.errors import ConfigError

    out = []
    for p in doc.get("pairs") or []:
        got = p.get("connections_gbit") if isinstance(p, dict) else None
        if got is None:
            continue
        for way in ("a_to_b", "b_to_a"):
            r = got.get(way) if isinstance(got, dict) else None
            ok = isinstance(r, list) and r and all(type(x) in (int, float) and 0 < x < 1e6 for x in r)
            if not ok:
                raise ConfigError(
                    f"{path}: connections_gbit.{way}: expected a list of Gbit/s above 0 "
                    f"(scripts/launch.py --probe-network), got {r!r}"
                )
            out.append(tuple(float(x) for x in r))
    return tuple(out)
