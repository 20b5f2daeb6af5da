"""The balancer's half of the multistream backend, between steps: feed each finished step's per-communicator times
(or under comm.balance_level=hop the kernel's counters of each connection) to the window, agree on the window's
figures across ranks at its end, and re-plan the buckets' shares when recipes/comm/balance.py says so.

`BalanceSteps` is a mixin of recipes/comm/multistream.py's `MultiStreamBackend`, whose state it reads (comm_cfg,
dist, timeout_s, settings, specs, engine, concurrency, hierarchy, `_hop`) and whose `_start`, `_plan` and `_note` it
calls; it owns `balance` and the hop ring's test of each re-plan (`_hop_mark`, `_hop_elapsed`, `_hop_trial`), which
the backend sets up in its constructor. Re-plans happen between steps only (on_step_end), never inside a backward.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as td

from recipes.comm import balance as balancing
from recipes.comm.plan import describe_table
from recipes.distributed import collective_guard


class BalanceSteps:
    """comm.balance's windows and re-plans, for MultiStreamBackend (see the module's docstring)."""

    def _balancing(self) -> bool:
        """Whether the balancer still measures steps (comm.balance on, after the tuner, not settled)."""
        if not self.comm_cfg.balance or self.concurrency is None:
            return False
        if self.concurrency.mode == "serialize" and not self._hop:
            return False
        return self.balance is None or not self.balance.settled

    def _balance_step(self, step: int, log) -> None:
        """Between two steps: feed the finished steps' per-communicator times to the window; at its end, agree on
        the figures (one all-reduce) and re-plan if the balancer says so. Never while a step's backward runs."""
        if not self._balancing() or self.engine.active:
            return  # called from inside a step (a hook): the window waits for the step's end
        if self.balance is None:  # the tuner (if any) has chosen: balance its winner's K communicators
            self.balance = self._new_balance()
        b, eng = self.balance, self.engine
        if not eng.measure:
            eng.measure = True  # from the next step on
            return
        now, before = time.perf_counter(), b.steps
        # counted on the host: one wait per window (at its last step), not a host sync at every measured step
        for secs in eng.read_window(b.skip + self.comm_cfg.balance_window - b.steps):
            b.add(secs)
        if self._hop and b.steps > before and self._hop_mark is not None:  # the whole step, as the ring's test
            self._hop_elapsed += now - self._hop_mark
        self._hop_mark = now
        if b.steps < self.comm_cfg.balance_window:
            return
        if self._hop:
            self._balance_hops(step, log)
            return
        agreed = torch.tensor(b.window, dtype=torch.float64, device=self.dist.device) / b.steps
        with collective_guard("multistream balance: the window's figures", step, self.timeout_s):
            td.all_reduce(agreed, op=td.ReduceOp.MAX)  # a ring goes at its slowest rank; MAX is exact everywhere
        carried = self._carried()
        decision = balancing.rebalance(carried, agreed.tolist(), self.comm_cfg.balance_min_gain, b.shares)
        b.close(decision)
        rates = ", ".join(f"{self._mbyte_s(k, decision.rates[k]):.2f}" for k in range(len(carried)))
        slow = "".join(
            f"; communicator {k} delivers {decision.rates[k] / statistics.median(decision.rates):.2f}x the median: "
            "a slow path"
            for k in decision.slow
        )
        if decision.shares is not None:
            self._install(decision.shares)
            self._note(
                f"multistream balance: re-plan {b.replans} at step {step}: shares "
                f"{'/'.join(str(x) for x in decision.shares)} (MB/s per communicator {rates}; slowest communicator "
                f"{decision.gain:.0%} shorter predicted){slow}",
                log,
            )
        elif b.settled:
            eng.measure = False
            self._note(
                f"multistream balance: settled at step {step} after {b.replans} re-plans, shares "
                f"{'/'.join(str(x) for x in b.current)} (MB/s per communicator {rates}){slow}",
                log,
            )

    def _balance_hops(self, step: int, log) -> None:
        """The window's end under comm.balance_level=hop: each rank read the kernel's counters of the K connections
        it sends on (row r of the table: busy seconds, then bytes delivered); one all-reduce (SUM of rows that only
        their owner filled: exact) gives every rank the whole table, and each computes the same plan from it."""
        b, w = self.balance, self.dist.world_size
        k = self.settings.streams
        table = torch.zeros(w, 2 * k, dtype=torch.float64, device=self.dist.device)
        table[self.dist.rank] = torch.tensor(b.window, dtype=torch.float64) / b.steps
        step_s = torch.tensor([self._hop_elapsed / b.steps], dtype=torch.float64, device=self.dist.device)
        self._hop_elapsed = 0.0
        with collective_guard("multistream balance: the window's figures", step, self.timeout_s):
            td.all_reduce(table, op=td.ReduceOp.SUM)
            td.all_reduce(step_s, op=td.ReduceOp.MAX)  # the step goes at its slowest rank; the same bits everywhere
        step_s = float(step_s.item())
        if self._hop_trial is not None:  # the window after a re-plan: it stays only if the step got shorter
            previous, before = self._hop_trial
            self._hop_trial = None
            if step_s >= before:
                b.close(balancing.HopDecision(previous, 0.0, (), ()))
                b.settled, b.quiet = True, balancing.SETTLE_WINDOWS
                self._install(previous)
                self.engine.measure = False
                self._note(
                    f"multistream balance: re-plan {b.replans - 1} did not shorten the step ({step_s * 1000:.0f} ms "
                    f"against {before * 1000:.0f} ms): back to hop shares {describe_table(previous)}, settled",
                    log,
                )
                return
        current = b.current
        figures = table.tolist()
        decision = balancing.rebalance_hops(
            [row[k:] for row in figures], [row[:k] for row in figures], self.comm_cfg.balance_min_gain, current
        )
        why = f"slowest hop {decision.gain:.0%} shorter predicted"
        if decision.shares is None and b.stretches < balancing.MAX_STRETCHES:
            stretched = balancing.stretch_hops(current)  # proportional re-plans stop short: try further from even
            if stretched is not None:
                b.stretches += 1
                decision = balancing.HopDecision(stretched, 0.0, decision.rates, decision.slow)
                why = f"stretch {b.stretches} of at most {balancing.MAX_STRETCHES}: the next window's step decides"
        b.close(decision)
        slow = "".join(
            f"; {self._sender(h)}'s connection {c} to {self._sender(h, -1)} delivers "
            f"{decision.rates[h][c] / 1e6:.2f} MB/s, "
            f"{decision.rates[h][c] / statistics.median(decision.rates[h]):.2f}x the median of its hop: a slow path"
            for h, c in decision.slow
        )
        if decision.shares is not None:
            self._hop_trial = (current, step_s)
            self._install(decision.shares)
            self._note(
                f"multistream balance: re-plan {b.replans} at step {step}: hop shares "
                f"{describe_table(decision.shares)} ({why}){slow}",
                log,
            )
        elif b.settled:
            self.engine.measure = False
            self._note(
                f"multistream balance: settled at step {step} after {b.replans} re-plans, hop shares "
                f"{describe_table(b.current)}{slow}",
                log,
            )

    def _sender(self, row: int, step: int = 0) -> str:
        """How a log line names the hop table's row `row` (its sending rank), or with step=-1 its left neighbour: host
        h, or under comm.hierarchy=host host h's local rank l."""
        if self.hierarchy is None:
            return f"host {(row + step) % self.dist.world_size}"
        lay = self.hierarchy.layout
        return f"host {(row // lay.local + step) % lay.hosts}'s local rank {row % lay.local}"

    def _new_balance(self) -> balancing.BalanceState:
        return balancing.BalanceState(self.settings.streams, hops=self.dist.world_size if self._hop else 0)

    def _install(self, shares: tuple) -> None:
        if self.engine.active:
            raise RuntimeError("multistream balance: a re-plan inside a step (only on_step_end may re-plan)")
        self._start(self._plan(self.settings, shares))
        self.engine.measure = self._balancing()

    def replan(self, shares: tuple) -> None:
        """Install `shares` now, as a re-plan would (tests force one with it); call it on every rank, between steps.
        Under comm.balance_level=hop, `shares` is the table: a row of K shares per sending host."""
        if self.balance is None:
            self.balance = self._new_balance()
        shares = tuple(tuple(row) for row in shares) if self._hop else tuple(shares)
        self.balance.close(balancing.Decision(shares, 0.0, (), ()))
        self._install(shares)

    def _carried(self) -> list[float]:
        """What each communicator carries per step under the current plan, in shares (SHARE_TOTAL = every byte)."""
        plan = self.engine.plan
        per = [0] * plan.streams
        for b in range(len(plan.buckets)):
            for j, (lo, hi) in enumerate(plan.slice_bounds(b)):
                per[plan.communicator(b, j)] += hi - lo
        total = sum(per) or 1
        return [balancing.SHARE_TOTAL * x / total for x in per]

    def _mbyte_s(self, k: int, rate: float) -> float:
        """A rate in shares per second as MB/s of wire bytes."""
        wire = sum(w.numel() * w.element_size() for w in self.engine.wire)
        return rate / balancing.SHARE_TOTAL * wire / 1e6
