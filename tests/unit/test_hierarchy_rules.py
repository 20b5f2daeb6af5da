"""comm.hierarchy=host without processes: the host layout, the start-up rule, and its rate and time in the models."""

from __future__ import annotations

import pytest

from base.errors import ConfigError
from recipes.comm import flowrates
from recipes.comm.hierarchy import Layout, layout_of
from recipes.comm.stepmodel import Network, hierarchical_seconds


def test_each_local_rank_has_a_ring_of_one_member_per_host_reading_its_members_rows():
    lay = layout_of(5, 6, 1, 2, [(r % 2, 2) for r in range(6)])  # 3 hosts x 2: rank 5 is host 2's local rank 1
    assert lay == Layout(hosts=3, local=2, host=2, local_rank=1)
    assert lay.ring_ranks(1) == [1, 3, 5] and lay.ring_ranks(0) == [0, 2, 4]
    assert lay.host_ranks(2) == [4, 5]
    assert lay.neighbours() == (3, 1)  # left: host 1's local rank 1; right: host 0's
    table = tuple((g, 1000 - g) for g in range(6))  # a row per rank
    assert lay.rows(table) == ((1, 999), (3, 997), (5, 995))


@pytest.mark.parametrize(
    "rank,world,everyone,said",
    [
        (0, 6, [(0, 2), (1, 2), (0, 4), (1, 4), (2, 4), (3, 4)], "LOCAL_WORLD_SIZE 2/4 over 6 ranks"),
        (0, 6, [(0, 4)] * 6, "LOCAL_WORLD_SIZE 4 over 6 ranks"),
        (0, 4, [(0, 2), (1, 2), (1, 2), (0, 2)], "rank 2 has LOCAL_RANK 1, expected 0"),
    ],
)
def test_a_layout_torchrun_would_not_give_is_one_line(rank, world, everyone, said):
    with pytest.raises(ConfigError, match="^comm.hierarchy=host: ") as e:
        layout_of(rank, world, everyone[rank][0], everyone[rank][1], everyone)
    assert said in str(e.value) and "\n" not in str(e.value)


def _refusal(balance=True, level="hop", hierarchy="none", transport="nccl"):
    return flowrates.refusal(balance=balance, level=level, hierarchy=hierarchy, transport=transport)


def test_hop_level_on_nccl_runs_only_with_the_hierarchy():
    assert _refusal(transport="gloo") is None
    assert _refusal(hierarchy="host") is None and _refusal(hierarchy="host", transport="gloo") is None
    assert _refusal(balance=False, level="communicator") is None
    assert _refusal(level="communicator") is None
    nccl = _refusal()
    assert nccl.startswith("comm.balance_level=hop: the hop-balanced ring runs on gloo process groups, not nccl.")
    assert "set comm.hierarchy=host" in nccl
    assert _refusal(balance=False, hierarchy="host") == (
        "comm.hierarchy=host runs the hop-balanced ring between hosts: set comm.balance=true and "
        "comm.balance_level=hop, or comm.hierarchy=none"
    )
    assert _refusal(level="communicator", hierarchy="host", transport="gloo") is not None


def test_the_hierarchys_rings_add_up_to_the_link():
    one_slow = [[10.0, 10.0, 10.0, 10 / 3]] * 4  # 4 hosts, one slow connection of 4 on every hop
    assert flowrates.hier_mbit(one_slow, 40.0, 1) == pytest.approx(100 / 3)  # the flat hop ring's sum ...
    assert flowrates.ring_mbit(one_slow, 40.0, "hop") == flowrates.hier_mbit(one_slow, 40.0, 1)
    assert flowrates.hier_mbit(one_slow, 32.0, 8) == 32.0  # ... 8 rings' sum is past the link
    assert flowrates.hier_mbit([[1.0, 2.0], [3.0, 0.5]], 100.0, 2) == 6.0  # the slowest hop: 2 x (1 + 2)
    rates = flowrates.strategy_rates([[10.0, 10.0, 10.0, 10 / 3]], 32.0, hosts=16, local=8)
    assert rates["hier"] == 32.0 and rates["even"] == pytest.approx(40 / 3)
    assert "hier" not in flowrates.strategy_rates([[10.0, 10.0]], 32.0, hosts=2)


def test_the_hierarchys_time_is_the_host_stage_plus_a_ring_of_hosts():
    net = Network(hosts=16, gpus_per_host=8, intra_gbyte=150.0)
    nbytes = 100e6
    inside = 2 * 7 / 8 * nbytes / 150e9  # reduce-scatter + all-gather over NVLink: 1.167 ms
    between = 2 * 15 / 16 * nbytes * 8 / 32e9  # the 8 rings' 2(H-1)/H x B at their sum, 32 Gbit/s: 46.875 ms
    assert hierarchical_seconds(nbytes, net, 32_000.0) == pytest.approx(inside + between)
    assert hierarchical_seconds(nbytes, Network(hosts=1, gpus_per_host=8), 32_000.0) == pytest.approx(inside)
    assert hierarchical_seconds(nbytes, Network(hosts=4, gpus_per_host=1), 8_000.0) == pytest.approx(0.15)
