"""Which machines a job runs on: a hostfile, a `--hosts` list, or the SLURM allocation it runs inside.

Hostfile (the MPI/Horovod format, plus an optional address): one host per line, `#` starts a comment.

    node01 slots=8                 # ssh target node01, 8 GPUs
    node02 slots=8 addr=10.0.0.2   # reach it over ssh as node02, but rendezvous/NCCL traffic uses 10.0.0.2

`slots` is the number of processes (GPUs) on the host, `addr` the address other hosts use to reach it (default:
the host name). `--hosts node01:8,node02:8` says the same on the command line.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


class HostError(ValueError):
    """A host list that cannot be used; the message names the file, line and problem."""


@dataclass(frozen=True)
class Host:
    name: str  # what the transport connects to (ssh target, SLURM node name, network namespace)
    addr: str  # what the other hosts connect to (rendezvous endpoint, --local-addr)
    slots: int | None = None  # processes on this host, when the host list says so


_NAME = re.compile(r"[A-Za-z0-9_.\-@]+")
# An address other hosts connect to: an IP address, or a DNS name (RFC 1123 labels).
_DNS = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9\-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9\-]{0,61}[A-Za-z0-9])?)*"
)


def _check_addr(addr: str, where: str) -> str:
    try:
        ipaddress.ip_address(addr)
        return addr
    except ValueError:
        pass
    if _DNS.fullmatch(addr) and not re.fullmatch(r"[0-9.]+", addr):
        return addr
    raise HostError(f"{where}: addr '{addr}' is not an IP address or a host name")


def _host(name: str, slots: int | None, addr: str | None, where: str) -> Host:
    if not _NAME.fullmatch(name) or name.startswith("-"):
        raise HostError(f"{where}: '{name}' is not a host name")
    machine = name.split("@")[-1]
    if not any(c.isalnum() for c in machine) or ".." in machine:
        # '...' (a placeholder copied from an example) would be tried as a host: say so before any ssh
        raise HostError(f"{where}: '{name}' is not a host name (a placeholder? list one line per machine)")
    if slots is not None and slots < 1:
        raise HostError(f"{where}: slots must be a positive integer, got {slots}")
    return Host(name, addr or name.split("@")[-1], slots)


def _int(text: str, where: str, what: str) -> int:
    # ASCII digits only: int() also reads '٣' (Arabic-Indic 3) and '1_000', which no hostfile means
    if not re.fullmatch(r"[0-9]{1,6}", text):
        raise HostError(f"{where}: {what} must be an integer, got {ascii(text)} (ASCII digits, at most 6)")
    return int(text)


def parse_hostfile(path: str | Path) -> list[Host]:
    """Hosts of a hostfile (see the module docstring); duplicates and unknown fields are errors."""
    path = Path(path)
    if not path.is_file():
        raise HostError(f"{path}: hostfile not found")
    from base import reader  # the launcher puts the repository on sys.path before it reads a hostfile

    data = reader.read_bytes(path, what="hostfile", error=HostError, max_bytes=1 << 20)  # a regular file, <= 1 MiB
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HostError(
            f"{path}: not a UTF-8 text file (byte {e.start}): expected 'host [slots=N] [addr=IP]' lines"
        ) from None
    hosts: list[Host] = []
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{no}"
        name, *fields = line.split()
        slots = addr = None
        given: set[str] = set()
        for f in fields:
            key, sep, value = f.partition("=")
            if not sep or not value:
                raise HostError(f"{where}: expected key=value after the host name, got '{f}' (slots=N or addr=IP)")
            if key not in ("slots", "max_slots", "addr"):
                raise HostError(f"{where}: unknown field '{key}' (known: slots, addr)")
            if key in given:
                raise HostError(f"{where}: {key} is given twice; give it once")
            given.add(key)
            if key in ("slots", "max_slots"):
                if {"slots", "max_slots"} <= given:
                    raise HostError(f"{where}: slots and max_slots both given; give slots=N once")
                slots = _int(value, where, "slots")
            else:
                addr = _check_addr(value, where)
        hosts.append(_host(name, slots, addr, where))
    if not hosts:
        raise HostError(f"{path}: no hosts in the hostfile")
    _no_duplicates(hosts, str(path))
    return hosts


def parse_host_list(text: str) -> list[Host]:
    """`node01:8,node02:8` (or without `:slots`)."""
    hosts = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            raise HostError(f"--hosts '{text}': empty entry")
        name, slots = item, None
        if ":" in item:
            name, text_slots = item.rsplit(":", 1)
            slots = _int(text_slots, f"--hosts '{text}'", "slots")
        hosts.append(_host(name, slots, None, f"--hosts '{text}'"))
    _no_duplicates(hosts, "--hosts")
    return hosts


def _no_duplicates(hosts: list[Host], where: str) -> None:
    seen: set[str] = set()
    for h in hosts:
        if h.name in seen:
            raise HostError(f"{where}: host '{h.name}' is listed twice (give it slots=N instead)")
        seen.add(h.name)


def expand_nodelist(text: str) -> list[str]:
    """Expand a SLURM node list: `gpu[01-03,07],cpu5,r[1-2]n[1-2]` -> gpu01 gpu02 gpu03 gpu07 cpu5 r1n1 ..."""
    names: list[str] = []
    for item in _split_top(text, ","):
        parts = re.split(r"(\[[^\]]*\])", item)
        expanded = [""]
        for part in parts:
            if part.startswith("["):
                choices = []
                for rng in part[1:-1].split(","):
                    lo, sep, hi = rng.partition("-")
                    if not sep:
                        choices.append(lo)
                        continue
                    if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
                        raise HostError(f"SLURM node list '{text}': bad range '{rng}'")
                    choices += [str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1)]
                expanded = [e + c for e in expanded for c in choices]
            elif "[" in part or "]" in part:
                raise HostError(f"SLURM node list '{text}': unbalanced brackets in '{item}'")
            else:
                expanded = [e + part for e in expanded]
        names += [e for e in expanded if e]
    return names


def _split_top(text: str, sep: str) -> list[str]:
    """Split on `sep` outside brackets."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == sep and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [s.strip() for s in out if s.strip()]


def slurm_hosts(env: dict | None = None) -> list[Host] | None:
    """The nodes of the SLURM allocation we run in (None outside one); `scontrol` expands the list when present."""
    env = os.environ if env is None else env
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        return None
    names = None
    if shutil.which("scontrol"):
        p = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
        if p.returncode == 0 and p.stdout.split():
            names = p.stdout.split()
    if names is None:
        names = expand_nodelist(nodelist)
    return [Host(n, n, None) for n in names]
