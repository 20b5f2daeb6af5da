"""The network lab's uneven networks, as the flow model (recipes/comm/flowrates.py) sees them.

`PROFILES` names the uneven networks the lab builds (lab/netlab_flows.py pins each connection to the leaf
`leaf_for` draws, so the lab and the model draw the same network for a seed), `ring_rates` is a ring's connections
under one, and `predict` / `prediction_table` give even striping against communicator- and hop-level balancing over
many draws (docs/allreduce.md's table). `strategy_of` says which strategy a lab method's overrides run.

DDP over K gloo devices is none of the three strategies: each bucket runs whole as a ring over one device's
connections, so its step depends on which connections the buckets landed on. `rings_of` reads that from a lab record
and `concurrent_seconds` runs those rings at once (the end of this module).
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from recipes.comm.flowrates import ring_mbit

PROFILES = ("even", "one-slow", "collide", "random")
SLOW = 1 / 3  # one-slow: the slow connection's share of the per-flow cap
RANDOM_RANGE = (0.2, 1.0)  # random: a connection's ceiling as a fraction of the per-flow cap


@dataclass(frozen=True)
class Leaf:
    """Where one connection goes: a leaf slot among the host's leaves to that peer, and that leaf's ceiling."""

    slot: int  # connections to one peer with the same slot share one leaf (collide)
    ceil_mbit: float


def leaf_for(profile: str, *, seed: int, host: int, peer: int, k: int, flows: int, flow_mbit: float) -> Leaf:
    """Connection k (of `flows`) from `host` to `peer` under `profile`: its leaf slot and ceiling (a pure function,
    so the lab and the model draw the same network for a seed)."""
    if profile not in PROFILES:
        raise ValueError(f"flow profile: expected one of {', '.join(PROFILES)}, got {profile!r}")
    if not 0 <= k < flows:
        raise ValueError(f"connection index {k} outside 0..{flows - 1}")
    if profile == "even":
        return Leaf(k, flow_mbit)
    if profile == "collide":
        return Leaf(k // 2, flow_mbit)
    if profile == "one-slow":
        slow = random.Random(f"one-slow/{seed}/{host}/{peer}").randrange(flows)
        return Leaf(k, flow_mbit * (SLOW if k == slow else 1.0))
    lo, hi = RANDOM_RANGE
    return Leaf(k, flow_mbit * random.Random(f"random/{seed}/{host}/{peer}/{k}").uniform(lo, hi))


def ring_rates(profile: str, seed: int, hosts: int, flows: int, flow_mbit: float) -> list[list[float]]:
    """rates[h][k]: what host h's k-th connection to its ring neighbour can carry alone (collide: the connections
    sharing a leaf split its ceiling)."""
    out = []
    for h in range(hosts):
        peer = (h - 1) % hosts
        leaves = [
            leaf_for(profile, seed=seed, host=h, peer=peer, k=k, flows=flows, flow_mbit=flow_mbit) for k in range(flows)
        ]
        sharing = {s: sum(1 for x in leaves if x.slot == s) for s in {x.slot for x in leaves}}
        out.append([x.ceil_mbit / sharing[x.slot] for x in leaves])
    return out


@dataclass(frozen=True)
class Prediction:
    hosts: int
    profile: str
    flow_sum: float  # the flows' sum at a hop, capped by the link, as a fraction of the link (median over seeds)
    even: float  # even striping's ring rate as a fraction of the link (median)
    comm: float  # communicator-level balancing: speed-up over even striping (median)
    comm_worst: float  # its lowest over the seeds
    hop: float  # hop-level balancing: speed-up over even striping (median)
    hop_worst: float


def predict(
    profile: str, hosts: int, *, flows: int = 4, link_mbit: float = 40.0, flow_mbit: float = 40 / 3, seeds=range(200)
) -> Prediction:
    """Even striping against communicator- and hop-level balancing, over `seeds` draws of the profile."""
    rows = []
    for s in seeds:
        r = ring_rates(profile, s, hosts, flows, flow_mbit)
        e = ring_mbit(r, link_mbit, "even")
        flow_sum = min(min(link_mbit, sum(x)) for x in r)
        rows.append((flow_sum, e, ring_mbit(r, link_mbit, "comm") / e, ring_mbit(r, link_mbit, "hop") / e))
    med = [statistics.median(c) for c in zip(*rows, strict=True)]
    return Prediction(
        hosts,
        profile,
        med[0] / link_mbit,
        med[1] / link_mbit,
        med[2],
        min(x[2] for x in rows),
        med[3],
        min(x[3] for x in rows),
    )


def prediction_table(hosts=(2, 4, 8, 16, 32, 64, 128), profiles=("one-slow", "random"), **kw) -> list[str]:
    """Markdown rows of `predict` for every host count and profile."""
    lines = [
        "| hosts | profile | flows' sum, % of link | even striping, % of link | comm-level balancing vs even "
        "(median, worst) | hop-level balancing vs even (median, worst) |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for p in profiles:
        for h in hosts:
            x = predict(p, h, **kw)
            lines.append(
                f"| {h} | {p} | {100 * x.flow_sum:.0f}% | {100 * x.even:.0f}% | {x.comm:.2f}x ({x.comm_worst:.2f}x) "
                f"| {x.hop:.2f}x ({x.hop_worst:.2f}x) |"
            )
    return lines


def strategy_of(overrides) -> str:
    """Which of STRATEGIES a lab method's config overrides run: the hop ring under comm.balance_level=hop,
    communicator-level balancing under comm.balance=true, else even striping (DDP over K devices, a static plan)."""
    over = dict(o.split("=", 1) for o in overrides)
    if over.get("comm.balance", "false") == "false":
        return "even"
    if over.get("comm.balance_level") != "hop":
        return "comm"
    return "hier" if over.get("comm.hierarchy") == "host" else "hop"


# -- Collectives that each run whole on one set of connections (DDP over K gloo devices) ----------------------
# ProcessGroupGloo hands each collective to one of its devices in turn and has two worker threads per device, so
# DDP's buckets (4 in the lab) travel at once, each as a ring over one device's connections: the step lasts about as
# long as the slowest of those rings, which depends on where each connection landed, not only on the profile's draws.


@dataclass(frozen=True)
class Ring:
    """One collective's ring: the bytes each hop carries per step, and each hop's (sending host, ceiling Mbit/s)."""

    nbytes: float
    hops: tuple[tuple[int, float], ...]


def rings_of(connections: list[list[list]], *, tolerance: float = 0.01) -> list[Ring]:
    """The rings in a lab record's connections (bench_allreduce --profile: per host, [local port, peer, peer port,
    ceiling Mbit/s, bytes sent per step] of one contender's connections). A connection that carried more than 1% of
    the busiest one's bytes is a hop of some ring; the hops of one ring carry the same bytes (its bucket's share), so
    hops are grouped by their bytes, within `tolerance`. ValueError unless every group has one hop per host: two
    buckets of equal size would leave the rings ambiguous."""
    hosts = len(connections)
    for h, cs in enumerate(connections):
        for c in cs:
            if not isinstance(c[3], (int, float)) or c[3] <= 0:
                raise ValueError(
                    f"connections: host {h}'s connection {c[:3]} has ceiling {c[3]!r}, expected Mbit/s > 0"
                )
    busy = [(h, float(c[3]), float(c[4])) for h, cs in enumerate(connections) for c in cs]
    top = max((b for *_, b in busy), default=0.0)
    hops = sorted((b, h, ceil) for h, ceil, b in busy if b > 0.01 * top)
    groups: list[list[tuple[float, int, float]]] = []
    for hop in hops:
        if groups and hop[0] <= groups[-1][0][0] * (1 + tolerance):
            groups[-1].append(hop)
        else:
            groups.append([hop])
    for g in groups:
        if sorted(h for _, h, _ in g) != list(range(hosts)):
            raise ValueError(
                f"connections: a ring of {len(g)} hops carrying {g[0][0]:.0f} bytes per step, expected one hop from "
                f"each of {hosts} hosts (buckets of equal size cannot be told apart)"
            )
    return [Ring(statistics.mean(b for b, _, _ in g), tuple((h, ceil) for _, h, ceil in g)) for g in groups]


def hop_rings(
    profile: str, seed: int, *, hosts: int, local: int, flows: int, flow_mbit: float, nbytes: float, hierarchy: bool
) -> list[Ring]:
    """The hop-balanced rings of a lab run whose hosts run `local` ranks each (bench_allreduce --local-ranks), as
    `concurrent_seconds` takes them. Each pair of ranks on different hosts has its own K draws of the profile
    (netlab_flows.pins_for with ranks for hosts); a ring's hop between hosts goes at the sum of its sending rank's K
    connections to its left neighbour (what the balancer aims at), and hops inside a host (loopback) are left out.

    `hierarchy` (comm.hierarchy=host): one ring per local rank l, its members local rank l of every host, each on
    1/local of the bytes, all at once and sharing each host's link. Otherwise one ring of all hosts x local ranks,
    whose only hop out of host h goes from its local rank 0 to host h-1's last local rank."""

    def hop(rank: int, left: int) -> float:
        leaves = [
            leaf_for(profile, seed=seed, host=rank, peer=left, k=k, flows=flows, flow_mbit=flow_mbit)
            for k in range(flows)
        ]
        sharing = {s: sum(1 for x in leaves if x.slot == s) for s in {x.slot for x in leaves}}
        return sum(x.ceil_mbit / sharing[x.slot] for x in leaves)

    if hierarchy:
        per_ring = 2 * (hosts - 1) / hosts * nbytes / local
        return [
            Ring(per_ring, tuple((h, hop(h * local + lr, (h - 1) % hosts * local + lr)) for h in range(hosts)))
            for lr in range(local)
        ]
    w = hosts * local
    return [Ring(2 * (w - 1) / w * nbytes, tuple((h, hop(h * local, (h * local - 1) % w)) for h in range(hosts)))]


def concurrent_seconds(rings: list[Ring], link_mbit: float) -> float:
    """How long `rings` take when they all start at once: each ring goes at one rate, at most its slowest hop's
    ceiling, and a host's hops together stay within its link; rates are max-min fair (raised together until a hop or
    a link is full, as TCP shares a bottleneck), and re-shared whenever a ring finishes."""
    if link_mbit <= 0 or any(c <= 0 for r in rings for _, c in r.hops):
        raise ValueError(f"concurrent_seconds: link {link_mbit!r} Mbit/s and every hop's ceiling must be > 0")
    left = {j: r.nbytes * 8 / 1e6 for j, r in enumerate(rings)}  # Mbit still to send, per hop
    t = 0.0
    while left:
        rate = dict.fromkeys(left, 0.0)
        free = set(left)
        hosts = {h for j in left for h, _ in rings[j].hops}
        users = {h: [j for j in left if any(x == h for x, _ in rings[j].hops)] for h in hosts}
        while free:
            room = [min(c for _, c in rings[j].hops) - rate[j] for j in free]  # each ring's own ceiling
            link_room = {
                h: (link_mbit - sum(rate[j] for j in us)) / sum(1 for j in us if j in free)
                for h, us in users.items()
                if any(j in free for j in us)
            }
            step = max(0.0, min([*room, *link_room.values()]))
            for j in free:
                rate[j] += step
            full = {j for j in free if min(c for _, c in rings[j].hops) - rate[j] <= 1e-9}
            full |= {j for h, us in users.items() if link_mbit - sum(rate[j] for j in us) <= 1e-9 for j in us}
            free -= full
        dt = min(left[j] / rate[j] for j in left)
        t += dt
        for j in list(left):
            left[j] -= rate[j] * dt
            if left[j] <= 1e-9 * (1 + rate[j]):
                del left[j]
    return t
