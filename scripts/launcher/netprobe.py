"""The link probe: every host pair's bandwidth with one flow and with N flows, through a real gloo process group.

    python -m torch.distributed.run --nnodes H --nproc-per-node 1 ... scripts/launcher/netprobe.py --out F.json

`scripts/launch.py --probe-network` starts it (one process per host). Gloo keeps one TCP connection per pair of
ranks in a process group, so a transfer on one group is one flow, and N groups give N flows. The pairs are
measured one at a time, one direction after the other (each direction of a link has its own capacity), for about
`--seconds` per direction and flow count. Rank 0 prints the matrix, flags the slow pairs and writes the figures as
JSON; `network_overrides()` turns them into the `comm.link_gbit`, `comm.flow_gbit` and `comm.latency_us` that the
auto-tuner's step-time model reads.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

MARK = "netprobe-json:"
SLOW = 0.8  # a pair below this fraction of the median pair is flagged
UNEVEN = 0.5  # a pair whose slowest connection is below this fraction of its median connection is flagged


def _transfer(dist, groups, me: int, peer: int, nbytes: int, sender: int) -> list[float] | None:
    """`sender` sends `nbytes` to the other rank of the pair, split over len(groups) flows; the receiver returns,
    per flow, the seconds until that flow's part has arrived (the sender None). One direction at a time: the other
    direction's acknowledgements then never queue behind data."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    k = len(groups)
    bufs = [torch.zeros(max(1, nbytes // k), dtype=torch.uint8) for _ in range(k)]
    _latency(dist, groups[0], me, peer, first=me < peer, rounds=1)  # start together (within one latency)
    t0 = time.perf_counter()
    if me == sender:
        for w in [dist.isend(b, dst=peer, group=g) for b, g in zip(bufs, groups, strict=True)]:
            w.wait()
        return None
    works = [dist.irecv(b, src=peer, group=g) for b, g in zip(bufs, groups, strict=True)]

    # A gloo receive has no future and is_completed() stays false until wait(): one waiter per flow, so each flow's
    # time is its own and not the time of the flows waited for before it.
    def arrived(w) -> float:
        w.wait()
        return time.perf_counter() - t0

    with ThreadPoolExecutor(max_workers=k, thread_name_prefix="netprobe-wait") as pool:
        return list(pool.map(arrived, works))


def _share(dist, group, me: int, peer: int, *, values: list[float] | None, n: int, src: int) -> list[float]:
    """`src`'s `n` values on both ranks of the pair."""
    import torch

    buf = torch.tensor(values if me == src else [0.0] * n, dtype=torch.float64)
    if me == src:
        dist.send(buf, dst=peer, group=group)
    else:
        dist.recv(buf, src=peer, group=group)
    return buf.tolist()


def _direction(dist, groups, me: int, peer: int, sender: int, seconds: float) -> dict:
    """Gbit/s from `sender` to the other rank with one flow and with len(groups) flows (in all and each flow's own),
    known to both ranks."""
    receiver = peer if me == sender else me

    def rate(flows, nbytes: int) -> tuple[float, list[float]]:  # bytes/s seen by the receiver: in all, per flow
        t = _transfer(dist, flows, me, peer, nbytes, sender)
        part = max(1, nbytes // len(flows))  # each flow's bytes
        mine = None if t is None else [nbytes / max(max(t), 1e-9)] + [part / max(x, 1e-9) for x in t]
        got = _share(dist, groups[0], me, peer, values=mine, n=1 + len(flows), src=receiver)
        return got[0], got[1:]

    def size(bytes_per_s: float) -> int:  # about `seconds` of traffic, 1 MiB to 4 GiB
        return int(min(max(bytes_per_s * seconds, 1 << 20), 4 << 30))

    first, _ = rate(groups[:1], 4 << 20)  # a short transfer sizes the measured ones
    one, _ = rate(groups[:1], size(first))
    many, each = rate(groups, size(max(first, one)))
    return {"one_flow_gbit": one * 8 / 1e9, "n_flows_gbit": many * 8 / 1e9, "each_gbit": [x * 8 / 1e9 for x in each]}


def _latency(dist, group, me: int, peer: int, first: bool, rounds: int = 20) -> float:
    """Median one-way latency (half a ping-pong of 4 bytes) in seconds."""
    import torch

    buf = torch.zeros(1, dtype=torch.int32)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        if first:
            dist.send(buf, dst=peer, group=group)
            dist.recv(buf, src=peer, group=group)
        else:
            dist.recv(buf, src=peer, group=group)
            dist.send(buf, dst=peer, group=group)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / 2


def measure(seconds: float, flows: int) -> dict | None:
    """Run on every rank (one per host) inside an initialized process group; rank 0 gets the figures."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    name = os.environ.get("DAWNBENCH_LAUNCH_HOST") or os.uname().nodename
    names: list = [None] * world
    dist.all_gather_object(names, name)
    # One group per flow, all ranks in each (every rank calls new_group in the same order); a send between two
    # ranks of a group uses that group's one connection between them.
    groups = [dist.group.WORLD] + [dist.new_group(backend="gloo") for _ in range(flows - 1)]
    pairs = []
    for a in range(world):
        for b in range(a + 1, world):
            row = {"a": names[a], "b": names[b], "ranks": [a, b]}
            if rank in (a, b):
                peer = b if rank == a else a
                a_to_b = _direction(dist, groups, rank, peer, a, seconds)
                b_to_a = _direction(dist, groups, rank, peer, b, seconds)
                lat = _latency(dist, groups[0], rank, peer, first=rank == a)
                mine = {"a_to_b": a_to_b, "b_to_a": b_to_a, "latency_us": lat * 1e6} if rank == a else None
            else:
                mine = None  # the others wait: one pair at a time, so no two measurements share a link
            both: list = [None] * world
            dist.all_gather_object(both, mine, group=groups[0])
            got = both[a]
            keys = ("one_flow_gbit", "n_flows_gbit")
            row.update(
                a_to_b={k: round(got["a_to_b"][k], 4) for k in keys},
                b_to_a={k: round(got["b_to_a"][k], 4) for k in keys},
                **{k: round(min(got["a_to_b"][k], got["b_to_a"][k]), 4) for k in keys},
                latency_us=round(got["latency_us"], 1),
                connections_gbit={d: [round(x, 4) for x in got[d]["each_gbit"]] for d in ("a_to_b", "b_to_a")},
            )
            pairs.append(row)
    dist.barrier()
    if rank != 0:
        return None
    return summarize(names, pairs, flows, seconds)


def summarize(hosts: list[str], pairs: list[dict], flows: int, seconds: float) -> dict:
    """The figures: every pair, the slow ones flagged, and the cluster's figures for the step-time model."""
    best = [max(p["one_flow_gbit"], p["n_flows_gbit"]) for p in pairs]
    median = statistics.median(best) if best else 0.0
    for p, b in zip(pairs, best, strict=True):
        p["gbit"] = round(b, 4)
        p["slow"] = len(pairs) > 1 and b < SLOW * median
        if p.get("connections_gbit"):  # the worse direction's spread: a ring uses one direction of every pair
            p["flow_spread"] = round(min(spread(x) for x in p["connections_gbit"].values()), 4)
            p["uneven"] = p["flow_spread"] < UNEVEN
    out = {
        "hosts": hosts,
        "flows": flows,
        "seconds": seconds,
        "measured": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "pairs": pairs,
        "slow_pairs": [[p["a"], p["b"]] for p in pairs if p["slow"]],
    }
    spreads = [p["flow_spread"] for p in pairs if "flow_spread" in p]
    if spreads:
        out.update(flow_spread=min(spreads), uneven_pairs=[[p["a"], p["b"]] for p in pairs if p.get("uneven")])
    if pairs:
        slowest = min(pairs, key=lambda p: p["gbit"])
        link = slowest["gbit"]
        one = statistics.median(p["one_flow_gbit"] for p in pairs)
        many = statistics.median(p["n_flows_gbit"] for p in pairs)
        # The link figure is the slowest pair's (a ring allreduce runs at its slowest link's pace); a per-flow cap
        # shows as the typical pair's one flow well below its N flows, and without one the model takes none.
        out.update(
            link_gbit=round(link, 4),
            flow_gbit=round(one, 4) if one < 0.9 * many else None,
            latency_us=round(statistics.median(p["latency_us"] for p in pairs), 1),
            slowest=[slowest["a"], slowest["b"]],
        )
    return out


def spread(rates: list[float]) -> float:
    """The slowest connection's rate over the median one's (recipes/comm/flowrates.py's spread; this file runs on
    every host as a script, without the repository on its path)."""
    med = statistics.median(rates)
    return min(rates) / med if med > 0 else 1.0


def _fmt(gbit: float) -> str:
    return f"{gbit:.2f}G" if gbit >= 1 else f"{gbit * 1000:.0f}M"


def matrix(figures: dict) -> list[str]:
    """The pair matrix as text lines: `1 flow / N flows` per cell, in bit/s, slow pairs marked with '!'."""
    hosts = figures["hosts"]
    cell = {}
    for p in figures["pairs"]:
        text = f"{_fmt(p['one_flow_gbit'])}/{_fmt(p['n_flows_gbit'])}{' !' if p['slow'] else ''}"
        i, j = p["ranks"]
        cell[i, j] = cell[j, i] = text
    width = max([len(h) for h in hosts] + [len(c) for c in cell.values()] + [1])
    lines = [" ".join(["".ljust(width)] + [h.rjust(width) for h in hosts])]
    for i, a in enumerate(hosts):
        lines.append(" ".join([a.ljust(width)] + [cell.get((i, j), "-").rjust(width) for j in range(len(hosts))]))
    lines.append(f"(bit/s with 1 flow / {figures['flows']} flows, each direction's minimum; '!' = slow pair)")
    for a, b in figures["slow_pairs"]:
        p = next(p for p in figures["pairs"] if (p["a"], p["b"]) == (a, b))
        lines.append(f"slow pair: {a} <-> {b}: {_fmt(p['gbit'])}bit/s, below {SLOW:.0%} of the median pair")
    lines += connection_lines(figures)
    if "link_gbit" in figures:
        flow = figures["flow_gbit"]
        lines.append(
            f"for the step-time model: comm.link_gbit={figures['link_gbit']:g} comm.flow_gbit="
            f"{'null' if flow is None else f'{flow:g}'} comm.latency_us={figures['latency_us']:g}"
        )
    return lines


def connection_lines(figures: dict) -> list[str]:
    """One line per pair measured connection by connection: each connection's rate per direction, the spread, and
    the pair flagged when its slowest connection is below UNEVEN of its median one."""
    lines = []
    for p in figures["pairs"]:
        if "flow_spread" not in p:
            continue
        a, b = p["a"], p["b"]
        ways = [(f"{a} -> {b}", p["connections_gbit"]["a_to_b"]), (f"{b} -> {a}", p["connections_gbit"]["b_to_a"])]
        text = "; ".join(f"{w}: {' '.join(_fmt(x) for x in r)} (spread {spread(r):.2f})" for w, r in ways)
        flag = f"  uneven: balancing pays ({a} <-> {b})" if p["uneven"] else ""
        lines.append(f"connections {text}{flag}")
    if lines:
        lines.append(
            f"(bit/s of each of the {figures['flows']} connections while all ran; spread = slowest / median "
            f"connection; below {UNEVEN:g}, balancing pays: scripts/predict.py --network <this file> shows how much)"
        )
    return lines


def network_overrides(figures: dict) -> list[str]:
    """The config overrides that hand the measured figures to the auto-tuner's step-time model."""
    flow = figures.get("flow_gbit")
    return [
        f"comm.link_gbit={figures['link_gbit']:g}",
        f"comm.flow_gbit={'null' if flow is None else f'{flow:g}'}",
        f"comm.latency_us={figures['latency_us']:g}",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--flows", type=int, default=4)
    ap.add_argument("--out", help="JSON file rank 0 writes")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds for any one collective")
    args = ap.parse_args(argv)
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    try:
        figures = measure(args.seconds, args.flows)
    finally:
        dist.destroy_process_group()
    if figures is None:
        return 0
    for line in matrix(figures):
        print(f"netprobe: {line}", flush=True)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        # a temp file (never through a link: O_NOFOLLOW | O_EXCL) renamed over the name: old or new, never half
        tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
        tmp.unlink(missing_ok=True)
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "w") as f:
            f.write(json.dumps(figures, indent=1) + "\n")
        tmp.replace(out)
    print(MARK, json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
