"""The flow model of a ring over unequal connections (recipes/comm/flowrates.py): even striping, communicator- and
hop-level balancing, and the three against a measured hop (the lab's profiles: tests/lab/test_flow_profiles.py)."""

from __future__ import annotations

import pytest

from recipes.comm import flowrates as fr


def test_ring_rates_per_strategy():
    rates = [[10.0, 10.0, 10.0, 2.0], [10.0, 2.0, 10.0, 10.0]]  # two hosts, slow connections on different indices
    assert fr.ring_mbit(rates, 100.0, "even") == 8.0  # K x the slowest connection
    assert fr.ring_mbit(rates, 100.0, "comm") == 24.0  # communicators 1 and 3 each have a slow hop
    assert fr.ring_mbit(rates, 100.0, "hop") == 32.0  # every hop carries its connections' sum
    assert fr.ring_mbit(rates, 20.0, "hop") == 20.0  # the link binds
    assert fr.allreduce_seconds(1e6, 4, 8.0) == pytest.approx(1.5 * 8e6 / 8e6)


def test_the_allreduce_time_of_one_slow_connection_per_hop():
    """One slow connection (a third of 13.3) on every hop of 4 hosts, 5 MB: even striping goes at 4 x 4.44 = 17.8
    Mbit/s, the hop ring at the 40 Mbit/s link; at 95% of the model's rate (an even fit) it takes 1/0.95 of its time."""
    rates = [[40 / 3, 40 / 3, 40 / 3, 40 / 9]] * 4
    even = fr.allreduce_seconds(5e6, 4, fr.ring_mbit(rates, 40.0, "even"))
    assert even == pytest.approx(1.5 * 5e6 * 8 / (4 * 40 / 9 * 1e6))
    hop = fr.allreduce_seconds(5e6, 4, fr.ring_mbit(rates, 40.0, "hop") * 0.95)
    assert hop == pytest.approx(1.5 * 5e6 * 8 / 40e6 / 0.95)


def test_strategy_rates_of_one_measured_hop():
    hop = [13.3, 13.3, 13.3, 4.4]  # one slow connection at a third
    assert fr.spread(hop) == pytest.approx(0.3308, abs=1e-4) and fr.spread([5.0, 5.0]) == 1.0
    two = fr.strategy_rates([hop], 40.0, hosts=2)
    assert two["even"] == pytest.approx(17.6)  # 4 x the slowest
    assert two["hop"] == 40.0  # the sum, 44.3, held to the link
    # two hops whose slow connections fall apart (3 draws in 4): two communicators go at 4.4
    assert two["comm"] == pytest.approx(35.4)
    sixteen = fr.strategy_rates([hop], 40.0, hosts=16)
    assert (sixteen["even"], sixteen["comm"], sixteen["hop"]) == pytest.approx((17.6, 17.6, 40.0))
    # a whole ring is taken as it is: both hops slow on connection 3, so communicator 3 alone is slow
    assert fr.strategy_rates([hop, hop], 40.0, hosts=2)["comm"] == 40.0
    assert fr.spread_hop(0.25, 4, 12.0) == [12.0, 12.0, 12.0, 3.0]
