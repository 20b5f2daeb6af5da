"""comm.hierarchy=host for real: gloo processes under torchrun, every HOST_RANKS consecutive ranks one simulated
host (tests/comm_worker.py's `hier` scenarios)."""

from __future__ import annotations

import pytest
from support import ROOT, rank_results, torchrun

WORKER = str(ROOT / "tests" / "comm_worker.py")
FP16_TOL = 2.0**-9  # fp16 wire: relative to the largest gradient magnitude, as tests/e2e/test_comm_backends.py

EXACT = 1e-6  # fp32: the mean up to float32 rounding (gradients here are ~0.1)
SAME_AS_DDP = 1e-7  # the same sums as DDP's allreduce, in another order


TIMEOUT_S = 4  # dist.timeout_s of the worker's last backend, where ranks leave mid-bucket
# what the survivors say: a dead local rank (rank 1 of 2 hosts x 2) is named by its host's collectives (rank 0: the
# reduce-scatter of the bucket it left in, or the all-gather of the one before, whichever reads the closed connection
# first) and by its ring (rank 3); a dead host (host 2 of 3) by the rings of both local ranks
SAID = {
    2: {0: "among host 0's local ranks failed", 3: "ring of local rank 1: bucket"},
    3: {0: "ring of local rank 0: bucket", 1: "ring of local rank 1: bucket", 3: "ring of local rank 1: bucket"},
}


@pytest.mark.parametrize("hosts,dead", [(2, "1"), (3, "4,5")], ids=["2x2-dead-local-rank", "3x2-dead-host"])
def test_hierarchical_ring_is_ddps_mean_and_a_dead_rank_stops_every_rank(tmp_path, hosts, dead):
    """2 or 3 hosts x 2 local ranks: one ring per local rank whose length is the number of hosts; the mean equals
    the exact mean and DDP's, with equal shares and after a forced re-plan where every rank's row differs (fp32 and
    fp16 wire); at 2 hosts the balancer re-plans on paced connections, every rank agrees, and a resumed backend
    installs the same table. Then a local rank (2 hosts) or a host (3 hosts) leaves inside its ring's second bucket:
    every other rank stops within dist.timeout_s with one line naming the bucket, the step and the host."""
    nproc = 2 * hosts
    out = tmp_path / "hier"
    out.mkdir()
    env = {"HOST_RANKS": "2", "DEAD_RANKS": dead, "HIER_BALANCE": "1" if hosts == 2 else "0"}
    p = torchrun(nproc, [WORKER, "hier", str(out)], timeout=180, env=env)
    results = rank_results(out, nproc, f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    rows = [[600, 400], [100, 900], [334, 666], [20, 980], [850, 150], [480, 520]][:nproc]
    for r in results:
        host, local = divmod(r["rank"], 2)
        assert r["ring"] == [host, hosts, (host - 1) % hosts, (host + 1) % hosts, 2, 3]  # place, length, neighbours
        assert r["even"]["vs_mean"] < EXACT and r["even"]["vs_ddp"] < SAME_AS_DDP
        fp32, fp16 = r["replan/"], r["replan/comm.compression=fp16"]
        assert fp32["vs_mean"] < EXACT and fp32["vs_ddp"] < SAME_AS_DDP
        assert 0 < fp16["vs_mean"] <= FP16_TOL * r["scale"]
        for case in (fp32, fp16):
            assert case["table"] == rows
            assert case["ring_rows"] == [rows[h * 2 + local] for h in range(hosts)]  # its members' rows
    if hosts == 2:
        # row g delivers PATH_MB_S[g % 3] (1:3, 2:2, 3:1 MB/s): one re-plan at step 3, in their proportion
        table = [[260, 740], [500, 500], [740, 260], [260, 740]]
        assert "multistream balance: re-plan 1 at step 3: hop shares 260/740 500/500 740/260 260/740" in p.stdout
        # a slow connection is named by its host and local rank, and its ring's left neighbour
        assert "host 1's local rank 0's connection 1 to host 0's local rank 0 delivers 1.00 MB/s" in p.stdout
        for r in results:
            assert r["digests"] == results[0]["digests"] and r["digests"][-1][0] == 1
            assert r["max_err"] < EXACT
            assert r["table"] == table and r["resumed_table"] == table
            assert r["resumed_rows"] == [table[h * 2 + r["rank"] % 2] for h in range(hosts)]

    gone = {int(r) for r in dead.split(",")}
    for r in results:
        if r["rank"] in gone:
            assert r["left"]
            continue
        err = r["error"]
        assert err is not None and err.startswith("CommError: multistream hier"), r
        assert f"dist.timeout_s={TIMEOUT_S}" in err and "\n" not in err
        assert "bucket " in err and "host " in err
        assert r["seconds"] < TIMEOUT_S  # a closed connection is noticed at once, not after the timeout
        if r["rank"] in SAID[hosts]:
            assert SAID[hosts][r["rank"]] in err, err
            if "ring" in SAID[hosts][r["rank"]]:
                assert "reduce-scatter step" in err or "all-gather step" in err
