"""The strongest plain-DDP baseline: NCCL's multi-flow settings from the config (recipes/comm/ncclenv.py), DDP on a
gloo group of several devices (comm.gloo_devices), compare_runs' label for it, and netlab's --hosts check."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support import ROOT

from base.errors import ConfigError
from lab import netlab
from recipes.comm import ncclenv
from recipes.config import load_config
from scripts import compare_runs


def _comm(*over):
    return load_config(None, list(over)).comm


def test_presets_and_keys_become_nccl_variables_and_the_users_environment_wins():
    assert ncclenv.settings(_comm()) == {}  # nccl-default: NCCL decides
    aws = ncclenv.settings(_comm("comm.nccl_preset=aws-ena"))
    assert aws == {"NCCL_SOCKET_NTHREADS": 2, "NCCL_NSOCKS_PERTHREAD": 8}
    over = ["comm.nccl_preset=flows-8", "comm.nccl_min_nchannels=4", "comm.nccl_socket_nthreads=4"]
    got = ncclenv.settings(_comm(*over))
    assert got == {"NCCL_SOCKET_NTHREADS": 4, "NCCL_NSOCKS_PERTHREAD": 4, "NCCL_MIN_NCHANNELS": 4}
    logged = []
    env = ncclenv.process_env(_comm("comm.nccl_preset=flows-8"), {"NCCL_NSOCKS_PERTHREAD": "1"}, logged.append)
    assert env == {"NCCL_SOCKET_NTHREADS": "2"}  # the explicit environment value is kept ...
    assert any("NCCL_NSOCKS_PERTHREAD=1 from the environment kept (the config asks for 4)" in m for m in logged)
    assert ncclenv.flows_per_connection(_comm("comm.nccl_preset=flows-8"), {"NCCL_NSOCKS_PERTHREAD": "1"}) == 2
    assert ncclenv.flows_per_connection(_comm("comm.nccl_preset=aws-ena"), {}) == 16


def test_bad_multi_flow_settings_are_one_line_config_errors():
    with pytest.raises(ConfigError, match="comm.nccl_preset"):
        load_config(None, ["comm.nccl_preset=aws"])
    with pytest.raises(ConfigError, match="at most 64 \\(NCCL's limit\\), got 16 x 8"):
        ncclenv.settings(_comm("comm.nccl_socket_nthreads=16", "comm.nccl_nsocks_perthread=8"))
    with pytest.raises(ConfigError, match="comm.gloo_devices"):
        load_config(None, ["comm.gloo_devices=0"])


def test_ddp_backend_sets_the_variables_before_the_process_group(monkeypatch):
    from recipes.comm import backend_class

    for var in ncclenv.KEYS.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "1")  # not rank 0: nothing printed
    cfg = load_config(None, ["comm.backend=ddp", "comm.nccl_preset=gcp-gvnic"])
    assert backend_class("ddp").process_env(cfg.comm) == {"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "1"}


_WORKER = textwrap.dedent(
    """
    import datetime, os, sys, json
    import torch, torch.distributed as td
    from torch import nn
    sys.path.insert(0, os.getcwd())
    from recipes.comm.ddp import DDPBackend
    from recipes.config import load_config
    from recipes.distributed import DistInfo

    def sockets():
        n = 0
        for f in os.listdir("/proc/self/fd"):
            try:
                n += os.readlink(f"/proc/self/fd/{f}").startswith("socket:")
            except OSError:
                pass
        return n

    td.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = td.get_rank()
    out = {}
    for devices in (1, 3):
        cfg = load_config(None, ["run.device=cpu", f"comm.gloo_devices={devices}", "comm.bucket_cap_mb=0.001"])
        before = sockets()
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(6)])
        dist = DistInfo(rank, 2, rank, 2, torch.device("cpu"))
        backend = DDPBackend(cfg.comm, dist, timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name)
        ddp, _ = backend.prepare(model, None)
        x = torch.full((4, 16), float(rank + 1))
        ddp(x).sum().backward()
        backend.on_step_end(0)
        g = model[0].weight.grad.clone()
        flows = backend.stats().settings["flows"]
        exact = torch.zeros_like(g)  # the mean of both ranks' gradients, each computed here without DDP
        for r in (0, 1):
            torch.manual_seed(0)
            ref = nn.Sequential(*[nn.Linear(16, 16) for _ in range(6)])
            ref(torch.full((4, 16), float(r + 1))).sum().backward()
            exact += ref[0].weight.grad / 2
            if r == rank:
                own = ref[0].weight.grad.clone()
        out[devices] = {
            "sockets": sockets() - before,
            "grad": g.sum().item(),
            "flows": flows,
            "err": (g - exact).abs().max().item(),
            "own_err": (own - exact).abs().max().item(),
            "scale": exact.abs().max().item(),
        }
    if rank == 0:
        print("RESULT " + json.dumps(out))
    td.destroy_process_group()
    """
)


def test_ddp_on_gloo_devices_gives_the_same_mean_over_several_connections(tmp_path):
    script = tmp_path / "w.py"
    script.write_text(_WORKER)
    env_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    p = subprocess.run(
        env_cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env={**_env(), "GLOO_SOCKET_IFNAME": "lo"}
    )
    assert p.returncode == 0, p.stderr[-3000:]
    import json

    res = json.loads(next(line for line in p.stdout.splitlines() if line.startswith("RESULT "))[7:])
    one, three = res["1"], res["3"]
    assert one["flows"] == 1 and three["flows"] == 3
    assert abs(one["grad"] - three["grad"]) < 1e-4  # the same average, whichever connections carried it
    for r in (one, three):
        # the exact mean up to fp32 rounding of one sum and one division (a few units in the last place) ...
        assert r["err"] <= 4 * 2**-23 * r["scale"], r
        assert r["own_err"] > 0.1 * r["scale"], r  # ... and far from this rank's own gradient: the mean was taken
    assert one["sockets"] == 0  # DDP on the default group opens nothing new
    assert three["sockets"] >= 3  # a connection per device to the peer (plus gloo's listeners)


def _env():
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1"}


def test_compare_runs_labels_a_multi_flow_ddp_run():
    def run(name, backend, settings):
        summary = {"comm_backend": backend, "world_size": 2, "comm": {"backend": backend, "settings": settings}}
        return compare_runs.Run(Path(name), summary, {}, [])

    assert compare_runs.backend_label(run("a", "ddp", {"flows": 16})) == "ddp (16 flows)"
    assert compare_runs.backend_label(run("b", "ddp", {"flows": 1})) == "ddp"
    assert compare_runs.backend_label(run("c", "multistream", {"streams": 4})) == "multistream"


def test_netlab_refuses_zero_hosts_with_one_line(capsys):
    assert netlab.main(["--hosts", "0", "--", "true"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "netlab: error: --hosts: expected 1 or more, got 0"


def test_ddp_keeps_rank_local_buffers_without_torchs_deprecation_warning(tmp_path):
    """broadcast_buffers=False (rank-local BN statistics, restored per rank from a mid-epoch checkpoint) without the
    FutureWarning torch 2.13+ prints for it on every run."""
    import datetime
    import warnings

    import torch
    import torch.distributed as td
    from torch import nn

    from recipes.comm.ddp import DDPBackend
    from recipes.distributed import DistInfo

    store = td.FileStore(str(tmp_path / "store"), 1)
    td.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    try:
        cfg = load_config(None, ["run.device=cpu", "comm.engage_single_rank=true"])
        backend = DDPBackend(cfg.comm, DistInfo(0, 1, 0, 1, torch.device("cpu")), timeout_s=60.0, model_name="x")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            ddp, _ = backend.prepare(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), None)
        assert [str(w.message) for w in seen if "broadcast_buffers" in str(w.message)] == []
        assert ddp.forward_sync_buffers is False  # still rank-local
        with warnings.catch_warnings(record=True) as seen:  # the filter is this call's only
            warnings.simplefilter("always")
            warnings.warn("`broadcast_buffers` is deprecated (elsewhere)", FutureWarning, stacklevel=1)
        assert len(seen) == 1
    finally:
        td.destroy_process_group()
