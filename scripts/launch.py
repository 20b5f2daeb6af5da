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
import dataclasses
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(1, str(REPO))  # launcher/job.py takes the exit codes from recipes/exit_codes.py

from launcher.checks import describe_run_dir, exit_code, probe_shared_run_dir, run_checks, run_preflight  # noqa: E402
from launcher.failures import RERUN_ENV  # noqa: E402
from launcher.guard import GRACE_S  # noqa: E402
from launcher.hosts import Host, HostError, parse_host_list, parse_hostfile, slurm_hosts  # noqa: E402
from launcher.job import Job, run  # noqa: E402
from launcher.linkprobe import network_figures, probe_job, wants_probe  # noqa: E402
from launcher.netprobe import network_overrides  # noqa: E402
from launcher.transports import DEFAULT_SSH, TRANSPORTS, create_transport  # noqa: E402

# --engine -> the launcher it is (registry.Allreduce.launcher: what starts a backend's ranks)
ENGINE_LAUNCHERS = {"torchrun": "torchrun", "horovod": "horovodrun"}


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
        choices=ENGINE_LAUNCHERS,
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
    ap.add_argument(
        "--grace",
        type=float,
        default=GRACE_S,
        help="seconds between SIGTERM and SIGKILL when stopping: time for every rank to finish its step and write "
        "its checkpoint (the SLURM script's DAWNBENCH_GRACE) (default: %(default)g s)",
    )
    ap.add_argument("--join-timeout", type=float, default=300.0, help="seconds for every host to join the rendezvous")
    ap.add_argument("--check-timeout", type=float, default=120.0, help="seconds for the checks on every host")
    ap.add_argument("--timeout", type=float, help="stop the whole job after this many seconds")
    ap.add_argument("--no-check", action="store_true", help="skip the checks and the pre-flight before starting")
    ap.add_argument(
        "--provider", help="cloud provider, recorded with the run (default: read from its metadata service)"
    )
    ap.add_argument("--instance-type", help="the machines' instance type, recorded with the run (e.g. p4d.24xlarge)")
    probe = ap.add_argument_group("link probe (scripts/launcher/netprobe.py)")
    probe.add_argument(
        "--probe-network",
        action="store_true",
        help="measure every host pair's bandwidth (1 and N flows) through a gloo process group, print the matrix, "
        "write <run dir>/network.json and exit; an auto-tuned run (comm.autotune with tune_start=model) probes "
        "first by itself and trains with the measured figures",
    )
    probe.add_argument("--probe-seconds", type=float, default=1.0, help="traffic per pair and flow count (seconds)")
    probe.add_argument("--probe-flows", type=int, default=4, help="N: parallel flows of the second measurement")
    probe.add_argument("--no-probe", action="store_true", help="an auto-tuned run keeps the config's link figures")
    ap.add_argument("--dry-run", action="store_true", help="print the commands for every host and exit")
    ap.add_argument(
        "--plan",
        action="store_true",
        help="--dry-run, plus every start-up check that would stop the run (the entry's author, the dataset, the "
        "blacklist, the pre-resized copies; the data as this host sees it), listed at once",
    )
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


def _check_numbers(args) -> None:
    if not 1 <= args.port <= 65535:
        raise LaunchError(f"--port: expected a TCP port 1..65535, got {args.port}")
    for name in ("grace", "join_timeout", "check_timeout", "timeout", "probe_seconds"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise LaunchError(f"--{name.replace('_', '-')}: expected a finite number of seconds >= 0, got {value}")
    if args.probe_flows < 1:
        raise LaunchError(f"--probe-flows: expected a positive integer, got {args.probe_flows}")


def build_job(args) -> tuple[Job, object]:
    """Everything the launch needs, checked here before any host is contacted."""
    from base import registry
    from recipes.config import load_config, parse_override, split_overrides
    from recipes.dawnbench import missing_required

    _check_numbers(args)
    hosts, default_transport = resolve_hosts(args)
    overrides = list(args.overrides) + split_overrides(args.overrides_text)
    cfg = load_config(args.config, overrides)  # the same loader and checks as train.py on every host
    # The backend's record names what starts its ranks; --engine horovod alone picks the backend horovodrun runs.
    launcher = registry.ALLREDUCE_BACKENDS[cfg.comm.backend].launcher
    if launcher != ENGINE_LAUNCHERS[args.engine]:
        theirs = [n for n, r in registry.ALLREDUCE_BACKENDS.items() if r.launcher == ENGINE_LAUNCHERS[args.engine]]
        if args.engine == "torchrun" or len(theirs) != 1:
            engine = next(e for e, name in ENGINE_LAUNCHERS.items() if name == launcher)
            raise LaunchError(f"comm.backend={cfg.comm.backend} runs under {launcher}: add --engine {engine}")
        if "comm.backend" in [parse_override(o)[0] for o in overrides]:
            given = cfg.comm.backend
            raise LaunchError(
                f"--engine {args.engine} runs comm.backend={theirs[0]}, but comm.backend={given} was given"
            )
        overrides.append(f"comm.backend={theirs[0]}")
        cfg = load_config(args.config, overrides)
    missing = missing_required(cfg)
    if missing and not args.probe_network and not args.plan:  # --plan lists it with the other checks
        fix = " ".join(f"dawnbench.{k}=..." for k in missing)
        raise LaunchError(
            f"{' and '.join('dawnbench.' + k for k in missing)} required by {args.config} (dawnbench.require: true, "
            f'the entry names who ran it): add {fix} to the overrides (make: OVERRIDES="{fix}"), or '
            "dawnbench.require=false for a run without an entry"
        )

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
        if p.batch_size % world and not args.probe_network:
            raise LaunchError(
                f"phases.{i}.batch_size: {p.batch_size} is not divisible by the world size {world} "
                f"({len(hosts)} host(s) x {procs})"
            )

    data_paths = []
    if registry.INPUT_PIPELINES[cfg.data.backend].reads_folders and not args.probe_network:
        data_paths = [f"{cfg.data.root}/train", f"{cfg.data.root}/val"]
        data_paths += [f"{path}/train" for path in cfg.data.roots.values()]
        from data import copy_beside  # a phase's copy not in data.roots is read from <data.root>-<name>

        beside = {p.root for p in cfg.phases if p.root != "full" and p.root not in cfg.data.roots}
        data_paths += [f"{copy_beside(cfg.data.root, name)}/train" for name in sorted(beside)]
    env = _env_pairs(args.env)
    # What resumes this run, for the workers' preemption line: make's command when make started us, else ours.
    ours = shlex.join(["python", "scripts/launch.py", *getattr(args, "argv_seen", [])])
    env[RERUN_ENV] = os.environ.get(RERUN_ENV) or ours
    # The DAWNBench entry's "deployment backend": how the ranks were really started (recipes/dawnbench.py).
    env["DAWNBENCH_LAUNCHER"] = (
        "scripts/launch.py (horovodrun)" if args.engine == "horovod" else "scripts/launch.py (torchrun c10d)"
    )
    if args.provider:
        env["DAWNBENCH_PROVIDER"] = args.provider
    if args.instance_type:
        env["DAWNBENCH_INSTANCE_TYPE"] = args.instance_type
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
        env=env,
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
            f"batch sizes stay as configured, so each process takes a larger or smaller share; if that share does "
            f"not fit a GPU, run.max_gpu_batch=N accumulates gradients, or start from "
            f"configs/presets/<gpu>_{len(job.hosts)}x{job.procs_per_host}.yaml where there is one (docs/recipe.md)"
        )
    if job.engine == "torchrun":
        lines.append(f"rendezvous: c10d at {job.endpoint} (id {job.rdzv_id}), hosted by {job.hosts[0].name}")
    # The transport's wrapping once, then each host's own command as its shell reads it: printing every host's
    # whole argv quoted again nests the quotes past reading.
    through = shlex.join(job.transport.argv(dataclasses.replace(job.hosts[0], name="HOST"), "COMMAND"))
    lines.append(f"each host runs COMMAND through the {job.transport.name} transport: {through}")
    width = max(len(h.name) for h in job.hosts)
    for host, command in job.commands():
        lines.append(f"[{host.name.ljust(width)}] {command}")
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
    args = _parser().parse_intermixed_args(argv)  # overrides may follow options, as with train.py
    args.argv_seen = [a for a in argv if a not in ("--dry-run", "--plan")]
    args.dry_run = args.dry_run or args.plan
    sys.path.insert(0, str(REPO))
    from base.errors import ConfigError, RunDirError
    from recipes.rundir import files as run_files

    try:
        job, cfg = build_job(args)
    except (LaunchError, HostError, ConfigError, ValueError) as e:
        print(f"launch: error: {e}", file=sys.stderr)
        return 2
    if args.probe_network:
        job = probe_job(job, args)  # the probe alone: its commands are what the checks and the dry run show
    for line in describe(job, cfg):
        print(f"launch: {line}", flush=True)
    run_dir = Path(job.run_dir) if Path(job.run_dir).is_absolute() else REPO / job.run_dir
    probe = wants_probe(args, job, cfg, run_dir)
    if args.dry_run:
        checks = ", ".join(["the working directory", f"{job.python} imports torch", "the config", *job.data_paths])
        if probe:
            program = shlex.join(probe_job(job, args).program)
            print(f"launch: dry run: the link probe would run first on every host: {program}")
        print(
            "launch: dry run: the pre-flight would compare every host's GPUs, driver, torch/CUDA/cuDNN/NCCL/DALI "
            "versions, image counts and free disk"
        )
        print(f"launch: dry run: nothing started (the checks would ask every host for {checks})")
        if args.plan:
            from recipes.schedule_report import startup_lines

            for line in startup_lines(cfg):  # the same checks train.py makes on each host before its first step
                print(f"launch: plan: {line}")
        return 0
    from recipes.rundir.directory import not_a_run

    problem = not_a_run(run_dir)  # before anything is written there: the hosts' logs, the probe, the share tokens
    if problem:
        print(f"launch: error: {problem}", file=sys.stderr)
        return 2
    if args.probe_network and len(job.hosts) < 2:  # the probe measures host pairs: one host has none
        print(f"launch: --probe-network: one host ({job.hosts[0].name}): no link between hosts to measure; nothing run")
        return 0
    if not args.no_check:
        rc = preflight(job, cfg, args)
        if rc:
            return rc
    try:
        seen, unseen = probe_shared_run_dir(job, args.check_timeout)
        print(f"launch: {describe_run_dir(job, seen, unseen)}", flush=True)
    except (OSError, subprocess.SubprocessError) as e:
        print(f"launch: could not tell whether run directory {job.run_dir} is shared between hosts: {e}", flush=True)
    if probe:
        try:
            figures = network_figures(job, args, run_dir)
        except (LaunchError, RunDirError) as e:  # RunDirError: a link planted where network.json goes
            print(f"launch: error: {e}", file=sys.stderr)
            return 2
        if figures is None:
            return 1
        if args.probe_network:
            return 0
        extra = network_overrides(figures)
        print(f"launch: the auto-tuner's step-time model takes the measured link: {' '.join(extra)}", flush=True)
        job.overrides += extra
    rc = run(job, run_dir / run_files.LAUNCH, sys.stdout, args.timeout)
    for name in run_files.RESULTS:
        if rc == 0 and (run_dir / name).is_file():
            print(f"launch: {run_dir / name}")
    entry_file = run_dir / run_files.ENTRY
    if rc == 0 and entry_file.is_file():
        from base import reader
        from recipes.dawnbench import qualification_line

        print(f"launch: {qualification_line(reader.read_json_object(entry_file, what=run_files.ENTRY))}")
    return rc


def preflight(job: Job, cfg, args) -> int:
    """The checks, then the pre-flight on every host; 0, or 2 after printing every problem with its host."""
    from launcher.preflight import Expectation, assess, checkpoint_bytes, instance_env

    from base import registry
    from data.folder import blacklist_path

    print(
        f"launch: checking {len(job.hosts)} host(s): working directory, python, config, data "
        f"({', '.join(job.data_paths) or 'synthetic'})",
        flush=True,
    )
    problems = run_checks(job, args.check_timeout)
    reports = {}
    if not problems:
        blacklist = None
        folders = registry.INPUT_PIPELINES[cfg.data.backend].reads_folders
        if folders and cfg.data.val_blacklist and not args.probe_network:
            blacklist = str(blacklist_path(cfg.data.root, cfg.data.val_blacklist))
        reports, problems = run_preflight(job, job.data_paths, blacklist, args.check_timeout)
    if not problems:
        first = next(iter(reports.values()))
        train = first["data"].get(job.data_paths[0]) if job.data_paths else None
        classes = train[0] if train else cfg.data.get("synthetic_classes", 1000)  # no folders: ImageNet's 1000
        need = 0
        if not args.probe_network:
            need = checkpoint_bytes(cfg.model, classes, job.world_size, cfg.checkpoint.keep)
        exp = Expectation(
            procs_per_host=job.procs_per_host,
            device=cfg.run.device,
            input_backend=cfg.data.backend,
            data_dirs=job.data_paths,
            need_bytes=need,
            multistream=cfg.comm.backend == "multistream",
        )
        verdict = assess(reports, exp)
        for line in verdict.lines[:-1]:
            print(f"launch: {line}", flush=True)
        problems = verdict.problems
        if not problems:
            print(f"launch: {verdict.lines[-1]}", flush=True)
            read = instance_env(reports, job.env)
            if read:
                print(f"launch: the machines' metadata service says {' '.join(read.values())}: recorded", flush=True)
                job.env.update(read)  # the ranks record it in meta.json and the entry
    if problems:
        for p in problems:
            print(f"launch: error: {p}", file=sys.stderr)
        print(f"launch: {len(problems)} problem(s) found; nothing was started", file=sys.stderr)
        return exit_code(problems)
    return 0


if __name__ == "__main__":
    sys.exit(main())
