"""How a shell command reaches a host: a transport turns (host, command) into the local argv that runs it there.

Every transport keeps the remote command's stdin connected to ours (the per-host guard stops its job when that
stdin closes) and passes its exit status back.
"""

from __future__ import annotations

import os
import shlex

from launcher.hosts import Host

DEFAULT_SSH = (
    "ssh -o BatchMode=yes -o ConnectTimeout=10 -o StrictHostKeyChecking=accept-new "
    "-o ServerAliveInterval=15 -o ServerAliveCountMax=4"
)


class Local:
    """The host is this machine: run the command with `sh -c` (two "hosts" on loopback in tests)."""

    name = "local"

    def argv(self, host: Host, command: str) -> list[str]:
        return ["sh", "-c", command]

    def failure(self, rc: int) -> str | None:
        return None


class Ssh:
    """`ssh [-p PORT] HOST 'sh -c COMMAND'`; BatchMode: a host that asks for a password fails instead of hanging."""

    name = "ssh"

    def __init__(self, ssh: str = DEFAULT_SSH, port: int | None = None):
        self.ssh = shlex.split(ssh)
        self.port = port

    def argv(self, host: Host, command: str) -> list[str]:
        port = ["-p", str(self.port)] if self.port else []
        # Wrapped in `sh -c` so the command means the same whatever the remote user's login shell is.
        return [*self.ssh, *port, host.name, "sh -c " + shlex.quote(command)]

    def failure(self, rc: int) -> str | None:
        return "ssh could not connect or lost the connection (exit 255)" if rc == 255 else None


class Slurm:
    """One `srun` step per host inside the current allocation (`--nodelist HOST`, one task, all of its CPUs)."""

    name = "slurm"

    def __init__(self, srun_args: str = "", env: dict | None = None):
        env = os.environ if env is None else env
        self.extra = shlex.split(srun_args)
        cpus = env.get("SLURM_CPUS_ON_NODE", "")
        # A step gets one CPU per task unless told otherwise; torchrun's workers and the data loaders need them all.
        self.cpus = [f"--cpus-per-task={cpus}"] if cpus.isdigit() else []

    def argv(self, host: Host, command: str) -> list[str]:
        return [
            "srun",
            "--unbuffered",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={host.name}",
            "--kill-on-bad-exit=1",
            *self.cpus,
            *self.extra,
            "sh",
            "-c",
            command,
        ]

    def failure(self, rc: int) -> str | None:
        return None


class Netns:
    """The host is a Linux network namespace on this machine (`ip netns exec HOST`): the network lab."""

    name = "netns"

    def argv(self, host: Host, command: str) -> list[str]:
        return ["ip", "netns", "exec", host.name, "sh", "-c", command]

    def failure(self, rc: int) -> str | None:
        return None


TRANSPORTS = ("ssh", "local", "slurm", "netns")


def create_transport(name: str, ssh: str = DEFAULT_SSH, ssh_port: int | None = None, srun_args: str = ""):
    if name == "ssh":
        return Ssh(ssh, ssh_port)
    if name == "local":
        return Local()
    if name == "slurm":
        return Slurm(srun_args)
    if name == "netns":
        return Netns()
    raise ValueError(f"--transport: unknown transport '{name}' (expected one of {', '.join(TRANSPORTS)})")
