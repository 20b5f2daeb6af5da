"""The launcher's side of the link probe (launcher/netprobe.py runs on the hosts): whether a launch probes, the probe
as a job of its own, and the figures it leaves in the run directory for the auto-tuner and for a rerun."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from launcher.job import Job, run
from launcher.netprobe import MARK as NETPROBE_MARK

from base.errors import RunDirError

NETWORK_FILE = "network.json"  # the link probe's figures, in the run directory


def wants_probe(args, job: Job, cfg, run_dir: Path) -> bool:
    """--probe-network; or an auto-tuned run whose tuner starts from the step-time model, on several hosts."""
    if args.probe_network:
        return True
    model_tuned = cfg.comm.get("autotune") and cfg.comm.get("tune_start") == "model" and job.engine == "torchrun"
    return model_tuned and len(job.hosts) > 1 and not args.no_probe


def probe_job(job: Job, args) -> Job:
    """The link probe as a job: one process per host, under the same transport, guard and rendezvous."""
    program = ["scripts/launcher/netprobe.py", "--seconds", f"{args.probe_seconds:g}"]
    program += ["--flows", str(args.probe_flows), "--timeout", f"{args.join_timeout:g}"]
    program += ["--out", f"{job.run_dir}/{NETWORK_FILE}"]
    return dataclasses.replace(
        job, procs_per_host=1, program=program, rdzv_id=f"{job.rdzv_id}-probe", max_restarts=0, data_paths=[]
    )


def network_figures(job: Job, args, run_dir: Path) -> dict | None:
    """The link figures: measured now (--probe-network, or a first run), or those of a previous launch into this
    run directory (a rerun resumes with the same comm.* values its checkpoint was written with)."""
    saved = run_dir / NETWORK_FILE
    if saved.is_file() and not args.probe_network:
        from base import reader

        figures = reader.read_json_object(saved, what="the link figures of a previous launch", error=RunDirError)
        print(f"launch: link figures of {saved} (measured {figures.get('measured', '?')}), kept for this rerun")
        return figures
    pj = probe_job(job, args)
    print(f"launch: link probe: every host pair, 1 and {args.probe_flows} flow(s), ~{args.probe_seconds:g} s each")
    from recipes.rundir import files as run_files

    log_dir = run_dir / run_files.LAUNCH / "probe"
    rc = run(pj, log_dir, sys.stdout, args.timeout)
    found = None
    for log in sorted(log_dir.glob("*.log")) if rc == 0 else []:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(NETPROBE_MARK):
                found = json.loads(line[len(NETPROBE_MARK) :])
    if found is None:
        print(f"launch: error: the link probe failed (exit {rc}); its logs: {log_dir}", file=sys.stderr)
        return None
    from base.writer import to_json, write_atomic

    saved.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(saved, to_json(found))  # never through a planted link, never half-written
    print(f"launch: link figures written to {saved}", flush=True)
    return found
