"""comm.balance's decisions (recipes/comm/balance.py): shares, hysteresis, the slow communicator, agreement, state."""

from __future__ import annotations

import random

import pytest

from recipes.comm import balance as bal
from recipes.comm.plan import Settings, TensorSpec, build_plan, split_weighted


def test_proportional_shares_sum_exactly_keep_a_floor_and_follow_the_weights():
    rng = random.Random(0)
    for _ in range(200):
        w = [rng.uniform(0.0, 5.0) for _ in range(rng.randint(1, 8))]
        s = bal.proportional(w)
        assert sum(s) == bal.SHARE_TOTAL and min(s) >= min(bal.MIN_SHARE, bal.SHARE_TOTAL // len(w))
        big = [i for i in range(len(w)) if s[i] > bal.MIN_SHARE]
        for i in big:
            for j in big:
                if w[i] > w[j] + 1e-9:
                    assert s[i] >= s[j]
    assert bal.proportional([1.0, 1.0, 2.0]) == (255, 255, 490)  # 20 each, then 940 in proportion
    assert bal.even_shares(3) == (334, 333, 333)


def test_every_rank_computes_the_same_plan_from_the_agreed_figures():
    """Each rank measures differently; the one collective (MAX over ranks) gives every rank the same figures, and the
    decision is a function of those alone. Without it (each rank deciding from its own) they would disagree."""
    rng = random.Random(1)
    disagreed = 0
    for _ in range(300):
        ranks, k = rng.randint(2, 16), rng.randint(2, 6)
        carried = list(bal.proportional([rng.uniform(0.5, 2.0) for _ in range(k)]))
        local = [[c / rng.uniform(0.1, 1.0) * rng.uniform(0.9, 1.1) for c in carried] for _ in range(ranks)]
        agreed = [max(col) for col in zip(*local, strict=True)]  # td.ReduceOp.MAX: exact, order-free
        plans = {bal.rebalance(carried, list(agreed), 0.05) for _ in range(ranks)}
        assert len(plans) == 1
        own = {bal.rebalance(carried, mine, 0.05).shares for mine in local}
        disagreed += len(own) > 1
    assert disagreed > 250  # the property is not vacuous: local figures alone give different plans


def test_rebalance_moves_shares_to_the_rates_with_hysteresis_and_names_the_slow_one():
    even = [c for c in bal.even_shares(4)]
    rates = [1.0, 1.0, 1.0, 1 / 3]
    d = bal.rebalance(even, [c / r for c, r in zip(even, rates, strict=True)], 0.05)
    assert d.shares == bal.proportional(rates) == (296, 296, 296, 112)
    assert d.gain == pytest.approx(1 - 336 / 750, abs=0.01) and d.slow == (3,)  # 750 s of the slow one -> 336
    # installed, the same network is balanced: nothing left to gain, no re-plan, nothing named
    again = bal.rebalance(list(d.shares), [c / r for c, r in zip(d.shares, rates, strict=True)], 0.05, d.shares)
    assert again.shares is None and abs(again.gain) < 0.01
    # a small imbalance stays under the threshold (hysteresis)
    noisy = bal.rebalance(even, [250 / 1.0, 250 / 1.03, 250 / 0.98, 250 / 1.0], 0.05)
    assert noisy.shares is None and noisy.slow == ()


def test_state_windows_settle_and_round_trip():
    s = bal.BalanceState(3)
    s.add([1.0, 2.0, 3.0])  # the first step of a plan is left out
    s.add([1.0, 2.0, 3.0])
    s.add([1.0, 2.0, 3.0])
    assert s.steps == 2 and s.window == [2.0, 4.0, 6.0]
    s.close(bal.Decision((500, 200, 300), 0.3, (), ()))
    assert (s.version, s.replans, s.window, s.skip, s.settled) == (1, 1, [], 1, False)
    for _ in range(bal.SETTLE_WINDOWS):
        s.close(bal.Decision(None, 0.0, (), ()))
    assert s.settled
    back = bal.BalanceState.from_state(3, s.to_state())
    assert (back.shares, back.version, back.replans, back.settled) == ((500, 200, 300), 1, 1, True)
    with pytest.raises(ValueError, match="shares are for 3 communicators, not 4"):
        bal.BalanceState.from_state(4, s.to_state())


def test_plan_with_shares_cuts_every_bucket_in_proportion():
    specs = [TensorSpec(f"t{i}", (1000 + i,), "float32") for i in range(6)]
    plan = build_plan(specs, Settings(0.008, 3, 2), "none", (600, 50, 350))
    assert plan.digest() != build_plan(specs, Settings(0.008, 3, 2)).digest()
    for b in range(len(plan.buckets)):
        bounds = plan.slice_bounds(b)
        assert [plan.communicator(b, j) for j in range(len(bounds))] == [0, 1, 2]
        assert bounds[0][0] == 0 and bounds[-1][1] == plan.bucket_numel(b)
        assert all(x[1] == y[0] for x, y in zip(bounds, bounds[1:], strict=False))
    assert split_weighted(10, (1, 1, 2)) == [(0, 2), (2, 5), (5, 10)]
    with pytest.raises(ValueError, match="shares: expected 3 positive integers"):
        build_plan(specs, Settings(0.008, 3, 2), "none", (600, 400))


def test_hop_level_balances_each_hop_by_its_own_connections_and_waits_for_the_slowest_hop():
    """comm.balance_level=hop: row h is host h's connections; every row is re-planned in proportion to its own rates,
    the hysteresis judges the slowest hop (a ring goes at it), and a slow connection is named with its hop."""
    even = [list(row) for row in bal.even_table(3, 4)]
    rates = [[1.0, 1.0, 1.0, 1 / 3], [1.0, 1 / 3, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
    secs = [[c / r for c, r in zip(cs, rs, strict=True)] for cs, rs in zip(even, rates, strict=True)]
    d = bal.rebalance_hops(even, secs, 0.05)
    assert d.shares == ((296, 296, 296, 112), (296, 112, 296, 296), (250, 250, 250, 250))
    assert d.gain == pytest.approx(1 - 336 / 750, abs=0.01) and d.slow == ((0, 3), (1, 1))
    # installed: balanced, no re-plan; a hop that is even but not the slowest never triggers one on its own
    done = [list(row) for row in d.shares]
    again = bal.rebalance_hops(
        done, [[c / r for c, r in zip(cs, rs, strict=True)] for cs, rs in zip(done, rates, strict=True)], 0.05, d.shares
    )
    assert again.shares is None and abs(again.gain) < 0.01
    # every rank gets the same table from the same agreed figures (the all-reduce of rows only their owner filled)
    assert {bal.rebalance_hops(even, secs, 0.05).shares for _ in range(5)} == {d.shares}
    # from an installed table a share moves by at most 2.5x per re-plan: one connection 10x the others on host 0
    # (proportional alone, with the 2% floor: 728 of 1000) gets 625 at first, the others what is left, evenly
    table = bal.even_table(2, 4)
    fast = [[10.0, 1.0, 1.0, 1.0], [4.0, 4.0, 4.0, 4.0]]
    fast_secs = [[c / r for c, r in zip(cs, rs, strict=True)] for cs, rs in zip(table, fast, strict=True)]
    first = bal.rebalance_hops([list(r) for r in table], fast_secs, 0.05, table)
    assert first.shares == ((625, 125, 125, 125), (250, 250, 250, 250))
    second = bal.rebalance_hops(
        [list(r) for r in first.shares],
        [[c / r for c, r in zip(cs, rs, strict=True)] for cs, rs in zip(first.shares, fast, strict=True)],
        0.05,
        first.shares,
    )
    assert second.shares[0][0] == pytest.approx(728, abs=1)  # then the rest of the way


def test_a_stretch_moves_every_row_further_from_even_and_leaves_even_rows():
    """Once proportional re-plans stop paying, a stretch takes share s to s x (s / mean)^0.25: one slow connection
    at 135 of 1000 (where the lab's proportional re-plans stopped) goes to 114, near the 110-115 at which the lab's
    four connections finished together; an even row stays; the floor holds; nothing to stretch is None."""
    t = bal.stretch_hops(((288, 288, 289, 135), (250, 250, 250, 250), (600, 200, 150, 50)))
    assert t == ((295, 295, 296, 114), (250, 250, 250, 250), (678, 172, 120, 30))
    assert all(sum(row) == 1000 for row in t)
    assert bal.stretch_hops(bal.even_table(3, 4)) is None
    floored = bal.stretch_hops(((970, 10, 10, 10),))  # a share below the 2% floor goes up to it
    assert floored == ((940, 20, 20, 20),)


def test_hop_state_round_trips_and_refuses_another_world_or_level():
    s = bal.BalanceState(2, hops=3)
    assert s.current == ((500, 500),) * 3
    s.close(bal.HopDecision(((600, 400), (300, 700), (500, 500)), 0.2, (), ()))
    s.stretches = 2
    back = bal.BalanceState.from_state(2, s.to_state(), hops=3)
    assert back.shares == ((600, 400), (300, 700), (500, 500)) and back.version == 1 and back.stretches == 2
    with pytest.raises(ValueError, match="hop level over 3 hosts, this run balances at hop level over 4 hosts"):
        bal.BalanceState.from_state(2, s.to_state(), hops=4)
    with pytest.raises(ValueError, match="hop level over 3 hosts, this run balances at communicator level"):
        bal.BalanceState.from_state(2, s.to_state())
    with pytest.raises(ValueError, match="shares are for 2 communicators over 3 hops, not 3 over 3"):
        bal.BalanceState.from_state(3, s.to_state(), hops=3)


def test_a_gain_of_exactly_min_gain_keeps_the_plan():
    """B3: the plan changes only for a gain of *more than* comm.balance_min_gain; at the boundary it is kept, at
    both levels (a re-plan costs a new plan on every rank for nothing)."""
    even = list(bal.even_shares(4))
    seconds = [c / r for c, r in zip(even, [1.0, 1.0, 1.0, 1 / 3], strict=True)]
    gain = bal.rebalance(even, seconds, 0.0).gain
    assert gain > 0.5
    assert bal.rebalance(even, seconds, gain).shares is None
    assert bal.rebalance(even, seconds, gain - 1e-9).shares == (296, 296, 296, 112)
    hop_gain = bal.rebalance_hops([even, even], [seconds, seconds], 0.0).gain
    assert bal.rebalance_hops([even, even], [seconds, seconds], hop_gain).shares is None
    assert bal.rebalance_hops([even, even], [seconds, seconds], hop_gain - 1e-9).shares is not None
