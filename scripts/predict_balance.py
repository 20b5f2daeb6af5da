"""The balance advice of scripts/predict.py: even striping against multistream's balancers on this network.

Given the connections a link probe measured (or `--flow-spread`'s made-up uneven one), the ring rate and allreduce
time of each strategy (recipes/comm/flowrates.py), whether the engine would run it on this config's transport, and
which one to use. A strategy the engine refuses at start-up (flowrates.refusal) is never advised.
"""

from __future__ import annotations

from base import registry
from recipes import timemodel as tm

STRATEGY_ROWS = (  # flowrates.STRATEGIES and the hierarchy: how each is asked for
    ("even", "even striping (as NCCL and DDP do)", "comm.balance=false"),
    ("comm", "communicator-level balancing", "comm.balance=true"),
    ("hop", "hop-level balancing", "comm.balance=true comm.balance_level=hop"),
    (
        "hier",
        "hierarchical: inside the host, then a hop-balanced ring per local rank",
        "comm.balance=true comm.balance_level=hop comm.hierarchy=host",
    ),
)


def transport(cfg) -> str:
    """The process group multistream runs on for this config: dist.backend, or auto's choice (NCCL wherever there
    are GPUs, which is what this tool models unless run.device=cpu)."""
    if cfg.dist.backend != "auto":
        return cfg.dist.backend
    return "gloo" if cfg.run.device == "cpu" else "nccl"


def refused(key: str, on: str) -> str | None:
    """Why the engine would stop at start-up with strategy `key` on transport `on` (flowrates.refusal)."""
    from recipes.comm import flowrates

    how = dict((k, h) for k, _, h in STRATEGY_ROWS)[key]
    over = dict(kv.split("=", 1) for kv in how.split())
    return flowrates.refusal(
        balance=over.get("comm.balance") == "true",
        level=over.get("comm.balance_level", "communicator"),
        hierarchy=over.get("comm.hierarchy", "none"),
        transport=on,
    )


def _balancer(cfg):
    """cfg.comm as the backend that reads comm.balance (its record) would read it, whichever backend is chosen."""
    return cfg.comm.as_part(next(n for n, r in registry.ALLREDUCE_BACKENDS.items() if "balance" in r.reads))


def balance_lines(cfg, cluster: tm.Cluster, figures, flow_spread: float | None, grad_bytes: int) -> list[str]:
    """Even striping against balancing on this network: a table when its connections are uneven (the probe's spread
    below flowrates.UNEVEN) or --flow-spread asks; one line for a probe that found them even; nothing otherwise."""
    from recipes.comm import flowrates

    if flow_spread is not None:
        k = _balancer(cfg).streams
        flow = cluster.flow_gbit or cluster.link_gbit / k
        hops = [flowrates.spread_hop(flow_spread, k, flow)]
        where = f"--flow-spread {flow_spread:g}: one of comm.streams={k} connections per hop at that share of {flow:g}"
    elif figures.connections_gbit:
        hops = [list(r) for r in figures.connections_gbit]
        where = f"measured by the link probe on {len(hops)} hops: each pair, each direction"
    else:
        return []
    spread = min(flowrates.spread(r) for r in hops)
    if flow_spread is None and spread >= flowrates.UNEVEN:
        return [
            "",
            f"connections: even (slowest / median connection {spread:.2f} at the worst measured hop): even striping "
            "(NCCL, DDP) loses nothing to comm.balance here",
        ]
    if cluster.hosts < 2:
        return []
    rates = flowrates.strategy_rates(hops, cluster.link_gbit, hosts=cluster.hosts, local=cluster.gpus_per_host)
    on = transport(cfg)
    compression = _balancer(cfg).compression
    wire = grad_bytes // 2 if compression in ("fp16", "bf16") else grad_bytes
    lines = [
        "",
        f"Uneven connections: the slowest at {spread:.2f} of the median ({where}); a ring allreduce of "
        f"{wire / 1e6:.1f} MB (the gradients, comm.compression={compression}) over {cluster.hosts} hosts, "
        f"link {cluster.link_gbit:g} Gbit/s (recipes/comm/flowrates.py; data time, no latency or goodput).",
        "",
        f"| strategy | config | ring Gbit/s | allreduce ms | vs even | runs on {on} |",
        "|---|---|---:|---:|---:|---|",
    ]
    for key, name, how in STRATEGY_ROWS:
        ms = 1e3 * flowrates.allreduce_seconds(wire, cluster.hosts, rates[key] * 1e3)
        runs = "yes" if refused(key, on) is None else "no: refused at start-up"
        lines.append(f"| {name} | `{how}` | {rates[key]:.1f} | {ms:.1f} | {rates[key] / rates['even']:.2f}x | {runs} |")
    # the rings cost more launches than communicator-level balancing: one is chosen only where it is clearly faster,
    # and never one that the engine refuses on this config's transport
    best = "comm"
    for key in ("hop", "hier"):
        if key in rates and refused(key, on) is None and rates[key] > 1.05 * rates[best]:
            best = key
    if rates[best] < 1.05 * rates["even"]:
        lines.append("use: even striping; balancing gains under 5% on this network")
        return lines
    how = dict((k, h) for k, _, h in STRATEGY_ROWS)[best]
    lines.append(f"use: {how} ({rates[best] / rates['even']:.2f}x even striping's rate)")
    if best == "hier":
        from recipes.comm.stepmodel import hierarchical_seconds

        net = cluster.network()
        hier = hierarchical_seconds(wire, net, rates["hier"] * 1e3)
        even = hierarchical_seconds(wire, net, rates["even"] * 1e3)
        lines.append(
            f"  predicted allreduce of one step's gradients: {1e3 * hier:.1f} ms against even striping's "
            f"{1e3 * even:.1f} ms, with the reduce-scatter and all-gather inside each host at "
            f"{cluster.intra_gbyte:g} GB/s (recipes/comm/stepmodel.py hierarchical_seconds; data time)"
        )
    return lines
