"""The network lab's uneven networks: the profiles (lab/flow_profiles.py, the lab's leaves in lab/netlab_flows.py),
the model's predictions over their draws, and the rings of a lab record run at once."""

from __future__ import annotations

import pytest

from lab import flow_profiles as fp
from lab import netlab_flows as nf

F = 40 / 3


def test_one_slow_has_exactly_one_slow_connection_per_peer_and_is_seeded():
    for host, peer in [(0, 1), (1, 0), (3, 2)]:
        ceils = [
            fp.leaf_for("one-slow", seed=7, host=host, peer=peer, k=k, flows=4, flow_mbit=F).ceil_mbit for k in range(4)
        ]
        assert sorted(ceils) == pytest.approx([F / 3, F, F, F])
    draws = {
        tuple(fp.leaf_for("one-slow", seed=s, host=0, peer=1, k=k, flows=4, flow_mbit=F).ceil_mbit for k in range(4))
        for s in range(20)
    }
    assert len(draws) == 4  # the slow one moves with the seed


def test_random_is_seeded_within_its_range_and_collide_shares_leaves():
    a = [fp.leaf_for("random", seed=3, host=2, peer=1, k=k, flows=4, flow_mbit=F).ceil_mbit for k in range(4)]
    assert a == [fp.leaf_for("random", seed=3, host=2, peer=1, k=k, flows=4, flow_mbit=F).ceil_mbit for k in range(4)]
    assert a != [fp.leaf_for("random", seed=4, host=2, peer=1, k=k, flows=4, flow_mbit=F).ceil_mbit for k in range(4)]
    assert all(0.2 * F <= c <= F for c in a)
    assert [fp.leaf_for("collide", seed=0, host=0, peer=1, k=k, flows=4, flow_mbit=F).slot for k in range(4)] == [
        0,
        0,
        1,
        1,
    ]
    assert fp.ring_rates("collide", 0, 2, 4, F)[0] == pytest.approx([F / 2] * 4)
    with pytest.raises(ValueError, match="flow profile: expected one of even, one-slow, collide, random"):
        fp.leaf_for("ecmp", seed=0, host=0, peer=1, k=0, flows=4, flow_mbit=F)


def test_communicator_balancing_fades_with_hosts_under_one_slow_and_hop_level_does_not():
    small, big = fp.predict("one-slow", 2), fp.predict("one-slow", 16)
    assert small.comm == pytest.approx(2.0) and big.comm == pytest.approx(1.0)
    assert small.hop == big.hop == pytest.approx(40 / (4 * F / 3))  # the link over 4 x the slow flow


def test_pins_follow_groups_and_peers():
    groups = [[(5000 + g, "10.250.0.2", 1), (6000 + g, "10.250.0.3", 1)] for g in range(4)]
    peer_of = {"10.250.0.2": 1, "10.250.0.3": 2}
    pins = nf.pins_for(groups, profile="collide", seed=0, host=0, peer_of=peer_of, flow_mbit=F, first_leaf=10)
    assert [(p.sport, p.leaf) for p in pins if p.dst == "10.250.0.2"] == [
        (5000, 10),
        (5001, 10),
        (5002, 11),
        (5003, 11),
    ]
    assert {p.leaf for p in pins if p.dst == "10.250.0.3"} == {12, 13}
    lines = nf.pin_commands(pins, "eth0", 40.0)
    assert sum(x.startswith("class change") for x in lines) == 4 and sum(x.startswith("filter") for x in lines) == 8
    assert "match ip sport 5000 0xffff match ip dport 1 0xffff match ip dst 10.250.0.2/32 flowid 1:40a" in lines[4]
    assert lines[0].endswith("burst 128k cburst 128k quantum 65536")  # the lab's fixed burst by default
    # --burst-ms 2: 2 ms of the leaf's rate (40/512 Mbit/s: under two frames, so two frames) and of its ceiling
    # (`collide` keeps the per-flow cap: 13.33 Mbit/s for 2 ms is 3333 bytes)
    short = nf.pin_commands(pins, "eth0", 40.0, burst_ms=2)
    assert short[0].endswith("burst 3028b cburst 3333b quantum 65536")
    assert nf.burst_words(1000, 1000, 2, "256k") == "burst 250000b cburst 250000b"


def test_connections_that_share_a_port_are_pinned_each_by_its_own_filter():
    """The hop ring's K groups share one gloo device, so the connections a host accepted share its listener's port:
    each pin matches the peer's port too, or all K would meet the first one's ceiling."""
    groups = [[(40205, "10.250.0.2", 42100 + g)] for g in range(4)]
    kw = dict(profile="one-slow", seed=0, host=0, peer_of={"10.250.0.2": 1}, flow_mbit=30.0)
    pins = nf.pins_for(groups, **kw)
    assert [(p.dport, p.leaf, round(p.ceil_mbit)) for p in pins] == [
        (42100 + k, k, 10 if k == 1 else 30) for k in range(4)
    ]
    filters = [x for x in nf.pin_commands(pins, "eth0", 40.0) if x.startswith("filter")]
    assert len(set(filters)) == 4 and all(f"match ip dport {42100 + k} 0xffff" in filters[k] for k in range(4))


def test_one_way_pins_give_each_direction_the_k_draws_on_leaves_of_its_own():
    """The hop ring at 2 hosts: 8 groups, 4 that send and 4 that receive; connection k of either set takes draw k of
    4 (one-slow seed 0 from host 0 to 1: slow index 1), as DDP's 4 connections carrying both ways would."""
    groups = [[(5000 + g, "10.250.0.2", 1)] for g in range(8)]
    kw = dict(profile="one-slow", seed=0, host=0, peer_of={"10.250.0.2": 1}, flow_mbit=30.0)
    pins = nf.pins_for(groups, one_way=True, **kw)
    assert [(p.sport, p.leaf, round(p.ceil_mbit)) for p in pins] == [
        (5000 + i, i, 10 if i % 4 == 1 else 30) for i in range(8)
    ]
    both_ways = nf.pins_for(groups[:4], **kw)  # 4 connections carrying both ways: the same 4 ceilings
    assert [p.ceil_mbit for p in both_ways] == [p.ceil_mbit for p in pins[:4]]
    with pytest.raises(ValueError, match="7 connections to 10.250.0.2, expected two sets of equal size"):
        nf.pins_for(groups[:7], one_way=True, **kw)


def test_fewer_connections_than_draws_take_the_first_draws():
    """Horovod's connections to a peer against K = 4 draws: connection k takes draw k (one-slow seed 0 from host 0 to
    1: slow index 1), where one draw per connection would make a lone connection the slow one."""
    groups = [[(5000 + g, "10.250.0.2", 1)] for g in range(2)]
    kw = dict(profile="one-slow", seed=0, host=0, peer_of={"10.250.0.2": 1}, flow_mbit=30.0)
    assert [round(p.ceil_mbit) for p in nf.pins_for(groups, draws=4, **kw)] == [30, 10]
    assert [round(p.ceil_mbit) for p in nf.pins_for(groups[:1], draws=4, **kw)] == [30]
    assert [round(p.ceil_mbit) for p in nf.pins_for(groups[:1], **kw)] == [10]
    with pytest.raises(ValueError, match="2 connections to 10.250.0.2, more than the profile's 1 draws"):
        nf.pins_for(groups, draws=1, **kw)


def test_each_pair_of_ranks_on_different_hosts_has_its_own_draws():
    """Hosts of 2 local ranks (bench_allreduce --local-ranks): rank 1's connections to ranks 2 and 3 go to one address,
    and each peer rank's 4 take their own one-slow draws (exactly one slow each), as `host`=rank and `peer`=rank."""
    to2 = [(5000 + k, "10.250.0.2", 7000) for k in range(4)]
    to3 = [(6000 + k, "10.250.0.2", 8000) for k in range(4)]
    peer_rank = {c: 2 for c in to2} | {c: 3 for c in to3}
    kw = dict(profile="one-slow", seed=5, host=1, peer_of={}, flow_mbit=F, peer_of_conn=peer_rank)
    pins = nf.pins_for([to2 + to3], **kw)
    for peer, conns in ((2, to2), (3, to3)):
        got = [p.ceil_mbit for p in pins if (p.sport, p.dst, p.dport) in conns]
        want = [
            fp.leaf_for("one-slow", seed=5, host=1, peer=peer, k=k, flows=4, flow_mbit=F).ceil_mbit for k in range(4)
        ]
        assert got == want and sorted(got) == pytest.approx([F / 3, F, F, F])
    by_address = nf.pins_for([to2 + to3], profile="one-slow", seed=5, host=1, peer_of={"10.250.0.2": 1}, flow_mbit=F)
    assert sum(p.ceil_mbit < F for p in by_address) == 1  # by address alone: 8 draws, one slow among them


def test_hop_rings_of_hosts_with_local_ranks():
    """One ring per local rank under the hierarchy, each on 1/L of the bytes; the flat ring's only hop out of a host
    goes from its local rank 0 to the previous host's last; the hierarchy's rings share each host's link."""
    kw = dict(hosts=4, local=2, flows=4, flow_mbit=F, nbytes=8e6)
    hier = fp.hop_rings("one-slow", 0, hierarchy=True, **kw)
    assert len(hier) == 2 and [r.nbytes for r in hier] == pytest.approx([2 * 3 / 4 * 8e6 / 2] * 2)
    assert [h for h, _ in hier[0].hops] == [0, 1, 2, 3]
    assert all(c == pytest.approx(3 * F + F / 3) for r in hier for _, c in r.hops)  # one slow of 4 on every hop
    # the sum of a hop's connections (44 Mbit/s) exceeds the link: the two rings split each host's 40 Mbit/s
    assert fp.concurrent_seconds(hier, 40.0) == pytest.approx(2 * 3 / 4 * 8e6 * 8 / 40e6)
    (flat,) = fp.hop_rings("random", 1, hierarchy=False, **kw)
    assert flat.nbytes == pytest.approx(2 * 7 / 8 * 8e6)
    h2 = sum(fp.leaf_for("random", seed=1, host=4, peer=3, k=k, flows=4, flow_mbit=F).ceil_mbit for k in range(4))
    assert flat.hops[2] == (2, pytest.approx(h2))
    # one rank per host: the flat ring is the hop-level ring_rates' ring
    (one,) = fp.hop_rings("random", 1, hierarchy=False, **(kw | {"local": 1}))
    assert [c for _, c in one.hops] == pytest.approx([sum(r) for r in fp.ring_rates("random", 1, 4, 4, F)])


def test_a_lab_methods_strategy_follows_its_balance_keys():
    assert fp.strategy_of(()) == "even"
    assert fp.strategy_of(("comm.balance=false", "comm.balance_level=hop")) == "even"
    assert fp.strategy_of(("comm.balance=true",)) == "comm"
    assert fp.strategy_of(("comm.balance=true", "comm.balance_level=hop")) == "hop"
    assert fp.strategy_of(("comm.balance=true", "comm.balance_level=hop", "comm.hierarchy=host")) == "hier"


def _conn(ceil, nbytes, port=0):
    return [port, "10.250.0.9", port + 1, ceil, nbytes]


def test_rings_are_told_apart_by_the_bytes_their_hops_carry():
    # 3 hosts, two buckets (1.0 and 2.0 MB a hop) on two devices, and an idle connection each to the other peer
    conns = [
        [_conn(10.0, 1_000_000), _conn(4.0, 2_000_400), _conn(9.0, 700)],
        [_conn(6.0, 2_000_000), _conn(8.0, 1_000_100), _conn(9.0, 0)],
        [_conn(5.0, 999_900), _conn(12.0, 2_000_100), _conn(9.0, 480)],
    ]
    rings = fp.rings_of(conns)
    assert [round(r.nbytes, -3) for r in rings] == [1_000_000, 2_000_000]
    assert sorted(rings[0].hops) == [(0, 10.0), (1, 8.0), (2, 5.0)]
    assert sorted(rings[1].hops) == [(0, 4.0), (1, 6.0), (2, 12.0)]
    conns[2][1][4] = 1_000_000  # two buckets of one size: which hop is whose is unknown
    with pytest.raises(ValueError, match="one hop from each of 3 hosts"):
        fp.rings_of(conns)
    conns[1][0][3] = None  # a connection without a pin
    with pytest.raises(ValueError, match="host 1's connection .* has ceiling None, expected Mbit/s > 0"):
        fp.rings_of(conns)
    with pytest.raises(ValueError, match="every hop's ceiling must be > 0"):
        fp.concurrent_seconds([fp.Ring(1e6, ((0, 0.0), (1, 9.0)))], 10.0)


def test_concurrent_rings_go_at_their_slowest_hop_and_share_a_full_link_fairly():
    slow = fp.Ring(1e6, ((0, 8.0), (1, 2.0)))  # 8 Mbit at 2 Mbit/s: 4 s alone
    assert fp.concurrent_seconds([slow], 100.0) == pytest.approx(4.0)
    # two rings over the same two hosts, a 10 Mbit/s link: 5 each until the 1 MB one is done at 1.6 s, then the
    # other alone at its 9 Mbit/s ceiling for its last 2 MB - 1 MB
    a, b = fp.Ring(1e6, ((0, 9.0), (1, 9.0))), fp.Ring(2e6, ((0, 9.0), (1, 9.0)))
    assert fp.concurrent_seconds([a, b], 10.0) == pytest.approx(1.6 + 8.0 / 9.0)
    # a ring held by its slow hop leaves the rest of the link to the other
    # (c at 2 Mbit/s for 4 s, d at 8 meanwhile, then alone at 9 for its last 8 Mbit)
    c, d = fp.Ring(1e6, ((0, 2.0), (1, 9.0))), fp.Ring(5e6, ((0, 9.0), (1, 9.0)))
    assert fp.concurrent_seconds([c, d], 10.0) == pytest.approx(4.0 + 8.0 / 9.0)
