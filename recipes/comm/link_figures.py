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
    source = f"link probe {path} ({where}measured {_printable(doc.get('measured', '?'))})"
    flow_domain = domains["flow_gbit"]
    test = [domain_rule(d)[0] for d in flow_domain.split()]
    rate = (
        lambda x: type(x) in (int, float) and math.isfinite(x) and all(t(x) for t in test),
        domain_text(flow_domain),
    )
    return LinkFigures(link, flow, lat, source, _probe_connections(doc, path, rate, domains["streams"]))


def _printable(value) -> str:
    """The probe's `measured` time as text for a terminal: escapes and control characters shown, never sent (a
    planted file's escapes would drive the terminal), bounded."""
    text = value if isinstance(value, str) else repr(value)
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:80])
    return text if len(text) <= 40 else text[:37] + "..."


MAX_PROBE_PAIRS = 10_000  # every pair of 141 hosts; the probe file itself is at most 1 MiB


def _probe_connections(doc: dict, path: Path, rate, streams_domain: str) -> tuple[tuple[float, ...], ...]:
    """Each pair's per-connection rates, both directions (netprobe's `connections_gbit`), where the probe wrote them:
    `pairs` a list of objects, each direction a list of the same length for every pair (the probe measures the same
    K communicators on each), K in comm.streams's domain, each rate in comm.flow_gbit's (`rate`: test, words)."""
    from base.errors import ConfigError
    from recipes.config.schema import domain_rule, domain_text

    def bad(key: str, want: str, got) -> ConfigError:
        shown = repr(got) if len(repr(got)) <= 60 else repr(got)[:57] + "..."
        return ConfigError(f"{path}: {key}: expected {want} (scripts/launch.py --probe-network), got {shown}")

    pairs = doc.get("pairs")
    if pairs is None:
        return ()
    if not isinstance(pairs, list) or len(pairs) > MAX_PROBE_PAIRS:
        raise bad(
            "pairs",
            f"a list of at most {MAX_PROBE_PAIRS:,} host pairs",
            pairs if not isinstance(pairs, list) else f"{len(pairs):,} pairs",
        )
    ok_k = [domain_rule(d)[0] for d in streams_domain.split()]
    out, width = [], None
    for i, p in enumerate(pairs):
        if not isinstance(p, dict):
            raise bad(f"pairs[{i}]", "an object (one host pair)", p)
        got = p.get("connections_gbit")
        if got is None:
            continue
        if not isinstance(got, dict):
            raise bad(f"pairs[{i}].connections_gbit", "an object with a_to_b and b_to_a", got)
        for way in ("a_to_b", "b_to_a"):
            r = got.get(way)
            if not isinstance(r, list) or not r or not all(t(len(r)) for t in ok_k):
                want = f"a list of one rate per communicator (comm.streams's domain: {domain_text(streams_domain)})"
                raise bad(f"connections_gbit.{way}", want, r if not isinstance(r, list) else f"{len(r):,} rates")
            if width is not None and len(r) != width:
                raise bad(f"pairs[{i}].connections_gbit.{way}", f"{width} rates, as every other direction", len(r))
            width = len(r)
            if not all(rate[0](x) for x in r):
                raise bad(f"connections_gbit.{way}", f"Gbit/s in comm.flow_gbit's domain ({rate[1]})", r)
            out.append(tuple(float(x) for x in r))
    return tuple(out)
