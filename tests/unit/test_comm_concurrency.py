"""recipes/comm/concurrency.py and the engine's two modes: the written rule (docs/allreduce.md, "Concurrency")
checked on a fake process group that records when each collective is issued and completes, the start-up checks
that refuse unsafe settings, and three GPU defects reproduced on CPU with fakes (serialize's streams, the
communicator probe, an unused channels_last parameter's gradient)."""

from __future__ import annotations

import contextlib
import threading
import time
from functools import partial

import pytest
import torch
import torch.distributed as td
from torch import nn

from base.errors import CommError, ConfigError
from recipes.comm import concurrency as cc
from recipes.comm.engine import _Engine
from recipes.comm.multistream import MultiStreamBackend
from recipes.comm.plan import Settings, build_plan, grad_specs
from recipes.config import load_config
from recipes.distributed import DistInfo

SAFE_NCCL = cc.Facts("nccl", {cc.ORDER_ENV: "1"}, (2, 30, 7), 13000, 13000, False)


# -- the start-up decision -------------------------------------------------------------------------------------
def test_default_is_auto_and_overlaps_only_where_the_rule_holds():
    assert load_config(None, ["comm.backend=multistream"]).comm.concurrency == "auto"
    assert cc.decide("auto", cc.Facts("gloo", {})).mode == "overlap"
    assert cc.decide("auto", SAFE_NCCL).mode == "overlap"
    assert cc.decide("overlap", SAFE_NCCL).mode == "overlap"
    assert cc.decide("serialize", SAFE_NCCL).mode == "serialize"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"env": {cc.ORDER_ENV: "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}}, "CUDA_DEVICE_MAX_CONNECTIONS=1"),
        ({"env": {cc.ORDER_ENV: "0"}}, f"{cc.ORDER_ENV}=0"),
        ({"env": {}}, f"{cc.ORDER_ENV}=(unset)"),
        ({"env": {cc.ORDER_ENV: "1", "NCCL_LAUNCH_MODE": "GROUP"}}, "NCCL_LAUNCH_MODE=GROUP"),
        ({"mps": True}, "CUDA MPS is active"),
        ({"nccl_version": (2, 21, 5)}, "NCCL 2.21.5 has no NCCL_LAUNCH_ORDER_IMPLICIT"),
        ({"cuda_driver": 12020}, "CUDA 12020 < 12030"),
    ],
)
def test_overlap_refuses_and_auto_falls_back_where_the_rule_breaks(change, named):
    facts = cc.Facts(**{**SAFE_NCCL.__dict__, **change})
    with pytest.raises(ConfigError) as e:
        cc.decide("overlap", facts)
    assert "\n" not in str(e.value) and named in str(e.value) and "comm.concurrency=serialize" in str(e.value)
    d = cc.decide("auto", facts)
    assert d.mode == "serialize" and named in d.why and "auto fell back" in d.why


def test_ranks_with_different_facts_run_the_same_mode_and_the_log_names_the_host_that_differed():
    """Each rank computes `agree` from the same all-gathered facts: an old driver on one host serializes every rank,
    and the line names that host; graph-serial reasons of one host count for all."""
    old = cc.Facts(**{**SAFE_NCCL.__dict__, "cuda_driver": 12020})  # R535: CUDA 12.2
    hosts = ["node-a", "node-b"]
    for facts in ([SAFE_NCCL, old], [old, SAFE_NCCL]):
        mode, graph = cc.agree("auto", facts, hosts)
        bad = facts.index(old)
        assert mode.mode == "serialize" and mode.why == (
            "serialize (auto fell back): CUDA 12020 < 12030: NCCL orders communicators by completion there, so "
            f"they would not overlap anyway (on {hosts[bad]}, rank {bad}; 1 other rank(s) could overlap, and every "
            "rank serializes with it)"
        )
        assert graph == [f"CUDA driver 12020 < 12090 serializes communicators in a graph (on {hosts[bad]}, rank {bad})"]
    assert cc.agree("auto", [SAFE_NCCL, SAFE_NCCL], hosts) == (cc.decide("auto", SAFE_NCCL), [])
    with pytest.raises(ConfigError, match=r"comm.concurrency=overlap: .* \(on node-b, rank 1\)$"):
        cc.agree("overlap", [SAFE_NCCL, old], hosts)


def test_the_order_variable_is_set_before_the_group_unless_the_user_set_it(monkeypatch):
    assert cc.process_env("auto", {}) == {cc.ORDER_ENV: "1"} == cc.process_env("overlap", {})
    assert cc.process_env("auto", {cc.ORDER_ENV: "0"}) == {}  # the user's value wins (and decide() judges it)
    assert cc.process_env("serialize", {}) == {}
    monkeypatch.delenv(cc.ORDER_ENV, raising=False)
    monkeypatch.setenv("RANK", "1")
    env = MultiStreamBackend.process_env(load_config(None, ["comm.backend=multistream"]).comm)
    assert env[cc.ORDER_ENV] == "1"


# -- the rule on a fake process group --------------------------------------------------------------------------
class _Recorder:
    """td.all_reduce stand-in: a collective takes `seconds`, wait() blocks until it is done; records
    (communicator, buffer offset, issued, done) for every call."""

    def __init__(self, groups: list, seconds: float = 0.03):
        self.groups, self.seconds, self.calls, self.lock = groups, seconds, [], threading.Lock()

    def __call__(self, tensor, group=None, async_op=False):
        rec = {"k": self.groups.index(group), "ptr": tensor.data_ptr(), "issued": time.perf_counter()}
        rec["done"] = rec["issued"] + self.seconds
        with self.lock:
            self.calls.append(rec)

        class Work:
            def wait(self_inner):
                time.sleep(max(0.0, rec["done"] - time.perf_counter()))
                return True

        return Work()


class _Net(nn.Module):
    def __init__(self, n: int = 6):
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.randn(1000)) for _ in range(n)])

    def forward(self, order):
        return sum(self.ps[i].sum() for i in order)


def _engine(model, serialize, k=3, s=2, bucket_mb=0.008):
    specs, params = grad_specs(model)
    plan = build_plan(specs, Settings(bucket_mb, k, s), "none")
    groups = [object() for _ in range(k)]
    eng = _Engine(plan, params, groups, 1, serialize, 30.0)
    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(partial(lambda i, _p: eng.grad_ready(i), i))
    return eng, plan, groups


def _plan_order(eng, plan):
    return [
        (plan.communicator(b, j), eng.wire[b][lo:hi].data_ptr())
        for b in range(len(plan.buckets))
        for j, (lo, hi) in enumerate(eng.slices[b])
    ]


@pytest.mark.parametrize("mode", ["serialize", "overlap"])
def test_collectives_follow_plan_order_whatever_order_gradients_arrive(monkeypatch, mode):
    model = _Net()
    eng, plan, groups = _engine(model, mode == "serialize")
    assert len(plan.buckets) == 3 and plan.streams == 3
    rec = _Recorder(groups)
    monkeypatch.setattr(td, "all_reduce", rec)
    seqs = []
    for order in ([0, 1, 2, 3, 4, 5], [5, 3, 1, 0, 2, 4]):  # two "ranks" whose gradients arrive differently
        rec.calls.clear()
        model.zero_grad(set_to_none=True)
        model(order).backward()
        seqs.append([(c["k"], c["ptr"]) for c in rec.calls])
    assert seqs[0] == seqs[1] == _plan_order(eng, plan)  # same issue order on every rank: the plan's
    calls = sorted(rec.calls, key=lambda c: c["issued"])
    overlapping = sum(b["issued"] < a["done"] - 1e-4 for a, b in zip(calls, calls[1:], strict=False))
    if mode == "serialize":  # never two in flight, over all communicators
        assert overlapping == 0
    else:  # the K communicators run at once
        assert overlapping >= 2
    eng.close()


def test_serialize_waits_on_its_own_stream_never_backwards(monkeypatch):
    """On a GPU, serialize must neither make backward's stream wait for a slice nor synchronise it (that stalled
    backward behind every slice): the slice waits for its bucket and completes on the helper's side stream."""
    log = []

    class Stream:
        def __init__(self, name):
            self.name = name

        def wait_event(self, e):
            log.append((self.name, "wait_event"))

        def wait_stream(self, s):
            log.append((self.name, f"wait_stream {s.name}"))

        def synchronize(self):
            log.append((self.name, "synchronize"))

    main, side, cur = Stream("main"), Stream("side"), {}
    cur["s"] = main

    @contextlib.contextmanager
    def stream(s):
        prev, cur["s"] = cur["s"], s
        try:
            yield
        finally:
            cur["s"] = prev

    class Event:
        def synchronize(self):
            log.append(("host", "event.synchronize"))

    class FakeCudaTensor:
        is_cuda = True

    def all_reduce(tensor, group=None, async_op=False):
        log.append((cur["s"].name, "all_reduce"))

        class Work:
            def wait(self):
                log.append((cur["s"].name, "work.wait"))

        return Work()

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: cur["s"])
    monkeypatch.setattr(torch.cuda, "stream", stream)
    monkeypatch.setattr(td, "all_reduce", all_reduce)
    eng, _, _ = _engine(_Net(2), serialize=True, k=1, s=1, bucket_mb=1.0)
    eng._side = side  # what __init__ makes on a CUDA device
    eng._queue.put((0, 0, 0, FakeCudaTensor(), Event()))
    eng._queue.join()
    assert eng._error is None, eng._error
    assert ("side", "all_reduce") in log and ("side", "work.wait") in log and ("side", "synchronize") in log
    assert not [e for e in log if e[0] == "main"], log  # backward's stream untouched
    assert ("host", "event.synchronize") not in log  # the side stream waits for the bucket, not the host
    eng.close()


# -- the communicator probe ------------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [3, 5, 7])
def test_communicator_probe_is_exact_for_odd_world_sizes_and_many_communicators(monkeypatch, world):
    cfg = load_config(None, ["comm.backend=multistream", "run.device=cpu"])
    backend = MultiStreamBackend(
        cfg.comm, DistInfo(0, world, 0, 1, torch.device("cpu")), timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name
    )
    monkeypatch.setattr(td, "new_group", lambda **kw: object())
    monkeypatch.setattr(td, "all_reduce", lambda t, group=None, async_op=False: t.mul_(world))  # W equal ranks
    backend._create_groups(24)  # W^24 is far beyond float32's exact integers
    assert len(backend.groups) == 24
    calls = {"n": 0}

    def one_short(t, group=None, async_op=False):
        calls["n"] += 1
        return t.mul_(world - 1 if calls["n"] == 5 else world)  # communicator 4 lost a rank

    monkeypatch.setattr(td, "all_reduce", one_short)
    with pytest.raises(CommError, match=f"communicator 4 summed {world - 1} ones, expected its size {world}"):
        backend._create_groups(8)


# -- an unused channels_last parameter --------------------------------------------------------------------------
def test_unused_parameter_gets_a_gradient_in_its_own_memory_format(monkeypatch):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = nn.Parameter(torch.randn(8))
            self.unused = nn.Parameter(torch.randn(4, 3, 3, 3).contiguous(memory_format=torch.channels_last))

        def forward(self):
            return self.used.sum()

    model = Net()
    eng, _, groups = _engine(model, serialize=False, k=1, s=1, bucket_mb=1.0)
    monkeypatch.setattr(td, "all_reduce", _Recorder(groups, 0.0))
    model().backward()
    g = model.unused.grad
    assert g is not None and torch.count_nonzero(g) == 0
    assert g.stride() == model.unused.stride()  # CUDA's fused SGD rejects a gradient of another layout
    assert g.is_contiguous(memory_format=torch.channels_last)
    eng.close()


def test_probe_on_a_cuda_machine_reads_the_driver_through_the_driver_api(monkeypatch):
    """Found on an H200 (torch 2.11): torch._C._cuda_getDriverVersion does not exist, and probe() crashed every
    multistream run over NCCL. The driver's version comes from libcuda's cuDriverGetVersion instead."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 28, 9))
    monkeypatch.setattr(cc, "cuda_driver_version", lambda: 13000)
    facts = cc.probe("nccl")
    assert facts.nccl_version == (2, 28, 9) and facts.cuda_driver == 13000


def test_driver_version_without_a_driver_library_is_none():
    assert cc.cuda_driver_version("libcuda-that-does-not-exist.so.1") is None
