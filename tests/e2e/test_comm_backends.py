"""The allreduce backends for real: 2-4 gloo processes under torchrun (tests/comm_worker.py is one rank)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from support import ROOT, rank_results, tiny_config, torchrun  # noqa: F401

WORKER = str(ROOT / "tests" / "comm_worker.py")

# fp16/bf16 wire formats: the sum over ranks is done in the wire dtype, so each result carries a few roundings of
# the wire format. Stated tolerance, relative to the largest gradient magnitude: fp16 2^-9, bf16 2^-6.
FP16_TOL, BF16_TOL = 2.0**-9, 2.0**-6


def run_worker(tmp_path: Path, nproc: int, scenario: str, *args: str, env: dict | None = None, timeout=300):
    out = tmp_path / scenario
    out.mkdir(exist_ok=True)
    p = torchrun(nproc, [WORKER, scenario, str(out), *args], timeout=timeout, env=env)
    return rank_results(out, nproc, f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}"), p


@pytest.mark.parametrize("nproc", [2, pytest.param(3, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)])
def test_every_backend_leaves_every_rank_with_the_mean(tmp_path, nproc):
    results, _ = run_worker(tmp_path, nproc, "equal")
    exact = 1e-6  # fp32: the mean up to float32 rounding (gradients here are ~0.1)
    for r in results:
        assert r["ddp"] < exact
        assert sorted(r["multistream"]) == [f"K{k}S{s}" for k in (1, 2, 3, 4) for s in (1, 2, 3, 4)]
        for name, m in r["multistream"].items():
            assert m["vs_mean"] < exact, name
            assert m["vs_ddp"] <= 1e-7, name  # the same numbers as DDP, for every K and S
            assert m["buckets"] == 3
            s = int(name.split("S")[1])
            if s > 1:  # some buckets are cut into slices of different lengths (odd sizes)
                lengths = m["slice_lengths"]
                assert any(b - a == 1 for a, b in zip(lengths, lengths[1:], strict=False)), name
        serial = r["comm.concurrency=serialize/comm.streams=3/comm.slices=2"]
        assert serial["vs_mean"] < exact and serial["vs_ddp"] <= 1e-7
        fp16 = r["comm.compression=fp16/comm.streams=2/comm.slices=3"]
        bf16 = r["comm.compression=bf16/comm.streams=4/comm.slices=1"]
        assert 0 < fp16["vs_mean"] <= FP16_TOL * fp16["scale"]
        assert 0 < bf16["vs_mean"] <= BF16_TOL * bf16["scale"]
        assert r["unused"]["vs_mean"] < exact and r["unused"]["grad_is_zero"]
        # rank 1's facts forbid NCCL overlap, rank 0's allow it: both serialize, and the line names host-1
        assert r["facts"]["mode"] == "serialize" and r["facts"]["vs_mean"] < exact
        assert r["facts"]["why"] == (
            "serialize (auto fell back): CUDA_DEVICE_MAX_CONNECTIONS=1 (every stream shares one hardware queue, so a "
            f"waiting kernel stalls the communicators queued behind it) (on host-1, rank 1; {nproc - 1} other "
            "rank(s) could overlap, and every rank serializes with it)"
        )
        # comm.balance: after a forced re-plan to unequal shares the step is still the exact mean (fp16: within
        # its tolerance), each bucket cut in the shares' proportions, one slice per communicator
        replan = r["replan/comm.streams=3/comm.slices=2"]
        assert replan["vs_mean"] < exact and replan["vs_ddp"] <= 1e-7 and replan["replans"] == 1
        assert replan["shares"] == [600, 50, 350]
        big = max(replan["slice_lengths"], key=sum)
        assert [round(1000 * x / sum(big)) for x in big] == pytest.approx([600, 50, 350], abs=2)
        replan16 = r["replan/comm.compression=fp16/comm.streams=2/comm.slices=3"]
        assert 0 < replan16["vs_mean"] <= FP16_TOL * replan16["scale"] and replan16["shares"] == [850, 150]
    # every rank derived the same plans and ended with the same gradients
    for name in results[0]["multistream"]:
        assert len({r["multistream"][name]["digest"] for r in results}) == 1


def test_every_registered_backend_gives_the_mean_within_its_wire_formats_rounding(tmp_path):
    """Each backend torchrun starts (base/registry.py), on 2 gloo ranks: the exact mean where it sends the gradients'
    own dtype, within the wire format's rounding where its record says it sends bf16 or fp16 (ddp_bf16's hook), and
    the same gradients on every rank."""
    from base import registry

    results, _ = run_worker(tmp_path, 2, "records")
    tol = {"none": 1e-6, "fp16": FP16_TOL * results[0]["scale"], "bf16": BF16_TOL * results[0]["scale"]}
    names = [n for n, r in registry.ALLREDUCE_BACKENDS.items() if r.launcher == "torchrun"]
    for name in names:
        for r in results:
            wire = r[name]["wire"]
            assert r[name]["vs_mean"] <= tol[wire], (name, wire, r[name]["vs_mean"])
            assert wire == "none" or r[name]["vs_mean"] > tol["none"], name  # a lossy wire format does round
        assert len({r[name]["digest"] for r in results}) == 1, name


def test_tuner_decisions_are_identical_on_all_ranks_and_cached(tmp_path):
    cache = tmp_path / "tune.json"
    results, p = run_worker(tmp_path, 2, "tune", f"comm.tune_cache={cache}", "comm.balance=true")
    a, b = results
    assert a["sequence"] == b["sequence"]  # every rank switched plan at the same step, to the same settings
    # comm.balance with the tuner: the balancer starts once the tuner has chosen, over the winner's K communicators
    assert all(k is None for done, k in a["balancing"] if not done)
    assert a["balancing"][-1] == [True, a["sequence"][-1][1]]
    assert a["trials"] == b["trials"] == 4 and a["done"] and b["done"]
    assert len({tuple(s) for s in a["sequence"]}) >= 3  # it really tried several plans
    assert a["max_err"] < 1e-6  # and gradients stayed exact through the switches
    winner = a["sequence"][-1]
    assert {k: a["state"][k] for k in ("bucket_mb", "streams", "slices")} == dict(
        zip(("bucket_mb", "streams", "slices"), winner, strict=True)
    )
    data = json.loads(cache.read_text())
    (key,) = data
    assert key.startswith("model=") and "|world=2|pg=gloo|dtype=float32|wire=none|net=" in key
    assert [data[key][k] for k in ("bucket_mb", "streams", "slices")] == winner
    assert len(data[key]["candidates"]) == 4
    medians = [c["median_step_s"] for c in data[key]["candidates"]]
    assert data[key]["median_step_s"] == min(medians)
    # the next run starts from the cached winner without tuning
    assert not a["second_tuner"] and not b["second_tuner"]
    assert a["second_settings"] == b["second_settings"] == winner
    assert "candidate 4:" in p.stdout and "winner after 4 candidates" in p.stdout


def test_balancer_ranks_agree_on_every_replan_never_inside_a_step_and_resume_keeps_the_plan(tmp_path):
    """comm.balance, 2 gloo ranks, each rank fed different figures (tests/comm_worker.py BALANCE_RATES, noise of its
    own): the one collective at each window's end makes every rank install the same plan at the same step."""
    results, p = run_worker(tmp_path, 2, "balance")
    a, b = results
    assert a["sequence"] == b["sequence"]  # the same plan after every step, on both ranks
    versions = [v for v, _ in a["sequence"]]
    assert versions[0] == 0 and versions[-1] >= 1  # it re-planned
    shares = a["sequence"][-1][1]
    assert shares[1] < shares[2] < shares[0]  # the slow communicator carries least, in the rates' order
    assert [round(x / sum(shares), 2) for x in shares] == pytest.approx([1 / 2.1, 0.3 / 2.1, 0.8 / 2.1], abs=0.03)
    assert a["max_err"] < 1e-6 and b["max_err"] < 1e-6  # exact through the re-plans
    assert a["inside_calls"] == 12 and a["inside_changed"] == 0  # no re-plan from inside backward
    # the plan's identity is the capture key; measuring blocks capture until the balancer settles
    changes = [i for i in range(1, 12) if a["keys"][i] != a["keys"][i - 1]]
    assert changes == [i for i in range(1, 12) if versions[i] != versions[i - 1]]
    assert a["blockers"][0] == "the multistream balancer measures eager steps" and a["blockers"][-1] is None
    assert a["stats"]["balance_replans"] == versions[-1] and a["stats"]["shares"] == shares
    assert a["state"]["balance"]["shares"] == shares
    assert a["resumed_digest"] == a["digest"] == b["resumed_digest"]  # resumed: the uninterrupted run's plan
    assert a["resumed_measuring"] is None  # and its settled state: nothing measured again
    assert "multistream balance: re-plan 1 at step" in p.stdout and "communicator 1 delivers" in p.stdout
    assert "a slow path" in p.stdout and "multistream balance: settled at step" in p.stdout


def test_hop_ring_is_the_exact_mean_and_every_rank_installs_the_same_hop_plan(tmp_path):
    """comm.balance_level=hop, 3 gloo ranks (a ring with three distinct hops): exact with equal shares and after a
    forced re-plan to a table whose every host cuts its chunks differently; the balancer on each rank's own
    measurements re-plans, and every rank holds the same plan after every step."""
    results, p = run_worker(tmp_path, 3, "hop")
    exact = 1e-6
    for r in results:
        assert r["even"]["vs_mean"] < exact and r["even"]["table"] == [[334, 333, 333]] * 3
        replan = r["replan/comm.streams=3"]
        assert replan["vs_mean"] < exact and replan["replans"] == 1
        assert replan["table"] == [[600, 50, 350], [100, 300, 600], [334, 333, 333]]
        fp16 = r["replan/comm.compression=fp16/comm.streams=3"]
        assert 0 < fp16["vs_mean"] <= FP16_TOL * fp16["scale"]
        assert r["max_err"] < exact  # exact through the balancer's own re-plans
        assert r["stats"]["balance_level"] == "hop" and len(r["stats"]["shares"]) == 3
        assert r["resumed_same"]
        assert r["reverted"] == [True, True]  # a re-plan the step time did not confirm is taken back, and it settles
        # ranks whose clocks read 1, 2 and 3 s a step judge a trial against 1.5 s on the slowest: all take it back
        assert r["clocks_differ"] == [[[213, 787], [500, 500], [787, 213]], True]  # the table before the trial
        # proportional re-plans predicting nothing, a stretched table (s x (s / mean)^0.25) is tried, as a trial
        assert r["stretched"] == [[[213, 787], [500, 500], [787, 213]], 1, True]
    assert results[0]["digests"] == results[1]["digests"] == results[2]["digests"]
    assert [r["links"] for r in results] == [2, 2, 2]  # each rank found its TCP connection on both communicators
    for r in results:  # while measuring, each ring step takes the connections from the right neighbour (not those to
        q = r["quickacked"]  # the left) out of delayed-ACK mode; never in a step that is not measured
        assert len(q["recv"]) == 2 and q["measured"] == q["recv"] and not set(q["recv"]) & set(q["send"])
        assert q["unmeasured"] == []
    # each rank's connections to its left neighbour deliver 1/3, 2/2 and 3/1 MB/s (comm_worker.PATH_MB_S): after
    # step 3 (step 1 unmeasured, 2 skipped) every hop is cut in their proportion, with the 2% floor
    assert results[0]["digests"][2][2] == [[260, 740], [500, 500], [740, 260]]
    assert "multistream balance: re-plan 1 at step 3: hop shares 260/740 500/500 740/260" in p.stdout
    assert "did not shorten the step" in p.stdout and "back to hop shares" in p.stdout
    assert "hop shares 213/787 500/500 787/213 (stretch 1 of at most 3: the next window's step decides)" in p.stdout


def test_hop_ring_at_two_ranks_sends_each_way_on_connections_of_its_own(tmp_path):
    """comm.balance_level=hop, 2 gloo ranks: 4 communicators for K = 2, each rank sends on 2 and receives on the other
    2, so every connection carries pieces one way (a connection's ACKs would otherwise wait behind its other
    direction); exact after a re-plan whose two hosts cut differently."""
    results, _ = run_worker(tmp_path, 2, "hop_two")
    a, b = results
    for r in results:
        assert r["vs_mean"] < 1e-6 and r["table"] == [[700, 300], [150, 850]]
        assert r["one_way"] and r["groups"] == [2, 2, 4]
        sent, received = r["sent"][:2], r["sent"][2:]
        assert min(sent) > 4000 and max(received) < 0.05 * min(sent)  # on the receiving ones, only gloo's notices
    # rank 0's sending connections are rank 1's receiving ones, and the other way round
    assert [e[::-1] for e in a["ends"][:2]] == b["ends"][2:] and [e[::-1] for e in a["ends"][2:]] == b["ends"][:2]


def test_model_start_takes_the_link_probes_file_and_a_bad_one_stops_every_rank(tmp_path):
    """comm.network_file: the link probe's figures reach the start's log line on every rank (a CPU run has no
    calibrated compute, and says so); a file without figures stops both ranks with rank 0's one-line error."""
    good = tmp_path / "network.json"
    good.write_text(
        json.dumps(
            {"hosts": ["a", "b"], "measured": "2026-12-04T10:00:00+00:00", "pairs": [{}]}
            | {"link_gbit": 0.5, "flow_gbit": 0.2, "latency_us": 40.0}
        )
    )
    results, _ = run_worker(tmp_path, 2, "model_start", f"comm.network_file={good}")
    a, b = results
    assert a["error"] is None and a["start"] == b["start"] and a["note"] == b["note"]
    assert f"0.5 Gbit/s, 0.2 Gbit/s per flow (link probe {good} (2 hosts" in a["note"]
    assert "no calibrated compute on the CPU" in a["note"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hosts": ["a"], "pairs": []}))
    results, _ = run_worker(tmp_path, 2, "model_start", f"comm.network_file={bad}", "dist.timeout_s=60")
    for r in results:
        assert r["error"] == f"{bad}: the probe measured no host pair (one host): no link figures"
        assert r["seconds"] < 30  # no rank waits for a timeout


def test_hop_level_without_its_sockets_stops_every_rank_at_start_up(tmp_path):
    results, _ = run_worker(tmp_path, 2, "hop_no_link", "dist.timeout_s=60")
    for r in results:
        assert r["error"] == (
            "comm.balance_level=hop measures each connection with the kernel's TCP_INFO (Linux, gloo's TCP "
            "transport): rank 1: found no single TCP connection to rank 0 on communicator 4 of 8 (it opened 1 here). "
            "Use comm.balance_level=communicator"
        )
        assert r["seconds"] < 30  # no rank waits for the 60 s timeout


def test_plan_mismatch_fails_fast_with_a_clear_error(tmp_path):
    results, _ = run_worker(tmp_path, 2, "mismatch", "dist.timeout_s=60")
    for r in results:
        assert r["error"] is not None and "different fusion plans" in r["error"]
        assert "rank 0:" in r["error"] and "rank 1:" in r["error"] and "S=2" in r["error"] and "S=3" in r["error"]
        assert r["seconds"] < 10  # one all-gather, not the 60 s collective timeout


HOP = ("comm.balance=true", "comm.balance_level=hop")


@pytest.mark.parametrize(
    "stall,level",
    [(False, ()), (True, ()), (False, HOP), (True, HOP)],
    ids=["dead", "stalled", "dead-hop-ring", "stalled-hop-ring"],
)
def test_dead_or_stalled_peer_fails_within_the_timeout(tmp_path, stall, level):
    timeout_s = 4
    env = {"STALL": "1" if stall else "0", "STALL_S": "12"}  # longer than the timeout and its 5 s margin
    results, _ = run_worker(tmp_path, 2, "dead_peer", f"dist.timeout_s={timeout_s}", *level, env=env)
    r0 = results[0]
    assert r0["error"] is not None and r0["is_comm_error"], r0
    said = "multistream hop ring: bucket" if level else "multistream: allreduce of bucket"
    assert said in r0["error"] and f"dist.timeout_s={timeout_s}" in r0["error"]
    if stall:
        assert timeout_s - 0.5 < r0["seconds"] < timeout_s + 5  # waited for the timeout, not forever
    else:
        assert r0["seconds"] < timeout_s + 5  # a closed connection is noticed at once


def _train(tmp_path: Path, root: Path, name: str, *overrides: str, nproc: int = 2):
    cfg_overrides = [
        f"data.root={root}",
        f"run.out_dir={tmp_path}",
        f"run.name={name}",
        "run.threads=1",
        "model.name=resnet10t",
        "data.workers=0",
        "data.val_batch_size=8",
        "log.every_steps=1",
        "optim.lr=0.1",
        "phases=[{epochs: 2, image_size: 32, batch_size: 12}]",
        "run.deterministic=true",
        *overrides,
    ]
    p = torchrun(nproc, ["train.py", "-c", str(ROOT / "configs" / "base.yaml"), *cfg_overrides], timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p, tmp_path / name


@pytest.mark.slow
def test_trainer_multistream_matches_ddp_and_autotunes(tmp_path, tiny_root):
    """End to end: the same training with ddp and with multistream ends with the same weights; with autotune the
    candidates and the winner reach the log, TensorBoard and the cache."""
    _, ddp_dir = _train(tmp_path, tiny_root, "ddp", "comm.backend=ddp", "log.tensorboard=false")
    cache = tmp_path / "tune.json"
    tune = [
        "comm.backend=multistream",
        "comm.autotune=true",
        f"comm.tune_cache={cache}",
        "comm.bucket_mb=0.5",
        "comm.tune_bucket_mb=[0.5,2]",
        "comm.tune_streams=[1,3]",
        "comm.tune_slices=[1,2]",
        "comm.tune_max_candidates=3",
        "comm.tune_warmup_steps=0",
        "comm.tune_steps_per_window=1",
        "comm.tune_windows=1",
    ]
    p, ms_dir = _train(tmp_path, tiny_root, "ms", *tune, "log.tensorboard=true")
    assert "multistream autotune: candidate 3:" in p.stdout and "winner after 3 candidates" in p.stdout
    a = torch.load(ddp_dir / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(ms_dir / "checkpoint.pt", weights_only=True)["model"]
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), atol=2e-5, rtol=1e-4), k
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ev = EventAccumulator(str(ms_dir / "tb"))
    ev.Reload()
    tags = ev.Tags()["scalars"]
    assert len(ev.Scalars("autotune/candidate_ms")) == 3
    assert "autotune/winner_ms" in tags and "autotune/winner_streams" in tags
    assert all(math.isfinite(e.value) and e.value > 0 for e in ev.Scalars("autotune/candidate_ms"))
    assert json.loads(cache.read_text())  # the winner is cached; the next run's start from it: the "tune" test above
    settings = json.loads((ms_dir / "summary.json").read_text())["comm"]["settings"]
    assert (settings["tune_finished"], settings["tune_measured"], settings["tune_candidates"]) == (True, 3, 3)
