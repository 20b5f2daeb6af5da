#!/usr/bin/env python
"""One command for a multi-node run: a torchrun agent (or one horovodrun) per job, on every host, checked first and
stopped together.

    python scripts/launch.py --hostfile hosts.txt -c configs/dawnbench_158s.yaml data.root=/data/imagenet
    python scripts/launch.py -c configs/dawnbench_158s.yaml data.root=/data/imagenet      # inside a SLURM allocation
    python scripts/launch.py --hosts localhost --transport local -c configs/dawnbench_8gpu.yaml   # one machine
    python scripts/launch.py --engine horovod --hostfile hosts.txt -c configs/dawnbench_158s.yaml comm.backend=horovod
    python scripts/launch.py ... --dry-run        # print what would run on each host, run nothing

Before starting, every host is asked (through the transport) for the working directory, a Python that imports torch,
the config file and the data directories; any problem stops the launch with the host named. While the job runs,
each host's output is printed with a `[host]` prefix and kept in <run dir>/launch/; the first host whose command
exits non-zero stops all the others (SIGTERM, then SIGKILL) and the launcher exits with that host's code.
`make reproduce-158s`, `make reproduce-8gpu` and `make baseline-horovod` call this.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from launcher.hosts import Host, HostError, parse_host_list, parse_hostfile, slurm_hosts  # noqa: E402
from launcher.job import Job, describe_run_dir, probe_shared_run_dir, run, run_checks  # noqa: E402
from launcher.transports import DEFAULT_SSH, TRANSPORTS, create_transport  # noqa: E402


class LaunchError(ValueError):
    """A launch that cannot start; the message says what to change."""


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="launch.py",
        description=__doc__.split("\n\n")[0],
        epilog="--args-text TEXT: more options in one string, split like shell words (make's LAUNCH_ARGS). "
        "Internal: launch.py guard [--grace S] -- COMMAND (runs on each host).",
    )
    ap.add_argument("-c", "--config", required=True, help="YAML config (the same file on every host)")
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides passed to train.py")
    ap.add_argument(
        "--overrides-text",
        default="",
        metavar="TEXT",
        help="more overrides as one string, applied last (make's OVERRIDES=): a new one starts at each "
        "word that begins with key=, so values may hold spaces",
    )
    where = ap.add_argument_group("hosts (one of; default: the SLURM allocation we run in)")
    where.add_argument("--hostfile", help="one 'host [slots=N] [addr=IP]' per line")
    where.add_argument("--hosts", help="comma-separated host[:slots] list, e.g. node01:8,node02:8 or localhost")
    ap.add_argument(
        "--transport",
        choices=TRANSPORTS,
        help="how commands reach hosts (default: slurm inside an "
        "allocation, else ssh; local = this machine; netns = network namespaces)",
    )
    ap.add_argument(
        "--engine",
        choices=("torchrun", "horovod"),
        default="torchrun",
        help="torchrun: one agent per host (c10d); horovod: horovodrun --gloo on the first host",
    )
    ap.add_argument(
        "--gpus-per-host",
        type=int,
        help="processes per host (default: the host list's slots, else the config's run.procs_per_node)",
    )
    ap.add_argument("--port", type=int, default=29400, help="rendezvous port on the first host")
    ap.add_argument("--run-dir", help="run directory (default: <run.out_dir>/<run.name> of the config)")
    ap.add_argument("--python", help="Python on the hosts (default: this one, relative to the repo when inside)")
    ap.add_argument("--workdir", default=str(REPO), help="this repository's path on the hosts (default: %(default)s)")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="environment for every host")
    ap.add_argument("--iface", help="network interface for gloo/NCCL/Horovod traffic (GLOO/NCCL_SOCKET_IFNAME)")
    ap.add_argument("--ssh", default=DEFAULT_SSH, help="ssh command and options (default: %(default)s)")
    ap.add_argument("--ssh-port", type=int, help="ssh port on the hosts (also passed to horovodrun -p)")
    ap.add_argument(
        "--srun-args", default="", help="extra srun options for the slurm transport (e.g. pyxis' --container-image)"
    )
    ap.add_argument("--horovodrun", help="horovodrun on the first host (default: next to --python)")
    ap.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="torchrun: restart the workers up to N times after a failure (they resume from the "
        "newest checkpoint; set checkpoint.every_steps for mid-epoch recovery)",
    )
    ap.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL when stopping")
    ap.add_argument("--join-timeout", type=float, default=300.0, help="seconds for every host to join the rendezvous")
    ap.add_argument("--check-timeout", type=float, default=120.0, help="seconds for the checks on every host")
    ap.add_argument("--timeout", type=float, help="stop the whole job after this many seconds")
    ap.add_argument("--no-check", action="store_true", help="skip the checks before starting")
    ap.add_argument("--dry-run", action="store_true", help="print the commands for every host and exit")
    return ap


def resolve_hosts(args) -> tuple[list[Host], str]:
    """The host list and the default transport for it."""
    if args.hostfile and args.hosts:
        raise LaunchError("give --hostfile or --hosts, not both")
    if args.hostfile:
        return parse_hostfile(args.hostfile), "ssh"
    if args.hosts:
        return parse_host_list(args.hosts), "ssh"
    hosts = slurm_hosts()
    if hosts is None:
        raise LaunchError("no hosts: give --hostfile FILE or --hosts a,b,... (or run inside a SLURM allocation)")
    return hosts, "slurm"


def _env_pairs(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise LaunchError(f"--env '{item}': expected KEY=VALUE")
        env[key] = value
    return env


def _default_python() -> str:
    exe = Path(sys.executable)
    try:
        return str(exe.relative_to(REPO))  # .venv/bin/python: the same relative path on every host
    except ValueError:
        return str(exe)


def build_job(args) -> tuple[Job, object]:
    """Everything the launch needs, checked here before any host is contacted."""
    from recipes.config import load_config, parse_override, split_overrides

    if not 1 <= args.port <= 65535:
        raise LaunchError(f"--port: expected a TCP port 1..65535, got {args.port}")
    hosts, default_transport = resolve_hosts(args)
    overrides = list(args.overrides) + split_overrides(args.overrides_text)
    cfg = load_config(args.config, overrides)  # the same loader and checks as train.py on every host
    if args.engine == "horovod" and cfg.comm.backend != "horovod":
        if "comm.backend" in [parse_override(o)[0] for o in overrides]:
            given = cfg.comm.backend
            raise LaunchError(f"--engine horovod runs comm.backend=horovod, but comm.backend={given} was given")
        overrides.append("comm.backend=horovod")
        cfg = load_config(args.config, overrides)
    if args.engine == "torchrun" and cfg.comm.backend == "horovod":
        raise LaunchError("comm.backend=horovod runs under horovodrun: add --engine horovod")

    slots = {h.slots for h in hosts if h.slots is not None}
    if args.gpus_per_host is not None:
        procs = args.gpus_per_host
    elif len(slots) > 1:
        raise LaunchError(f"hosts have different slots ({sorted(slots)}): give --gpus-per-host")
    else:
        procs = slots.pop() if slots else cfg.run.procs_per_node
    if procs < 1:
        raise LaunchError(f"--gpus-per-host: expected a positive integer, got {procs}")
    world = len(hosts) * procs
    for i, p in enumerate(cfg.phases):
        if p.batch_size % world:
            raise LaunchError(
                f"phases.{i}.batch_size: {p.batch_size} is not divisible by the world size {world} "
                f"({len(hosts)} host(s) x {procs})"
            )

    data_paths = []
    if cfg.data.backend != "synthetic":
        data_paths = [f"{cfg.data.root}/train", f"{cfg.data.root}/val"]
        data_paths += [f"{path}/train" for path in cfg.data.roots.values()]
        from data import copy_beside  # a phase's copy not in data.roots is read from <data.root>-<name>

        beside = {p.root for p in cfg.phases if p.root != "full" and p.root not in cfg.data.roots}
        data_paths += [f"{copy_beside(cfg.data.root, name)}/train" for name in sorted(beside)]
    return Job(
        hosts=hosts,
        transport=create_transport(args.transport or default_transport, args.ssh, args.ssh_port, args.srun_args),
        config=args.config,
        overrides=overrides,
        run_dir=args.run_dir or f"{cfg.run.out_dir}/{cfg.run.name}",
        procs_per_host=procs,
        engine=args.engine,
        port=args.port,
        workdir=args.workdir,
        python=args.python or _default_python(),
        env=_env_pairs(args.env),
        data_paths=data_paths,
        grace=args.grace,
        join_timeout=args.join_timeout,
        rdzv_id=os.environ.get("SLURM_JOB_ID") or f"{cfg.run.name}-{int(time.time())}",
        iface=args.iface,
        ssh_port=args.ssh_port,
        horovodrun=args.horovodrun,
        max_restarts=args.max_restarts,
    ), cfg


def describe(job: Job, cfg) -> list[str]:
    lines = [
        f"{job.engine} job: {len(job.hosts)} host(s) x {job.procs_per_host} process(es) = {job.world_size}, "
        f"config {job.config}, run directory {job.run_dir}, transport {job.transport.name}",
    ]
    if (cfg.run.nodes, cfg.run.procs_per_node) != (len(job.hosts), job.procs_per_host):
        lines.append(
            f"note: {job.config} is written for {cfg.run.nodes} x {cfg.run.procs_per_node}; the global "
            f"batch sizes stay as configured, so each process takes a larger or smaller share"
        )
    if job.engine == "torchrun":
        lines.append(f"rendezvous: c10d at {job.endpoint} (id {job.rdzv_id}), hosted by {job.hosts[0].name}")
    width = max(len(h.name) for h in job.hosts)
    for host, command in job.commands():
        lines.append(f"[{host.name.ljust(width)}] {shlex.join(job.transport.argv(host, command))}")
    return lines


def expand_args_text(argv: list[str]) -> list[str]:
    """`--args-text TEXT` replaced by the options in TEXT, split as a shell splits words (quotes respected) but
    never run by one: make's LAUNCH_ARGS arrive this way."""
    out: list[str] = []
    it = iter(argv)
    for a in it:
        if a == "--args-text":
            out += shlex.split(next(it, ""))
        elif a.startswith("--args-text="):
            out += shlex.split(a.split("=", 1)[1])
        else:
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["guard"]:
        from launcher.guard import main as guard_main

        return guard_main(argv[1:])
    try:
        argv = expand_args_text(argv)
    except ValueError as e:
        print(f"launch: error: --args-text: {e}", file=sys.stderr)
        return 2
    args = _parser().parse_args(argv)
    sys.path.insert(0, str(REPO))
    from recipes.errors import ConfigError
    from recipes.run import files as run_files

    try:
        job, cfg = build_job(args)
    except (LaunchError, HostError, ConfigError, ValueError) as e:
        print(f"launch: error: {e}", file=sys.stderr)
        return 2
    for line in describe(job, cfg):
        print(f"launch: {line}", flush=True)
    if args.dry_run:
        checks = ", ".join(["the working directory", f"{job.python} imports torch", "the config", *job.data_paths])
        print(f"launch: dry run: nothing started (the checks would ask every host for {checks})")
        return 0
    if not args.no_check:
        print(
            f"launch: checking {len(job.hosts)} host(s): working directory, python, config, data "
            f"({', '.join(job.data_paths) or 'synthetic'})",
            flush=True,
        )
        problems = run_checks(job, args.check_timeout)
        if problems:
            for p in problems:
                print(f"launch: error: {p}", file=sys.stderr)
            print(f"launch: {len(problems)} problem(s) found; nothing was started", file=sys.stderr)
            return 2
    try:
        seen, unseen = probe_shared_run_dir(job, args.check_timeout)
        print(f"launch: {describe_run_dir(job, seen, unseen)}", flush=True)
    except (OSError, subprocess.SubprocessError) as e:
        print(f"launch: could not tell whether run directory {job.run_dir} is shared between hosts: {e}", flush=True)
    run_dir = Path(job.run_dir) if Path(job.run_dir).is_absolute() else REPO / job.run_dir
    rc = run(job, run_dir / run_files.LAUNCH, sys.stdout, args.timeout)
    for name in run_files.RESULTS:
        if rc == 0 and (run_dir / name).is_file():
            print(f"launch: {run_dir / name}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
