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


def rebalance(
    carried: list[float], seconds: list[float], min_gain: float, current: tuple[int, ...] | None = None
) -> Decision:
    """The next shares from what each communicator carried (in shares: SHARE_TOTAL = a whole step's bytes) and the
    agreed seconds it took over the window (pure: the same inputs give the same plan on every rank)."""
    secs = [max(t, 1e-9) for t in seconds]
    rates = [max(c, 1e-9) / t for c, t in zip(carried, secs, strict=True)]
    new = proportional(rates)
    now, after = max(secs), max(n / r for n, r in zip(new, rates, strict=True))
    gain = 1 - after / now
    slow = []
    for k, r in enumerate(rates):
        others = rates[:k] + rates[k + 1 :]
        if others and r < SLOW_FACTOR * statistics.median(others):
            slow.append(k)
    keep = gain <= min_gain or new == current
    return Decision(None if keep else new, gain, tuple(rates), tuple(slow))


@dataclass
class BalanceState:
    """Where the balancer stands: the plan's shares and version, and the window being measured."""

    streams: int
    shares: tuple[int, ...] | None = None  # None until the first re-plan (the static plan)
    version: int = 0  # +1 per installed re-plan
    replans: int = 0
    quiet: int = 0  # windows in a row without a re-plan
    settled: bool = False
    window: list[float] = field(default_factory=list)  # seconds per communicator, summed over the window
    steps: int = 0  # steps in the window so far
    skip: int = 1  # steps to leave out before measuring (the first step of a plan)

    @property
    def current(self) -> tuple[int, ...]:
        return self.shares if self.shares is not None else even_shares(self.streams)

    def add(self, seconds: list[float]) -> None:
        if self.skip > 0:
            self.skip -= 1
            return
        self.window = [a + b for a, b in zip(self.window, seconds, strict=True)] if self.window else list(seconds)
        self.steps += 1

    def close(self, decision: Decision) -> None:
        """The window's decision is taken (and installed if it has shares): start the next window."""
        self.window, self.steps, self.skip = [], 0, 1
        if decision.shares is not None:
            self.shares, self.version, self.replans, self.quiet = decision.shares, self.version + 1, self.replans + 1, 0
        else:
            self.quiet += 1
            self.settled = self.quiet >= SETTLE_WINDOWS

    def to_state(self) -> dict:
        return {
            "shares": list(self.shares) if self.shares is not None else None,
            "version": self.version,
            "replans": self.replans,
            "quiet": self.quiet,
            "settled": self.settled,
        }

    @classmethod
    def from_state(cls, streams: int, state: dict) -> BalanceState:
        shares = state.get("shares")
        if shares is not None and len(shares) != streams:
            raise ValueError(
                f"comm.balance: the checkpoint's shares are for {len(shares)} communicators, not {streams}"
            )
        return cls(
            streams,
            tuple(int(x) for x in shares) if shares is not None else None,
            int(state.get("version", 0)),
            int(state.get("replans", 0)),
            int(state.get("quiet", 0)),
            bool(state.get("settled", False)),
        )
