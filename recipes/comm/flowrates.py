"""The step model's per-connection rates: ring allreduce over K unequal TCP connections per hop.

recipes/comm/stepmodel.py gives every flow the same ceiling. On a cloud network it is not so: ECMP hashes each TCP
connection onto one path, paths collide and a neighbour loads one, so the K connections of one hop run at unequal
rates. This module predicts the bandwidth of a ring allreduce over them for three ways of spreading a message over
the connections:

    even     each message split evenly over the K connections (NCCL over its sockets; multistream with a static
             plan): a hop goes at K x its slowest connection
    comm     communicator-level balancing (multistream's `comm.balance`): communicator k is a ring over connection
             k of every hop and goes at its slowest hop; its share of every bucket is proportional to that rate
    hop      hop-level balancing: every hop splits its chunk over its K connections in proportion to their rates
             (a ring of point-to-point sends, as NCCL Fast Socket balances its sockets); a hop goes at the sum

In every case a host's connections together are held to its link cap, and a ring goes at its slowest hop, so the
allreduce of B bytes over H hosts takes 2(H-1)/H x B / rate. `rates[h][k]` is host h's egress on its k-th
connection to its ring neighbour, host h-1: gloo's ring sends to the previous rank. scripts/predict_balance.py holds the
three against the connections a link probe measured (`strategy_rates`); the network lab's uneven networks and its
runs are modelled with these functions in lab/flow_profiles.py.
"""

from __future__ import annotations

import random
import statistics

STRATEGIES = ("even", "comm", "hop")


def ring_mbit(rates: list[list[float]], link_mbit: float, strategy: str) -> float:
    """The allreduce's ring rate (Mbit/s of the 2(H-1)/H x B bytes each host sends) under `strategy`."""
    if strategy == "even":
        return min(min(link_mbit, len(r) * min(r)) for r in rates)
    if strategy == "hop":
        return min(min(link_mbit, sum(r)) for r in rates)
    if strategy == "comm":
        per_comm = [min(r[k] for r in rates) for k in range(len(rates[0]))]
        return min(link_mbit, sum(per_comm))
    raise ValueError(f"strategy: expected one of {', '.join(STRATEGIES)}, got {strategy!r}")


def allreduce_seconds(nbytes: float, hosts: int, rate_mbit: float) -> float:
    """A ring allreduce of `nbytes` over `hosts` at `rate_mbit` (the data part; latency is stepmodel's)."""
    return 2 * (hosts - 1) / hosts * nbytes * 8 / (rate_mbit * 1e6) if hosts > 1 else 0.0


# The user's network (scripts/launcher/netprobe.py measures every connection; scripts/predict.py shows the three
# strategies on it): below this spread, balancing pays enough to name.
UNEVEN = 0.9


def spread(rates: list[float]) -> float:
    """The slowest connection's rate as a fraction of the median connection's (1.0: even)."""
    med = statistics.median(rates)
    return min(rates) / med if med > 0 else 1.0


def spread_hop(flow_spread: float, flows: int, flow: float) -> list[float]:
    """A hop of `flows` connections with one at `flow_spread` x the others' `flow` (the one-slow profile's shape)."""
    return [flow] * (flows - 1) + [flow * flow_spread]


def hier_mbit(rates: list[list[float]], link_mbit: float, local: int) -> float:
    """comm.hierarchy=host: the ring rate of `local` hop-balanced rings at once, one per local rank, each on its own
    connections and 1/local of every bucket; every ring's hops are taken to look like `rates`, and together they
    share the host's link."""
    return min(min(link_mbit, local * sum(r)) for r in rates)


def refusal(*, balance: bool, level: str, hierarchy: str, transport: str) -> str | None:
    """Why multistream stops at start-up with these comm settings on `transport` (the process group's backend: nccl,
    gloo); None where it runs them. The engine raises this text, and the advice (scripts/predict_balance.py, the probe)
    never names a setting it returns a reason for."""
    hop = balance and level == "hop"
    if hierarchy == "host" and not hop:
        return (
            "comm.hierarchy=host runs the hop-balanced ring between hosts: set comm.balance=true and "
            "comm.balance_level=hop, or comm.hierarchy=none"
        )
    if hop and transport != "gloo" and hierarchy != "host":
        return (
            f"comm.balance_level=hop: the hop-balanced ring runs on gloo process groups, not {transport}. On GPU "
            f"hosts set comm.hierarchy=host ({transport} inside the host, the ring on gloo between hosts), or use "
            "comm.balance_level=communicator"
        )
    return None


def strategy_rates(
    hops: list[list[float]], link: float, *, hosts: int, seeds=range(200), local: int | None = None
) -> dict[str, float]:
    """The ring's rate under each of STRATEGIES (units of the inputs) over a ring of `hosts` hosts.

    `hops` with one list per host is the ring itself (hops[h][k]: host h's k-th connection to host h-1). Otherwise
    they are patterns (the hops a probe measured, or one from `spread_hop`): every hop is one of them drawn at random,
    its connections in an order of their own, as ECMP hashes each connection independently; communicator-level
    balancing depends on where each hop's slow connection falls, so every figure is the median over `seeds` draws.
    Given `local` ranks per host, "hier" too: `hier_mbit`'s rings (comm.hierarchy=host; at one rank per host, the hop
    ring on host copies of a GPU's gradients)."""
    names = (*STRATEGIES, "hier") if local else STRATEGIES

    def rates(ring):
        return [ring_mbit(ring, link, s) for s in STRATEGIES] + ([hier_mbit(ring, link, local)] if local else [])

    if len(hops) == hosts:
        return dict(zip(names, rates(hops), strict=True))
    rows = []
    for seed in seeds:
        rng = random.Random(f"strategy/{seed}")
        ring = [rng.sample(r, len(r)) for r in (rng.choice(hops) for _ in range(hosts))]
        rows.append(rates(ring))
    return {s: statistics.median(c) for s, c in zip(names, zip(*rows, strict=True), strict=True)}
