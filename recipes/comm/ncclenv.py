"""NCCL's multi-flow settings from the config (`comm.nccl_preset`, `comm.nccl_socket_nthreads`,
`comm.nccl_nsocks_perthread`, `comm.nccl_min_nchannels`), set in every rank's own environment before its
process group exists.

NCCL's socket transport opens NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD TCP connections per peer and channel
(their product is at most 64), and a ring runs one connection set per channel (NCCL_MIN_NCHANNELS raises the
channel count). So one NCCL communicator can already put several flows on the wire; that is the baseline
multistream must beat. Every rank loads the same config, so setting the variables in-process reaches all ranks
without a launcher change. A variable already in the environment wins and is logged.
"""

from __future__ import annotations

import os

from base.errors import ConfigError
from base.registry import NCCL_PRESETS

PRESETS = NCCL_PRESETS  # names and values: base/registry.py
KEYS = {
    "nccl_socket_nthreads": "NCCL_SOCKET_NTHREADS",
    "nccl_nsocks_perthread": "NCCL_NSOCKS_PERTHREAD",
    "nccl_min_nchannels": "NCCL_MIN_NCHANNELS",
}
NCCL_MAX_SOCKETS = 64  # NCCL: NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD


def settings(comm) -> dict[str, int]:
    """{NCCL variable: value} from comm's preset and explicit keys (explicit keys override the preset)."""
    name = comm.nccl_preset
    if name not in PRESETS:
        raise ConfigError(f"comm.nccl_preset: unknown preset '{name}' (expected one of {', '.join(PRESETS)})")
    out = {var: v for var, v in zip(KEYS.values(), PRESETS[name], strict=True) if v is not None}
    for key, var in KEYS.items():
        v = getattr(comm, key)
        if v is None:
            continue
        if not isinstance(v, int) or v < 1:
            raise ConfigError(f"comm.{key}: expected a positive integer, got {v!r}")
        out[var] = v
    threads, socks = out.get("NCCL_SOCKET_NTHREADS", 1), out.get("NCCL_NSOCKS_PERTHREAD", 1)
    if threads * socks > NCCL_MAX_SOCKETS:
        raise ConfigError(
            f"comm.nccl_socket_nthreads x comm.nccl_nsocks_perthread: expected at most {NCCL_MAX_SOCKETS} "
            f"(NCCL's limit), got {threads} x {socks}"
        )
    return out


def flows_per_connection(comm, environ=os.environ) -> int:
    """TCP flows one NCCL channel opens to a peer under this config and environment (1 where unset)."""
    want = {**{k: str(v) for k, v in settings(comm).items()}, **environ}
    return int(want.get("NCCL_SOCKET_NTHREADS", 1)) * int(want.get("NCCL_NSOCKS_PERTHREAD", 1))


def process_env(comm, environ=os.environ, log=None) -> dict[str, str]:
    """The variables to set now (those the user did not set); each kept user value is logged."""
    out = {}
    for var, v in settings(comm).items():
        if var in environ:
            if environ[var] != str(v) and log is not None:
                log(f"{var}={environ[var]} from the environment kept (the config asks for {v})")
            continue
        out[var] = str(v)
    if out and log is not None:
        log("NCCL multi-flow settings: " + ", ".join(f"{k}={v}" for k, v in out.items()))
    return out


def rank0_print(msg: str) -> None:
    if os.environ.get("RANK", "0") == "0":
        print(msg, flush=True)
