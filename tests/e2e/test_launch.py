"""scripts/launch.py: host lists, transports, per-host commands, checks, and real multi-"host" runs on one machine.

Two "hosts" are two torchrun agents on loopback (local transport) or two network namespaces behind a shaped link
(netns transport, lab/netlab.py); they rendezvous with c10d (`--nnodes 2`) and train on CPU with gloo.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support import NETLAB_MISSING, ROOT, TINY_CONFIG, TINY_OVERRIDES, free_port, two_local_hosts

from base import registry

sys.path.insert(0, str(ROOT / "scripts"))

from launcher.guard import descendants  # noqa: E402
from launcher.hosts import Host, HostError, expand_nodelist, parse_host_list, parse_hostfile, slurm_hosts  # noqa: E402
from launcher.job import Job  # noqa: E402
from launcher.transports import Local, Slurm, Ssh  # noqa: E402


def launch_argv(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "scripts" / "launch.py"), *args]


def launch(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(launch_argv(*args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------------------------------------
# Host lists.


def test_hostfile_slots_addr_and_comments(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# cluster\nnode01 slots=8\n\nnode02 slots=8 addr=10.0.0.2   # second\nuser@node03\n")
    assert parse_hostfile(f) == [
        Host("node01", "node01", 8),
        Host("node02", "10.0.0.2", 8),
        Host("user@node03", "node03", None),
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        ("node01 slots=eight\n", "hosts:1: slots must be an integer, got 'eight'"),
        ("node01\nnode02 gpus=8\n", "hosts:2: unknown field 'gpus' (known: slots, addr)"),
        ("node01 slots=0\n", "hosts:1: slots must be a positive integer, got 0"),
        ("node01\nnode01\n", "host 'node01' is listed twice"),
        ("node01 8\n", "hosts:1: expected key=value after the host name, got '8'"),
        ("# nothing\n", "no hosts in the hostfile"),
        ("node01 addr=10.0.0.999\n", "hosts:1: addr '10.0.0.999' is not an IP address or a host name"),
        ("node01 addr=a;b\n", "hosts:1: addr 'a;b' is not an IP address or a host name"),
        ("node01 slots=2 slots=4\n", "hosts:1: slots is given twice; give it once"),
        ("node01 slots=2 max_slots=4\n", "hosts:1: slots and max_slots both given; give slots=N once"),
    ],
)
def test_hostfile_errors_name_the_line(tmp_path, text, message):
    f = tmp_path / "hosts"
    f.write_text(text)
    with pytest.raises(HostError, match=re.escape(message)):
        parse_hostfile(f)


def test_host_list_and_errors():
    assert parse_host_list("a:8,b:8") == [Host("a", "a", 8), Host("b", "b", 8)]
    assert parse_host_list("localhost") == [Host("localhost", "localhost", None)]
    with pytest.raises(HostError, match="slots must be an integer, got 'x'"):
        parse_host_list("a:x")
    with pytest.raises(HostError, match="empty entry"):
        parse_host_list("a,,b")


def test_slurm_nodelist_expansion():
    assert expand_nodelist("gpu[01-03,07],cpu5,r[1-2]n[8-9]") == [
        "gpu01",
        "gpu02",
        "gpu03",
        "gpu07",
        "cpu5",
        "r1n8",
        "r1n9",
        "r2n8",
        "r2n9",
    ]
    assert expand_nodelist("node[098-101]") == ["node098", "node099", "node100", "node101"]
    with pytest.raises(HostError, match="bad range '5-3'"):
        expand_nodelist("n[5-3]")
    assert slurm_hosts({}) is None
    if not shutil.which("scontrol"):
        assert [h.name for h in slurm_hosts({"SLURM_JOB_NODELIST": "dgx[1-2]"})] == ["dgx1", "dgx2"]


# ---------------------------------------------------------------------------------------------------------
# Transports and commands.


def test_transport_argv():
    host = Host("node02", "10.0.0.2", 8)
    ssh = Ssh("ssh -o BatchMode=yes", port=2222).argv(host, "echo 'a b'")
    assert ssh == ["ssh", "-o", "BatchMode=yes", "-p", "2222", "node02", "sh -c 'echo '\"'\"'a b'\"'\"''"]
    assert Ssh().failure(255).startswith("ssh could not connect")
    srun = Slurm("--container-image=x.sqsh", env={"SLURM_CPUS_ON_NODE": "96"}).argv(host, "hostname")
    assert srun[:6] == ["srun", "--unbuffered", "--nodes=1", "--ntasks=1", "--nodelist=node02", "--kill-on-bad-exit=1"]
    assert srun[6:] == ["--cpus-per-task=96", "--container-image=x.sqsh", "sh", "-c", "hostname"]
    assert Local().argv(host, "true") == ["sh", "-c", "true"]


def _job(**kw) -> Job:
    hosts = [Host("node01", "10.0.0.1", 8), Host("node02", "10.0.0.2", 8)]
    base = dict(
        hosts=hosts,
        transport=Ssh(),
        config="configs/dawnbench_158s.yaml",
        run_dir="runs/r",
        overrides=["data.root=/data/imagenet", "data.roots={160: /data/i 160}"],
        procs_per_host=8,
        port=29400,
        workdir="/srv/repo",
        python=".venv/bin/python",
        rdzv_id="job1",
    )
    return Job(**{**base, **kw})


def test_torchrun_commands_one_agent_per_host_rendezvous_on_first():
    job = _job(env={"NCCL_DEBUG": "WARN"}, iface="eth0")
    cmds = job.commands()
    assert [h.name for h, _ in cmds] == ["node01", "node02"]
    for i, (host, cmd) in enumerate(cmds):
        argv = shlex.split(cmd.split(" && exec ", 1)[1])
        assert cmd.startswith("cd /srv/repo && exec env ")
        assert "NCCL_DEBUG=WARN" in argv and "GLOO_SOCKET_IFNAME=eth0" in argv and "NCCL_SOCKET_IFNAME=eth0" in argv
        guard = argv.index("guard")
        assert argv[guard - 2 : guard + 1] == [".venv/bin/python", "scripts/launch.py", "guard"]
        run = argv[argv.index("--", guard) + 1 :]
        assert run[:3] == [".venv/bin/python", "-m", "torch.distributed.run"]
        opts = dict(zip(run[3:21:2], run[4:22:2], strict=True))
        assert opts == {
            "--nnodes": "2",
            "--nproc-per-node": "8",
            "--rdzv-backend": "c10d",
            "--rdzv-endpoint": "10.0.0.1:29400",
            "--rdzv-id": "job1",
            "--rdzv-conf": f"is_host={int(i == 0)},join_timeout=300",
            "--local-addr": host.addr,
            "--max-restarts": "0",
            "--shutdown-timeout": "100",  # torchrun's wait before SIGKILL follows --grace (its one default)
        }
        assert run[21:] == [
            "train.py",
            "-c",
            "configs/dawnbench_158s.yaml",
            "--run-dir",
            "runs/r",
            "data.root=/data/imagenet",
            "data.roots={160: /data/i 160}",
        ]


def test_horovod_command_runs_horovodrun_once_on_first_host():
    job = _job(engine="horovod", overrides=["comm.backend=horovod"], ssh_port=2222)
    [(host, cmd)] = job.commands()
    assert host.name == "node01"
    argv = shlex.split(cmd.split(" && exec ", 1)[1])
    assert "MASTER_ADDR=10.0.0.1" in argv and "MASTER_PORT=29400" in argv
    run = argv[argv.index("--") + 1 :]
    assert run == [
        ".venv/bin/horovodrun",
        "--gloo",
        "-np",
        "16",
        "-H",
        "node01:8,node02:8",
        "--start-timeout",
        "300",
        "-p",
        "2222",
        ".venv/bin/python",
        "train.py",
        "-c",
        "configs/dawnbench_158s.yaml",
        "--run-dir",
        "runs/r",
        "comm.backend=horovod",
    ]


def test_check_command_reports_each_problem(tmp_path):
    """The check script, run by a real shell: every missing piece is named, and 'ok' only when all is there."""
    (tmp_path / "data" / "train").mkdir(parents=True)
    (tmp_path / "data" / "train" / "n01").mkdir()
    (tmp_path / "data" / "val").mkdir()  # empty: reported
    job = _job(
        workdir=str(ROOT),
        python=sys.executable,
        config="configs/quickstart.yaml",
        hosts=[Host("h", "h")],
        data_paths=[str(tmp_path / "data" / "train"), str(tmp_path / "data" / "val"), "/nonexistent 1/x"],
        port=free_port(),
    )
    p = subprocess.run(["sh", "-c", job.check_command(first=True)], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert p.stdout.splitlines() == [
        f"launch-check: data path {tmp_path}/data/val is missing or empty",
        "launch-check: data path /nonexistent 1/x is missing or empty",
    ]
    job.data_paths = job.data_paths[:1]
    p = subprocess.run(["sh", "-c", job.check_command(first=True)], capture_output=True, text=True, timeout=120)
    assert (p.returncode, p.stdout.strip()) == (0, "launch-check: ok")
    job.workdir = str(tmp_path / "nowhere")
    p = subprocess.run(["sh", "-c", job.check_command(first=True)], capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == f"launch-check: working directory {tmp_path}/nowhere not found"


def test_busy_rendezvous_port_and_non_utf8_hostfile_are_named(tmp_path):
    import socket

    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        job = _job(
            workdir=str(ROOT),
            python=sys.executable,
            config="configs/quickstart.yaml",
            hosts=[Host("h", "h")],
            data_paths=[],
            port=port,
        )
        p = subprocess.run(["sh", "-c", job.check_command(first=True)], capture_output=True, text=True, timeout=120)
        assert p.stdout.splitlines() == [
            f"launch-check: rendezvous port {port} is in use (stop what holds it, or choose --port / PORT=)"
        ]
        p = subprocess.run(["sh", "-c", job.check_command(first=False)], capture_output=True, text=True, timeout=120)
        assert p.stdout.strip() == "launch-check: ok"  # only the first host binds it
    hostfile = tmp_path / "hosts"
    hostfile.write_bytes(b"node01 slots=8\nn\xf6de02\n")
    with pytest.raises(HostError) as e:
        parse_hostfile(hostfile)
    assert str(e.value) == f"{hostfile}: not a UTF-8 text file (byte 16): expected 'host [slots=N] [addr=IP]' lines"
    p = launch("--hostfile", str(hostfile), "-c", "configs/quickstart.yaml", "--port", "0", timeout=120)
    assert p.returncode == 2 and p.stderr.strip() == "launch: error: --port: expected a TCP port 1..65535, got 0"


# ---------------------------------------------------------------------------------------------------------
# The command line, up to the point where hosts would be contacted.


def test_dry_run_prints_every_host_command_and_starts_nothing(tmp_path, tiny_root):
    run_dir = tmp_path / "run"
    p = launch(
        "--hostfile",
        str(two_local_hosts(tmp_path)),
        "--transport",
        "local",
        "--gpus-per-host",
        "1",
        "--run-dir",
        str(run_dir),
        "--dry-run",
        "-c",
        "configs/quickstart.yaml",
        f"data.root={tiny_root}",
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("launch: torchrun job: 2 host(s) x 1 process(es) = 2, config configs/quickstart.yaml")
    per_host = [ln for ln in lines if ln.startswith(("launch: [host-a]", "launch: [host-b]"))]
    assert len(per_host) == 2
    assert "is_host=1" in per_host[0] and "is_host=0" in per_host[1]
    assert all("--nnodes 2 --nproc-per-node 1" in ln for ln in per_host)
    assert all("--grace 100 --" in ln and "--shutdown-timeout 100 " in ln for ln in per_host)  # time to checkpoint
    # each host's command as its shell reads it (one level of quotes), the transport's wrapping named once
    assert sum(ln.startswith("launch: each host runs COMMAND through the local transport: ") for ln in lines) == 1
    for ln in per_host:
        words = shlex.split(ln.split("] ", 1)[1])
        assert words[:3] == ["cd", str(ROOT), "&&"] and "train.py" in words, words
    assert f"{tiny_root}/train, {tiny_root}/val" in lines[-1] and "nothing started" in lines[-1]
    assert not run_dir.exists()


@pytest.mark.parametrize(
    "opts, overrides, message",
    [
        (["--gpus-per-host", "5"], [], "phases.0.batch_size: 64 is not divisible by the world size 10 (2 host(s) x 5)"),
        (
            ["--engine", "horovod"],
            ["comm.backend=ddp"],
            "--engine horovod runs comm.backend=horovod, but comm.backend=ddp",
        ),
        ([], ["comm.backend=horovod"], "comm.backend=horovod runs under horovodrun: add --engine horovod"),
        (
            [],
            ["comm.backend=nccl9"],
            f"comm.backend: expected one of {', '.join(map(repr, registry.ALLREDUCE_BACKENDS))}, got 'nccl9'",
        ),
        ([], ["comm.backend=multistrem"], "got 'multistrem' (did you mean 'multistream'?)"),
        ([], ["optim.lrr=1"], "unknown key 'optim.lrr' (did you mean 'optim.lr'?)"),
        (["--env", "1X=2"], [], "--env '1X=2': expected KEY=VALUE"),
        (["--grace", "nan"], [], "--grace: expected a finite number of seconds >= 0, got nan"),
        (["--timeout", "-1"], [], "--timeout: expected a finite number of seconds >= 0, got -1.0"),
        (["--probe-flows", "0"], [], "--probe-flows: expected a positive integer, got 0"),
        (
            [],
            ["dawnbench.require=true"],
            "dawnbench.author and dawnbench.author_email required by configs/quickstart.yaml (dawnbench.require: "
            "true, the entry names who ran it): add dawnbench.author=... dawnbench.author_email=... to the overrides "
            '(make: OVERRIDES="dawnbench.author=... dawnbench.author_email=..."), or dawnbench.require=false',
        ),
    ],
)
def test_bad_launches_fail_before_contacting_hosts(tmp_path, opts, overrides, message):
    p = launch(
        "--hostfile",
        str(two_local_hosts(tmp_path)),
        "--transport",
        "local",
        *opts,
        "-c",
        "configs/quickstart.yaml",
        *overrides,
        timeout=120,
    )
    assert p.returncode == 2
    assert message in p.stderr, p.stderr
    assert "launch: [host" not in p.stdout


def test_overrides_may_follow_options_as_with_train_py(tmp_path, tiny_root):
    p = launch(
        "-c",
        "configs/quickstart.yaml",
        f"data.root={tiny_root}",
        "--hostfile",
        str(two_local_hosts(tmp_path)),
        "optim.lr=0.3",
        "--transport",
        "local",
        "--gpus-per-host",
        "1",
        "--dry-run",
        "run.seed=3",
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    host_a = next(ln for ln in p.stdout.splitlines() if ln.startswith("launch: [host-a]"))
    assert f"data.root={tiny_root} optim.lr=0.3 run.seed=3" in host_a


def test_plan_is_the_dry_run_plus_every_check_that_would_stop_the_run(tmp_path, tiny_root, capsys):
    """A 16 x 8 preset's `Plan first` line: what each host would run, and, at once, what would stop the run there
    (the author the record requires, the blacklist, the pre-resized copy), starting nothing."""
    import launch as launch_module

    hosts = tmp_path / "hosts.txt"
    hosts.write_text("".join(f"node{i:02d} slots=8\n" for i in range(16)))
    header = (ROOT / "configs/presets/h100_16x8.yaml").read_text().splitlines()[2]
    words = header.split("(runs nothing): ", 1)[1].split()
    assert words[:2] == ["python", "scripts/launch.py"] and words[-1] == "--plan"
    argv = [a.replace("hosts.txt", str(hosts)) for a in words[2:]] + [f"data.root={tiny_root}"]
    argv += ["--run-dir", str(tmp_path / "run"), "dawnbench.require=true"]
    assert launch_module.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum(ln.startswith("launch: [node") for ln in lines) == 16
    plan = [ln.removeprefix("launch: plan: ") for ln in lines if ln.startswith("launch: plan: ")]
    assert plan[0] == "start-up checks: 3 would stop this run here (train.py stops at the first, exit 2):"
    assert plan[1].startswith("  dawnbench.author: the DAWNBench entries format requires it")
    assert plan[2].startswith(f"  data.val_blacklist: '{tiny_root}/ILSVRC2012_validation_blacklist.txt' not found")
    assert plan[3].startswith(f"  phases.0.root: '160' is not in data.roots (known: full) and '{tiny_root}-160'")
    assert not (tmp_path / "run").exists()


def test_probe_network_on_one_host_says_there_is_nothing_to_measure(tmp_path, capsys):
    """It once printed an empty matrix without a word."""
    import launch as launch_module

    argv = ["--hosts", "localhost", "--transport", "local", "--probe-network", "-c", "configs/quickstart.yaml"]
    assert launch_module.main([*argv, "--run-dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "launch: --probe-network: one host (localhost): no link between hosts to measure; nothing run"
    assert not (tmp_path / "run").exists()


def test_an_auto_tuned_run_from_the_model_probes_the_links_first(tmp_path, tiny_root):
    common = ["--hostfile", str(two_local_hosts(tmp_path)), "--transport", "local", "--gpus-per-host", "1"]
    common += ["--run-dir", str(tmp_path / "r"), "--dry-run", "-c", "configs/quickstart.yaml", f"data.root={tiny_root}"]
    tuned = ["comm.backend=multistream", "comm.autotune=true", "comm.tune_start=model", "comm.link_gbit=32"]
    p = launch(*common, *tuned, timeout=120)
    assert p.returncode == 0, p.stderr
    probe = next(ln for ln in p.stdout.splitlines() if "the link probe would run first" in ln)
    assert f"scripts/launcher/netprobe.py --seconds 1 --flows 4 --timeout 300 --out {tmp_path}/r/network.json" in probe
    p = launch(*common, *tuned, "--no-probe", timeout=120)
    assert p.returncode == 0 and "link probe" not in p.stdout, p.stderr


def test_a_lock_that_is_a_directory_is_one_line(tmp_path):
    (tmp_path / "run" / ".lock").mkdir(parents=True)
    job = _job(
        workdir=str(ROOT),
        python=sys.executable,
        config="configs/quickstart.yaml",
        hosts=[Host("h", "h")],
        data_paths=[],
        run_dir=str(tmp_path / "run"),
        port=free_port(),
    )
    p = subprocess.run(["sh", "-c", job.check_command(first=True)], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert p.stdout.splitlines() == [
        f"launch-check: {tmp_path}/run/.lock is a directory, not the run's lock file: remove it (rmdir), then "
        "launch again"
    ]


def test_missing_data_and_unreachable_host_are_named_and_nothing_starts(tmp_path):
    """Checks go through the transport: a fake `ssh` that runs the command here, and a real ssh to no such host."""
    fake_ssh = tmp_path / "fake-ssh"
    # Like ssh: options, then the host, then the command string for the remote shell.
    fake_ssh.write_text('#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift 2; done\nshift\nexec sh -c "$*"\n')
    fake_ssh.chmod(0o755)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("here-1 addr=127.0.0.1\nhere-2 addr=127.0.0.1\n")
    run_dir = tmp_path / "run"
    p = launch(
        "--hostfile",
        str(hostfile),
        "--ssh",
        f"{fake_ssh} -o BatchMode=yes",
        "--gpus-per-host",
        "1",
        "--run-dir",
        str(run_dir),
        "-c",
        "configs/quickstart.yaml",
        "data.root=/no/such/imagenet",
        "data.roots={160: /no/such/imagenet-160}",
        timeout=180,
    )
    assert p.returncode == 2
    for host in ("here-1", "here-2"):
        for path in ("/no/such/imagenet/train", "/no/such/imagenet/val", "/no/such/imagenet-160/train"):
            assert f"launch: error: host {host}: data path {path} is missing or empty" in p.stderr
    assert "6 problem(s) found; nothing was started" in p.stderr
    assert not run_dir.exists()

    hostfile.write_text("no-such-host.invalid\n")
    p = launch(
        "--hostfile",
        str(hostfile),
        "--gpus-per-host",
        "2",
        "--check-timeout",
        "30",
        "-c",
        "configs/quickstart.yaml",
        timeout=180,
    )
    assert p.returncode == 1  # a host not reached is a failure (the exit-code table's 1), not bad input
    assert (
        "launch: error: host no-such-host.invalid: not reachable through ssh: ssh could not connect or lost the "
        "connection (exit 255): ssh: Could not resolve hostname no-such-host.invalid"
    ) in p.stderr
    assert "--transport local" not in p.stderr

    hostfile.write_text("localhost slots=2\n")  # this machine, over ssh: no ssh server answers here
    p = launch("--hostfile", str(hostfile), "--check-timeout", "30", "-c", "configs/quickstart.yaml", timeout=180)
    assert p.returncode == 1, p.stderr
    assert "launch: error: host localhost: not reachable through ssh: " in p.stderr
    assert p.stderr.rstrip().splitlines()[-2].endswith("; for this machine alone, add `--transport local` (no ssh)")


# ---------------------------------------------------------------------------------------------------------
# The guard.


def test_guard_stops_its_whole_tree_when_stdin_closes(tmp_path):
    """Workers in their own session (as torchrun starts them) are stopped too, within the grace period."""
    script = (
        "import subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True); "
        "print('worker', c.pid, flush=True); time.sleep(300)"
    )
    g = subprocess.Popen(
        launch_argv("guard", "--grace", "2", "--", sys.executable, "-c", script),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    first = g.stdout.readline()
    assert first.startswith("guard: pid ")
    worker = int(g.stdout.readline().split()[1])
    assert worker in descendants(g.pid)
    t = time.monotonic()
    g.stdin.close()
    assert g.wait(timeout=30) == 143
    assert time.monotonic() - t < 10
    assert not Path(f"/proc/{worker}").exists() or Path(f"/proc/{worker}/stat").read_text().split()[2] == "Z"
    g.stdout.close()


def test_guard_passes_the_exit_code_and_stops_leftovers():
    script = (
        "import subprocess, sys; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True); "
        "print('worker', c.pid, flush=True); sys.exit(7)"
    )
    with subprocess.Popen(
        launch_argv("guard", "--grace", "2", "--", sys.executable, "-c", script),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as g:
        assert g.stdout.readline().startswith("guard: pid ")
        worker = int(g.stdout.readline().split()[1])
        assert g.wait(timeout=60) == 7
        assert "guard: stopping 1 process(es) left behind by the command" in g.stdout.read()
        g.stdin.close()
    assert not Path(f"/proc/{worker}").exists() or Path(f"/proc/{worker}/stat").read_text().split()[2] == "Z"
    with subprocess.Popen(launch_argv("guard", "--", "sh", "-c", "kill -9 $$"), stdin=subprocess.PIPE) as q:
        assert q.wait(timeout=60) == 137  # 128 + SIGKILL, as a shell reports it
        q.stdin.close()


# ---------------------------------------------------------------------------------------------------------
# Real runs: two "hosts" on one machine.


@pytest.mark.slow
def test_two_local_hosts_rendezvous_and_train_to_target(tmp_path, tiny_root):
    """Two local hosts, each its own agent, train the tiny recipe to a target its first epoch reaches (4 classes:
    the top 5 hold every class); the quickstart's accuracy is tests/e2e/test_distributed.py's."""
    run_dir = tmp_path / "qs"
    p = launch(
        "--hostfile",
        str(two_local_hosts(tmp_path)),
        "--transport",
        "local",
        "--gpus-per-host",
        "1",
        "--port",
        str(free_port()),
        "--run-dir",
        str(run_dir),
        "--timeout",
        "800",
        "-c",
        "configs/base.yaml",
        f"data.root={tiny_root}",
        *TINY_OVERRIDES,
        "phases=[{epochs: 2, image_size: 32, batch_size: 12}]",
        "run.target_top5=100",
        "run.stop_at_target=true",
        timeout=900,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert summary["final_top5"] == 100.0 and summary["time_to_target_seconds"] is not None
    assert summary["epochs"] == 1  # stopped at the target
    assert "launch: all 2 host(s) finished" in p.stdout
    # Each host ran its own agent (--nnodes 2), and its output went to the console and to its log.
    guards = re.findall(r"^\[(host-[ab])\] guard: pid \d+ on \S+: .* --nnodes 2 --nproc-per-node 1 ", p.stdout, re.M)
    assert sorted(guards) == ["host-a", "host-b"]
    logs = sorted(x.name for x in (run_dir / "launch").iterdir())
    assert logs == ["000-host-a.log", "001-host-b.log"]
    assert sum("| final top-1 / top-5" in (run_dir / "launch" / n).read_text() for n in logs) == 1  # rank 0 only
    entry = json.loads((run_dir / "dawnbench.json").read_text())
    assert entry["hardware"].startswith("2 machine(s) x 1 x CPU")
    assert entry["misc"]["iterations"] == summary["steps"] and entry["misc"]["processes"] == 2


def _kill_when(proc: subprocess.Popen, lines: list[str], pattern: str, victim: str) -> dict:
    """Copy proc's output into `lines`; once `pattern` shows up, SIGKILL the victim host's agent."""
    info: dict = {}
    pids: dict[str, int] = {}
    for line in proc.stdout:
        lines.append(line)
        m = re.match(r"\[(\S+)\s*\] guard: pid (\d+)", line)
        if m:
            pids[m.group(1)] = int(m.group(2))
        if "killed_at" not in info and re.search(pattern, line) and victim in pids:
            os.kill(pids[victim], signal.SIGKILL)
            info["killed_at"] = time.monotonic()
    info["pids"] = pids
    return info


@pytest.mark.slow
def test_a_dying_host_stops_the_whole_job_with_host_and_code_named(tmp_path, tiny_root):
    run_dir = tmp_path / "long"
    argv = launch_argv(
        "--hostfile",
        str(two_local_hosts(tmp_path)),
        "--transport",
        "local",
        "--gpus-per-host",
        "1",
        "--port",
        str(free_port()),
        "--run-dir",
        str(run_dir),
        "--grace",
        "5",
        "--no-check",
        "-c",
        "configs/quickstart.yaml",
        f"data.root={tiny_root}",
        *TINY_OVERRIDES,
        "checkpoint.enabled=false",
        "phases=[{epochs: 200, image_size: 32, batch_size: 12}]",
    )
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    lines: list[str] = []
    box: dict = {}
    reader = threading.Thread(target=lambda: box.update(_kill_when(proc, lines, r"epoch 2/200  step", "host-b")))
    reader.start()
    try:
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=30)
    out = "".join(lines)
    assert "killed_at" in box, out[-3000:]
    stopped_after = time.monotonic() - box["killed_at"]
    assert rc == 137, out[-3000:]
    assert re.search(
        r"launch: host host-b \(127\.0\.0\.1\) failed: exit code 137 \(SIGKILL\) after [\d.]+ s; "
        r"stopping 1 other host\(s\)",
        out,
    ), out[-3000:]
    assert "[host-a] guard: stopping pid" in out
    assert stopped_after < 60  # the grace period plus start-up noise, not the 300 s collective timeout
    # Nothing is left: neither the agents nor the workers (host-b's worker lost its agent; its guard stopped it).
    for pid in box["pids"].values():
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    leftovers = subprocess.run(["pgrep", "-f", f"--run-dir {run_dir}"], capture_output=True, text=True).stdout
    assert leftovers.strip() == ""


@pytest.mark.slow
@pytest.mark.netns
@pytest.mark.skipif(NETLAB_MISSING is not None, reason=NETLAB_MISSING or "")
def test_two_hosts_in_the_network_lab_train_across_a_shaped_link(tmp_path, tiny_root):
    """The tiny recipe on two network-lab hosts to a target its first epoch reaches (4 classes: the top 5 hold every
    class): the rendezvous and every step's allreduce cross the shaped link."""
    from lab import netlab
    from models import create_model
    from recipes.config import load_config

    run_dir = tmp_path / "lab"
    with netlab.NetLab(2, link_mbit=2000, flow_mbit=700) as lab:
        hostfile = tmp_path / "hosts"
        hostfile.write_text("".join(f"{lab.names[i]} addr={lab.addr(i)}\n" for i in range(2)))

        def tx_bytes(i: int) -> int:
            out = subprocess.run(
                lab.argv(i, ["cat", "/sys/class/net/eth0/statistics/tx_bytes"]),
                capture_output=True,
                text=True,
                check=True,
            )
            return int(out.stdout)

        before = [tx_bytes(i) for i in range(2)]
        p = launch(
            "--hostfile",
            str(hostfile),
            "--transport",
            "netns",
            "--iface",
            "eth0",
            "--gpus-per-host",
            "1",
            "--port",
            "29400",
            "--run-dir",
            str(run_dir),
            "--timeout",
            "800",
            "-c",
            "configs/base.yaml",
            f"data.root={tiny_root}",
            *TINY_OVERRIDES,
            "phases=[{epochs: 2, image_size: 32, batch_size: 12}]",
            "run.target_top5=100",
            "run.stop_at_target=true",
            timeout=900,
        )
        sent = [tx_bytes(i) - before[i] for i in range(2)]
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["epochs"] == 1 and summary["time_to_target_seconds"] is not None
    assert f"rendezvous: c10d at {netlab.SUBNET}.1:29400" in p.stdout
    # Every step's gradient allreduce crossed the link: with 2 ranks each host sends about the fp32 gradients' size
    # per step. Half of it is a safe lower bound.
    params = sum(x.numel() for x in create_model(load_config(TINY_CONFIG).model, 4).parameters())
    for s in sent:
        assert s > summary["steps"] * params * 4 * 0.5, sent


# ---------------------------------------------------------------------------------------------------------
# The ssh transport against a real sshd on loopback (when an sshd binary is there: $SSHD, or sshd on PATH).


def _sshd_binary() -> str | None:
    for cand in (os.environ.get("SSHD"), shutil.which("sshd"), "/usr/sbin/sshd"):
        if cand and os.access(cand, os.X_OK):
            return os.path.abspath(cand)
    return None


@pytest.fixture
def sshd(tmp_path):
    """A private sshd on 127.0.0.1 that accepts one generated key for the current user; yields the ssh command."""
    binary = _sshd_binary()
    if binary is None:
        pytest.skip("no sshd binary (apt-get install openssh-server, or SSHD=/path/to/sshd)")
    d = tmp_path / "sshd"
    d.mkdir()
    for name in ("host_key", "user_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True, timeout=60)
    (d / "authorized_keys").write_text((d / "user_key.pub").read_text())
    port = free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n"
        f"PidFile {d}/sshd.pid\nStrictModes no\nUsePAM no\nPasswordAuthentication no\nPermitRootLogin "
        "prohibit-password\nKbdInteractiveAuthentication no\n"
    )
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory (Debian creates it)
    server = subprocess.Popen([binary, "-D", "-e", "-f", str(d / "sshd_config")], stderr=subprocess.PIPE)
    ssh = (
        f"ssh -i {d}/user_key -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
        f"-o LogLevel=ERROR -o ConnectTimeout=10"
    )
    deadline = time.monotonic() + 30
    while subprocess.run([*shlex.split(ssh), "-p", str(port), "127.0.0.1", "true"], capture_output=True).returncode:
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            pytest.skip(f"sshd did not accept the test key: {server.stderr.read(2000).decode(errors='replace')}")
        time.sleep(0.2)
    yield ssh, port
    server.terminate()
    server.wait(timeout=30)


@pytest.mark.slow
def test_ssh_transport_runs_the_job_and_closing_stdin_stops_the_remote_side(tmp_path, tiny_root, sshd):
    ssh, port = sshd
    # Closing the ssh client's stdin reaches the remote guard as EOF: it stops its command at once.
    host = Host("127.0.0.1", "127.0.0.1")
    transport = Ssh(ssh, port)
    job = _job(hosts=[host], transport=transport, workdir=str(ROOT), python=sys.executable, grace=2)
    cmd = job._wrap(["sleep", "300"], {})
    with subprocess.Popen(transport.argv(host, cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as p:
        m = re.match(r"guard: pid (\d+) ", p.stdout.readline())
        assert m, "the guard did not start through ssh"
        t = time.monotonic()
        p.stdin.close()
        assert p.wait(timeout=60) == 143
        assert time.monotonic() - t < 10
        assert "the launcher closed the connection" in p.stdout.read()
    assert not Path(f"/proc/{m.group(1)}").exists()  # the remote side is this machine here
    # A whole job over ssh: two "hosts" (two names for this machine), checks, rendezvous, training.
    hostfile = tmp_path / "hosts"
    hostfile.write_text("127.0.0.1\nlocalhost addr=127.0.0.1\n")
    run_dir = tmp_path / "over-ssh"
    p = launch(
        "--hostfile",
        str(hostfile),
        "--ssh",
        ssh,
        "--ssh-port",
        str(port),
        "--gpus-per-host",
        "1",
        "--port",
        str(free_port()),
        "--run-dir",
        str(run_dir),
        "--timeout",
        "600",
        "-c",
        "configs/quickstart.yaml",
        f"data.root={tiny_root}",
        *TINY_OVERRIDES,
        "phases=[{epochs: 2, image_size: 32, batch_size: 12}]",
        timeout=700,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "transport ssh" in p.stdout.splitlines()[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["epochs"] == 2


# ---------------------------------------------------------------------------------------------------------
# The Makefile targets.


def _make(*args: str) -> str:
    p = subprocess.run(
        ["make", "-n", "--no-print-directory", "-o", ".venv/.installed", "PY=.venv/bin/python", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    return " ".join(p.stdout.replace("\\\n", " ").split())


def test_make_targets_run_the_launcher_with_the_record_settings():
    out = _make(
        "reproduce-158s",
        "HOSTS=hosts.txt",
        "DATA=/data/imagenet",
        "GPUS=8",
        "PORT=29555",
        "OVERRIDES=optim.lr=24 run.seed=1",
    )
    assert (
        "scripts/launch.py --python .venv/bin/python --port '29555' --gpus-per-host '8' --overrides-text "
        "'optim.lr=24 run.seed=1' --hostfile 'hosts.txt' --run-dir 'runs/dawnbench_158s-multistream' "
        "-c 'configs/dawnbench_158s.yaml' 'data.root=/data/imagenet' comm.backend=multistream "
        "comm.autotune=true"
    ) in out
    out = _make("reproduce-158s", "RUN_DIR=runs/mine", "LAUNCH_ARGS=--dry-run")  # inside SLURM: no HOSTS
    assert "--hostfile" not in out and "--run-dir 'runs/mine'" in out and "--args-text '--dry-run'" in out
    out = _make("reproduce-8gpu")
    assert "--hosts localhost --transport local --run-dir 'runs/dawnbench_8gpu' -c 'configs/dawnbench_8gpu.yaml'" in out
    out = _make("baseline-horovod", "HOSTS=hosts.txt", "IFACE=eth1")
    assert "PY=.venv/bin/python bash scripts/install_horovod.sh" in out
    assert (
        "--iface 'eth1' --engine horovod --hostfile 'hosts.txt' --run-dir 'runs/dawnbench_158s-horovod' "
        "-c 'configs/dawnbench_158s.yaml' comm.backend=horovod"
    ) in out
    assert "scripts/compare_runs.py 'runs/dawnbench_158s-multistream' 'runs/dawnbench_158s-horovod'" in _make("compare")
    out = _make("probe-network", "HOSTS=hosts.txt")
    assert (
        "--hostfile 'hosts.txt' --run-dir 'runs/dawnbench_158s-multistream' -c 'configs/dawnbench_158s.yaml' "
        "--probe-network" in out
    )


def test_make_quotes_every_value_and_ignores_stray_environment(tmp_path):
    """make DATA='x;touch y' runs nothing; a path with spaces is one argument; a PORT/DATA exported in the shell is
    ignored (DAWNBENCH_PORT/DAWNBENCH_DATA are the documented ones); OVERRIDES values may hold spaces."""
    marker = tmp_path / "ran"
    env = {**os.environ, "PORT": "1111", "DATA": "/stray", "DAWNBENCH_IFACE": "$(shell touch " + str(marker) + ")"}
    run_dir = tmp_path / "run dir"
    p = subprocess.run(
        [
            "make",
            "-s",
            "--no-print-directory",
            "-o",
            ".venv/.installed",
            f"PY={sys.executable}",
            "reproduce-8gpu",
            f"DATA={tmp_path}/x;touch {marker}",
            f"RUN_DIR={run_dir}",
            "GPUS=1",
            f"LAUNCH_ARGS=--dry-run --env 'NOTE=a b;touch {marker}'",
            f"OVERRIDES=data.roots={{160: {tmp_path}/my data}} phases.0.root=160 dawnbench.author='Your team' "
            "dawnbench.author_email=a@b.org",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert not marker.exists()
    assert "localhost:29400" in p.stdout and "1111" not in p.stdout and "/stray" not in p.stdout
    argv = shlex.split(next(ln for ln in p.stdout.splitlines() if "[localhost]" in ln).split("] ", 1)[1])
    assert argv[argv.index("--run-dir") + 1] == str(run_dir)
    assert f"data.root={tmp_path}/x;touch {marker}" in argv
    assert f"data.roots={{160: {tmp_path}/my data}}" in argv and "phases.0.root=160" in argv
    assert "dawnbench.author='Your team'" in argv
    assert f"NOTE=a b;touch {marker}" in argv  # a LAUNCH_ARGS value with spaces, quoted as in a shell
    assert f"GLOO_SOCKET_IFNAME=$(shell touch {marker})" in p.stdout  # DAWNBENCH_IFACE: taken as text, not run
    out = _make("reproduce-158s", "DAWNBENCH_DATA=/env/imagenet", "DAWNBENCH_PORT=29777")
    assert "--port '29777'" in out and "'data.root=/env/imagenet'" in out


def test_make_reproduce_without_author_fails_in_one_line_before_any_host(tmp_path):
    """`make reproduce-158s HOSTS=... DATA=...` without dawnbench.author: one line with the fix, exit 2, no host
    contacted (the hosts do not exist); `--dry-run` catches it too."""
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("".join(f"node{i:02d}.invalid slots=8\n" for i in range(1, 17)))
    for extra in ([], ["LAUNCH_ARGS=--dry-run"]):
        p = subprocess.run(
            ["make", "-s", "--no-print-directory", "-o", ".venv/.installed", f"PY={sys.executable}", "reproduce-158s"]
            + [f"HOSTS={hostfile}", "DATA=/data/imagenet", f"RUN_DIR={tmp_path}/run", *extra],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode != 0
        errors = [ln for ln in p.stderr.splitlines() if ln.startswith("launch:")]
        assert errors == [
            "launch: error: dawnbench.author and dawnbench.author_email required by configs/dawnbench_158s.yaml "
            "(dawnbench.require: true, the entry names who ran it): add dawnbench.author=... "
            'dawnbench.author_email=... to the overrides (make: OVERRIDES="dawnbench.author=... '
            'dawnbench.author_email=..."), or dawnbench.require=false for a run without an entry'
        ]
        assert "[node01" not in p.stdout and not (tmp_path / "run").exists()


def test_split_overrides_keeps_values_with_spaces():
    from recipes.config import split_overrides

    assert split_overrides("optim.lr=24 run.seed=1") == ["optim.lr=24", "run.seed=1"]
    assert split_overrides("data.roots={160: /d/i 160, 128: /d/x} phases.0.root=160") == [
        "data.roots={160: /d/i 160, 128: /d/x}",
        "phases.0.root=160",
    ]
    assert split_overrides("dawnbench.hardware='16 x a=b (8 V100)' x.y=1") == [
        "dawnbench.hardware='16 x a=b (8 V100)'",
        "x.y=1",
    ]


def test_launcher_probe_tells_a_shared_run_directory(tmp_path):
    from launcher.checks import describe_run_dir, probe_shared_run_dir

    hosts = [Host("host-a", "127.0.0.1"), Host("host-b", "127.0.0.1")]
    job = _job(hosts=hosts, transport=Local(), workdir=str(ROOT), run_dir=str(tmp_path / "run"))
    seen, unseen = probe_shared_run_dir(job, 60)
    assert (seen, unseen) == (["host-a", "host-b"], [])
    assert list((tmp_path / "run").iterdir()) == []  # the token is removed
    assert "is shared by all 2 host(s)" in describe_run_dir(job, seen, unseen)
    text = describe_run_dir(job, ["host-a"], ["host-b"])
    assert "is NOT shared (host-b did not see a token written on host-a)" in text and "rank 0" in text
    assert job.commands()[0][1].count(f"DAWNBENCH_RDZV_ENDPOINT={job.endpoint}") == 1


def test_torchrun_waits_as_long_as_the_guard_before_killing_a_rank():
    """A preempted rank writing its checkpoint gets the whole --grace from torchrun too (not its 30 s default)."""
    for grace, want in ((120, "120"), (7.5, "8"), (0, "0")):
        argv = _job(grace=grace).torchrun_argv(0)
        assert argv[argv.index("--shutdown-timeout") + 1] == want
        guard = shlex.split(_job(grace=grace).commands()[0][1].split(" && exec ", 1)[1])
        assert guard[guard.index("--grace") + 1] == f"{grace:g}"


def test_a_rank_killed_under_real_torchrun_is_named_and_exits_137(tmp_path):
    """torchrun itself exits 1 when a rank dies; its report (read from this torch's real output) gives the launcher
    the rank, its host and SIGKILL, and the launcher exits with the runbook's 137."""
    import io

    from launcher.failures import RERUN_ENV
    from launcher.job import run

    script = tmp_path / "die.py"
    script.write_text(
        "import os, signal, time\n"
        "if os.environ['RANK'] == '1':\n    time.sleep(0.5)\n    os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(60)\n"
    )
    cmd = shlex.join([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"])
    host = Host("node01", addr="127.0.0.1")
    job = Job(hosts=[host], transport=Local(), config="", overrides=[], run_dir="", procs_per_host=2, grace=5.0)
    job.env[RERUN_ENV] = "the same command"
    job.commands = lambda: [(host, f"{cmd} {shlex.quote(str(script))}")]
    out = io.StringIO()
    assert run(job, tmp_path / "launch", out) == 137
    console = out.getvalue()
    assert "failed: rank 1 (local_rank: 1) on " in console and ": killed by SIGKILL" in console
    assert "Traceback" not in console and "ChildFailedError" in (tmp_path / "launch" / "000-node01.log").read_text()
