"""`comm.balance`: communicator-level load balancing for multistream (the balancer's decisions, free of torch).

With a static plan every communicator carries the same share of every bucket, so the step waits for the slowest
communicator, as NCCL waits for its slowest socket. On a network whose TCP connections run at unequal rates (ECMP
paths, a loaded neighbour) the balancer gives each communicator a share of every bucket in proportion to what it
delivers:

- over a window of `comm.balance_window` steps the engine measures, per communicator, the seconds from the step's
  first gradient to that communicator's last slice being done (host clocks on gloo, CUDA events on a GPU);
- at the window's end every rank contributes its figures to one small all-reduce (MAX over ranks: a ring
  communicator goes at its slowest rank, and a maximum is exact, so every rank gets the same bits) and computes the
  new shares from them with `rebalance`, a pure function: every rank installs the identical plan, with no message
  beyond that one collective (never per step);
- hysteresis: a new plan is installed only when it is predicted to shorten the window's slowest communicator by
  more than `comm.balance_min_gain`; after `SETTLE_WINDOWS` windows in a row without a change the balancer stops
  measuring (so the step may be captured in a CUDA graph);
- a communicator delivering less than `SLOW_FACTOR` of the others' median rate is named in the log line.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

SHARE_TOTAL = 1000  # shares are integers summing to this (per mille of every bucket)
MIN_SHARE = 20  # 2%: a communicator keeps a share, so it is still measured and can win its share back
SETTLE_WINDOWS = 2  # windows in a row without a re-plan before the balancer stops measuring
SLOW_FACTOR = 0.5  # a communicator below this fraction of the others' median rate is named
HOP_STEP = 2.5  # hop level: one re-plan moves a share by at most this factor (one odd window cannot swing a table)
STRETCH = 0.25  # hop level: a stretch moves share s to s x (s / mean)^STRETCH, then renormalizes
MAX_STRETCHES = 3  # hop level: stretches tried per run, each kept only if the step got shorter


def even_shares(k: int) -> tuple[int, ...]:
    """K equal integer shares summing to SHARE_TOTAL (the first ones one larger)."""
    base, extra = divmod(SHARE_TOTAL, k)
    return tuple(base + (1 if i < extra else 0) for i in range(k))


def proportional(weights: list[float], total: int = SHARE_TOTAL, floor: int = MIN_SHARE) -> tuple[int, ...]:
    """Integer shares summing to `total`, in proportion to `weights`, none below `floor` (largest remainder, ties
    to the lower index: deterministic)."""
    k = len(weights)
    floor = min(floor, total // k)
    spare = total - floor * k
    s = sum(weights)
    raw = [spare * w / s for w in weights] if s > 0 else [spare / k] * k
    out = [int(r) for r in raw]
    order = sorted(range(k), key=lambda i: (-(raw[i] - out[i]), i))
    for i in order[: spare - sum(out)]:
        out[i] += 1
    return tuple(floor + x for x in out)


@dataclass(frozen=True)
class Decision:
    shares: tuple[int, ...] | None  # the new shares; None: keep the plan
    gain: float  # predicted fall of the slowest communicator's time, as a fraction (0.25: 25% shorter)
    rates: tuple[float, ...]  # what each communicator delivered, in shares per second
    slow: tuple[int, ...]  # communicators far below the others


def _proportional_step(carried: list[float], seconds: list[float]) -> tuple[list[float], tuple[int, ...], float, float]:
    """(rates, shares in proportion to them, the slowest's seconds now, the slowest's seconds predicted after)."""
    secs = [max(t, 1e-9) for t in seconds]
    rates = [max(c, 1e-9) / t for c, t in zip(carried, secs, strict=True)]
    new = proportional(rates)
    return rates, new, max(secs), max(n / r for n, r in zip(new, rates, strict=True))


def _slow(rates: list[float]) -> list[int]:
    """The indices far below the others' median rate."""
    slow = []
    for k, r in enumerate(rates):
        others = rates[:k] + rates[k + 1 :]
        if others and r < SLOW_FACTOR * statistics.median(others):
            slow.append(k)
    return slow


def rebalance(
    carried: list[float], seconds: list[float], min_gain: float, current: tuple[int, ...] | None = None
) -> Decision:
    """The next shares from what each communicator carried (in shares: SHARE_TOTAL = a whole step's bytes) and the
    agreed seconds it took over the window (pure: the same inputs give the same plan on every rank)."""
    rates, new, now, after = _proportional_step(carried, seconds)
    gain = 1 - after / now
    keep = gain <= min_gain or new == current
    return Decision(None if keep else new, gain, tuple(rates), tuple(_slow(rates)))


def _within(rates: tuple[float, ...] | list[float], plan) -> list[float]:
    """Shares (floats summing to SHARE_TOTAL) in proportion to `rates` (here the unlimited shares), each within
    HOP_STEP x of its `plan` share: a share past its limit is held at it and the rest shared out again in proportion
    (water-filling)."""
    k = len(rates)
    lo, hi = [p / HOP_STEP for p in plan], [p * HOP_STEP for p in plan]
    fixed: dict[int, float] = {}
    vals: dict[int, float] = {}
    for _ in range(k):
        free = [i for i in range(k) if i not in fixed]
        budget, weight = SHARE_TOTAL - sum(fixed.values()), sum(rates[i] for i in free)
        if not free or budget <= 0 or weight <= 0:
            break
        vals = {i: budget * rates[i] / weight for i in free}
        past = {i: max(v / hi[i], lo[i] / v if v > 0 else float("inf")) for i, v in vals.items()}
        worst = max(past, key=lambda i: (past[i], -i))
        if past[worst] <= 1:
            break
        fixed[worst] = hi[worst] if vals[worst] > hi[worst] else lo[worst]  # the furthest past its limit, one a round
        vals = {}
    return [fixed.get(i, vals.get(i, 0.0)) for i in range(k)]


def even_table(hops: int, k: int) -> tuple[tuple[int, ...], ...]:
    """`comm.balance_level: hop` before its first re-plan: every hop's K connections carry equal shares."""
    return tuple(even_shares(k) for _ in range(hops))


@dataclass(frozen=True)
class HopDecision:
    shares: tuple[tuple[int, ...], ...] | None  # the new table (a row per sending host); None: keep the plan
    gain: float  # predicted fall of the slowest hop's time, as a fraction
    rates: tuple[tuple[float, ...], ...]  # per hop, what each connection delivered, in shares per second
    slow: tuple[tuple[int, int], ...]  # (hop, connection) pairs far below the hop's other connections


def rebalance_hops(
    carried: list[list[float]],
    seconds: list[list[float]],
    min_gain: float,
    current: tuple[tuple[int, ...], ...] | None = None,
) -> HopDecision:
    """`comm.balance_level: hop`: every hop's connections get shares in proportion to their rates (what each carried,
    in bytes or in shares, over the seconds it was busy: row h is host h's connections to host h-1); the plan changes
    only if the slowest hop under the installed table `current` (None: `carried` is in shares and is the table) is
    predicted to get more than `min_gain` shorter, as a ring goes at its slowest hop. One re-plan moves a share of
    `current` by at most HOP_STEP x, so a window whose figures are off cannot swing the table; a real spread
    wider than that takes two re-plans. Pure, as `rebalance`."""
    rows, rates_all, slow, now, after = [], [], [], 0.0, 0.0
    for h, (c, s) in enumerate(zip(carried, seconds, strict=True)):
        rates, new, _, row_after = _proportional_step(c, s)
        plan = current[h] if current is not None else c
        if current is not None:  # at most HOP_STEP x up or down per re-plan, then back to SHARE_TOTAL
            limited = _within(new, plan)
            new = proportional([max(x - MIN_SHARE, 0.0) for x in limited])  # shares within the limits map to themselves
            row_after = max(n / r for n, r in zip(new, rates, strict=True))
        rows.append(new)
        rates_all.append(tuple(rates))
        slow += [(h, k) for k in _slow(rates)]
        now = max(now, max(p / r for p, r in zip(plan, rates, strict=True)))
        after = max(after, row_after)
    table = tuple(rows)
    gain = 1 - after / now
    keep = gain <= min_gain or table == current
    return HopDecision(None if keep else table, gain, tuple(rates_all), tuple(slow))


def stretch_hops(table: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...] | None:
    """`comm.balance_level: hop`, once a re-plan in proportion to the measured rates predicts no gain: every row moved
    further from equal shares (share s to s x (s / mean)^STRETCH, renormalized, floor 2%). What a connection
    delivers over its busy time understates how far apart a hop's connections are (in the lab a fast connection read
    10-15% under its share of the link while a slow one held every ring step back), so proportional re-plans stop
    short of equal finishing times; a stretched table is a trial that the next window's step time keeps or takes
    back. None: nothing to stretch (every row equal). Pure, as `rebalance_hops`."""
    rows = []
    for row in table:
        mean = SHARE_TOTAL / len(row)
        w = [x * (x / mean) ** STRETCH for x in row]
        total = sum(w)
        rows.append(
            proportional([max(SHARE_TOTAL * x / total - MIN_SHARE, 0.0) for x in w])
        )  # shares map to themselves
    new = tuple(rows)
    return None if new == tuple(tuple(r) for r in table) else new


@dataclass
class BalanceState:
    """Where the balancer stands: the plan's shares and version, and the window being measured."""

    streams: int
    shares: tuple | None = None  # None until the first re-plan (the static plan); hop level: a row per host
    hops: int = 0  # comm.balance_level=hop: the ring's hops (its world size); 0: communicator level
    version: int = 0  # +1 per installed re-plan
    replans: int = 0
    quiet: int = 0  # windows in a row without a re-plan
    settled: bool = False
    stretches: int = 0  # hop level: stretched tables tried (`stretch_hops`)
    window: list[float] = field(default_factory=list)  # seconds per communicator, summed over the window
    steps: int = 0  # steps in the window so far
    skip: int = 1  # steps to leave out before measuring (the first step of a plan)

    @property
    def current(self) -> tuple:
        if self.shares is not None:
            return self.shares
        return even_table(self.hops, self.streams) if self.hops else even_shares(self.streams)

    def add(self, seconds: list[float]) -> None:
        if self.skip > 0:
            self.skip -= 1
            return
        self.window = [a + b for a, b in zip(self.window, seconds, strict=True)] if self.window else list(seconds)
        self.steps += 1

    def close(self, decision: Decision | HopDecision) -> None:
        """The window's decision is taken (and installed if it has shares): start the next window."""
        self.window, self.steps, self.skip = [], 0, 1
        if decision.shares is not None:
            self.shares, self.version, self.replans, self.quiet = decision.shares, self.version + 1, self.replans + 1, 0
        else:
            self.quiet += 1
            self.settled = self.quiet >= SETTLE_WINDOWS

    def to_state(self) -> dict:
        return {
            "shares": listed(self.shares),
            "hops": self.hops,
            "version": self.version,
            "replans": self.replans,
            "quiet": self.quiet,
            "settled": self.settled,
            "stretches": self.stretches,
        }

    @classmethod
    def from_state(cls, streams: int, state: dict, hops: int = 0) -> BalanceState:
        shares, saved = state.get("shares"), int(state.get("hops", 0))
        if saved != hops:
            where = f"hop level over {saved} hosts" if saved else "communicator level"
            want = f"hop level over {hops} hosts" if hops else "communicator level"
            raise ValueError(f"comm.balance: the checkpoint's shares are {where}, this run balances at {want}")
        if shares is not None:
            rows = shares if hops else [shares]
            bad = [len(row) for row in rows if len(row) != streams]
            if bad or len(rows) != max(hops, 1):
                raise ValueError(
                    f"comm.balance: the checkpoint's shares are for {bad[0] if bad else streams} communicators over "
                    f"{len(rows)} hops, not {streams} over {max(hops, 1)}"
                    if hops
                    else f"comm.balance: the checkpoint's shares are for {bad[0]} communicators, not {streams}"
                )
            shares = tuple(tuple(int(x) for x in row) for row in rows) if hops else tuple(int(x) for x in shares)
        return cls(
            streams,
            shares,
            hops,
            int(state.get("version", 0)),
            int(state.get("replans", 0)),
            int(state.get("quiet", 0)),
            bool(state.get("settled", False)),
            int(state.get("stretches", 0)),
        )


def listed(shares):
    """Shares (a tuple, or a table of tuples) as JSON lists."""
    if shares is None:
        return None
    return [list(row) if isinstance(row, tuple) else row for row in shares]
