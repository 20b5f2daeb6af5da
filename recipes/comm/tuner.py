"""Auto-tuning of (bucket size, communicators K, slices S) during the first steps of the real run.

Like Horovod's autotune: a few warm-up steps are discarded, then each candidate runs for `windows` windows of
`steps_per_window` steps (after one discarded settling step), and is scored by the median over windows of the
mean step time: backward plus gradient synchronisation, from the first gradient to the averages, timed on the
device (CUDA events on the stream that waited for every communicator; wall time on CPU: recipes/comm/timing.py).
The next candidate is chosen from the measurements by rank 0 (a small Gaussian-process
Bayesian optimisation with expected improvement, or a fixed grid) and broadcast, so every rank switches plan at
the same step boundary. With `comm.tune_start: model` the step-time model (stepmodel.py) ranks the space for the
cluster first, with the calibrated compute of the run's GPU (recipes/timemodel/) and the link probe's figures:
the search starts at its best and measures candidates in predicted order, so a few suffice.
After `max_candidates` candidates the fastest one wins, and is kept in a JSON cache keyed
by model, world size, process-group backend, dtypes and network, so that the next run starts tuned.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from base import reader
from base.errors import ConfigError
from recipes.comm import stepmodel
from recipes.comm.link_figures import LinkFigures, load_link_figures
from recipes.comm.plan import Settings
from recipes.config.schema import CommConfig, domain_rule, domain_text, section_fields


@dataclass
class Trial:
    settings: Settings
    window_means: list[float] = field(default_factory=list)

    @property
    def score(self) -> float:
        return statistics.median(self.window_means) if self.window_means else math.inf


def search_space(bucket_mb: list[float], streams: list[int], slices: list[int]) -> list[Settings]:
    return [
        Settings(float(b), k, s) for b, k, s in itertools.product(sorted(bucket_mb), sorted(streams), sorted(slices))
    ]


class AutoTuner:
    """Step-count-driven search; `propose()` runs on rank 0 only, everything else on every rank."""

    def __init__(
        self,
        space: list[Settings],
        start: Settings,
        *,
        max_candidates: int,
        warmup_steps: int,
        steps_per_window: int,
        windows: int,
        method: str = "bayes",
        predicted: dict[Settings, float] | None = None,
        start_note: str = "",
    ):
        if method not in ("bayes", "grid"):
            raise ValueError(f"tuner method: expected 'bayes' or 'grid', got {method!r}")
        self.predicted = predicted or {}
        self.start_note = start_note or f"started at the config's {start.label()}"
        if self.predicted:  # the model's ranking replaces the space-filling order
            space = sorted(space, key=lambda s: self.predicted.get(s, math.inf))
        self.space = list(dict.fromkeys([start, *space]))
        self.max_candidates = max(1, min(max_candidates, len(self.space)))
        self.warmup_steps, self.steps_per_window, self.windows = warmup_steps, steps_per_window, windows
        self.method = method
        rest, m = self.space[1:], self.max_candidates - 1
        picks = [round(i * (len(rest) - 1) / max(m - 1, 1)) for i in range(m)] if rest and m > 0 else []
        self._grid = [start] + [rest[i] for i in dict.fromkeys(picks)]  # start, then evenly through the grid
        self.trials: list[Trial] = [Trial(start)]
        self._step_in_trial = -warmup_steps  # negative: warm-up; 0: the settling step after a switch
        self._window: list[float] = []
        self.done = False

    @property
    def current(self) -> Settings:
        return self.trials[-1].settings

    @property
    def steps_per_trial(self) -> int:
        return 1 + self.windows * self.steps_per_window

    def record(self, seconds: float) -> bool:
        """Record one step's time under `current`; True when this trial is complete (a decision is due)."""
        i = self._step_in_trial
        self._step_in_trial += 1
        if i < 1:
            return False  # warm-up or settling step after a plan switch: not measured
        self._window.append(seconds)
        if len(self._window) == self.steps_per_window:
            self.trials[-1].window_means.append(sum(self._window) / len(self._window))
            self._window = []
        return len(self.trials[-1].window_means) == self.windows

    def propose(self) -> Settings | None:
        """Rank 0: the next candidate to try, or None when the search is over."""
        if len(self.trials) >= self.max_candidates:
            return None
        tried = {t.settings for t in self.trials}
        untried = [s for s in self.space if s not in tried]
        if not untried:
            return None
        if self.predicted:
            return untried[0]  # the next best predicted (self.space is in predicted order)
        if self.method == "grid":
            return next((s for s in self._grid if s not in tried), None)
        if len(self.trials) < min(3, self.max_candidates):
            return _farthest(untried, [t.settings for t in self.trials], self.space)  # space-filling start
        return _expected_improvement(self.trials, untried, self.space)

    def begin(self, settings: Settings) -> None:
        """Every rank: start measuring `settings` (the decision rank 0 broadcast)."""
        self.trials.append(Trial(settings))
        self._step_in_trial = 0
        self._window = []

    def winner(self) -> Trial:
        return min(self.trials, key=lambda t: t.score)

    def table(self) -> list[dict]:
        return [
            {
                **asdict(t.settings),
                "median_step_s": t.score,
                "windows": t.window_means,
                **({"predicted_s": self.predicted[t.settings]} if t.settings in self.predicted else {}),
            }
            for t in self.trials
        ]

    def summary(self) -> str:
        """Where the search started, and whether measuring changed that choice."""
        start, win = self.trials[0], self.winner()
        if win.settings == start.settings:
            return f"{self.start_note}; measurement confirmed it ({start.score * 1000:.0f} ms)"
        return (
            f"{self.start_note}; measurement changed it to {win.settings.label()} ({win.score * 1000:.0f} ms "
            f"against {start.score * 1000:.0f} ms)"
        )


def link_figures(comm) -> LinkFigures:
    """The link the model ranks for: the link probe's file `comm.network_file` when set (what scripts/launch.py
    --probe-network measured), else comm.link_gbit, flow_gbit and latency_us."""
    if comm.network_file:
        return load_link_figures(comm.network_file)
    if not comm.link_gbit or comm.link_gbit <= 0:
        raise ConfigError(
            f"comm.link_gbit: tune_start=model needs the link bandwidth in Gbit/s (or comm.network_file, the link "
            f"probe's figures), got {comm.link_gbit}"
        )
    return LinkFigures(comm.link_gbit, comm.flow_gbit or None, comm.latency_us, "comm.link_gbit")


def model_ranking(
    specs, space: list[Settings], hosts: int, gpus_per_host: int, comm, compute: stepmodel.Compute | None = None
) -> list[tuple[Settings, float]]:
    """The space ranked by the step-time model's step time on this cluster (`comm` is cfg.comm: its link figures
    and compression). `compute`: the calibrated step (calibrated_compute); None: gradients all ready at once after
    no compute, so only the communication itself is ranked."""
    link = link_figures(comm)
    net = stepmodel.Network(hosts, gpus_per_host, link.link_gbit, link.flow_gbit, link.latency_us * 1e-6)
    return stepmodel.recommend(specs, compute or stepmodel.no_overlap(specs), net, space, comm.compression)


def model_start(
    comm, specs, space: list[Settings], hosts: int, gpus_per_host: int, device_name: str | None, *, compute_start=None
) -> tuple:
    """(ranking, note): the space ranked for this run's cluster, link and calibrated compute, and a line that says
    where the tuner starts and from which figures. `comm`: the config's comm section; `compute_start(specs, world,
    gpus_per_host, device_name)` gives the calibrated compute (recipes.timemodel.calibrated_compute with the run's
    config bound); None: communication alone is ranked."""
    if compute_start is None:
        compute, what = None, "no calibrated compute (no run config given)"
    else:
        compute, what = compute_start(specs, hosts * gpus_per_host, gpus_per_host, device_name)
    ranked = model_ranking(specs, space, hosts, gpus_per_host, comm, compute)
    link = link_figures(comm)
    flow = f"{link.flow_gbit:g} Gbit/s per flow" if link.flow_gbit else "no per-flow cap"
    note = (
        f"started at the model's best for {hosts} hosts x {gpus_per_host}, {link.link_gbit:g} Gbit/s, {flow} "
        f"({link.source}), {what}: {ranked[0][0].label()} (predicted {ranked[0][1] * 1000:.0f} ms)"
    )
    return ranked, note


def _coords(s: Settings, space: list[Settings]) -> np.ndarray:
    """Settings -> [0, 1]^3 (log2 of bucket size, K and S, each scaled to the span of the search space)."""

    def unit(v: float, lo: float, hi: float) -> float:
        return 0.0 if hi == lo else (v - lo) / (hi - lo)

    logb = [math.log2(x.bucket_mb) for x in space]
    ks = [x.streams for x in space]
    ss = [math.log2(x.slices) for x in space]
    return np.array(
        [
            unit(math.log2(s.bucket_mb), min(logb), max(logb)),
            unit(s.streams, min(ks), max(ks)),
            unit(math.log2(s.slices), min(ss), max(ss)),
        ]
    )


def _farthest(untried: list[Settings], tried: list[Settings], space: list[Settings]) -> Settings:
    pts = [_coords(t, space) for t in tried]
    return max(untried, key=lambda s: min(float(np.sum((_coords(s, space) - p) ** 2)) for p in pts))


def _expected_improvement(trials: list[Trial], untried: list[Settings], space: list[Settings]) -> Settings:
    """The untried point with the largest expected improvement under a GP fitted to the normalised times."""
    x = np.stack([_coords(t.settings, space) for t in trials])
    y = np.array([t.score for t in trials])
    mu, sd = y.mean(), y.std() or 1.0
    yn = (y - mu) / sd
    length, noise = 0.35, 1e-2

    def k(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        d2 = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
        return np.exp(-0.5 * d2 / length**2)

    kxx = k(x, x) + noise * np.eye(len(x))
    chol = np.linalg.cholesky(kxx)
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, yn))
    xs = np.stack([_coords(s, space) for s in untried])
    ks = k(xs, x)
    mean = ks @ alpha
    v = np.linalg.solve(chol, ks.T)
    std = np.sqrt(np.clip(1.0 - (v**2).sum(0), 1e-12, None))
    best, xi = yn.min(), 0.01
    z = (best - mean - xi) / std
    cdf = 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
    pdf = np.exp(-0.5 * z**2) / math.sqrt(2 * math.pi)
    ei = (best - mean - xi) * cdf + std * pdf
    return untried[int(np.argmax(ei))]


# ---------------------------------------------------------------------------------------------------------
# The cache of winners.


def default_cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dawnbench" / "allreduce_tuning.json"


def cache_key(model: str, world_size: int, pg_backend: str, param_dtype: str, wire: str, network: str) -> str:
    return f"model={model}|world={world_size}|pg={pg_backend}|dtype={param_dtype}|wire={wire}|net={network}"


def _note_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def cache_entry_problem(entry) -> str | None:
    """Why a cache entry is not a usable (bucket_mb, streams, slices), judged by comm's own domains (None: it is)."""
    if not isinstance(entry, dict):
        return f"an entry must be an object, got {type(entry).__name__}"
    fields = {k: f for k, (f, _) in section_fields(CommConfig).items()}  # multistream's keys among them
    for name, kind in (("bucket_mb", float), ("streams", int), ("slices", int)):
        v = entry.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
            return f"{name} must be {'an integer' if kind is int else 'a number'}, got {v!r}"
        domain = fields[name].metadata["domain"]
        for word in domain.split():
            test, _ = domain_rule(word)
            if not test(v):
                return f"{name}={v!r} is outside comm.{name}'s domain ({domain_text(domain)})"
    return None


def cache_load(path: Path, key: str, note=_note_stderr) -> Settings | None:
    """The cached winner for `key`, or None. A cache that is not a tuner cache, or an entry whose values comm would
    refuse, is never used: `note` gets one line naming the file and what is wrong, and the run tunes afresh."""
    if not path.exists():
        return None
    fix = "delete it (or the entry) to tune again, or set comm.tune_cache=null"
    try:
        data = reader.read_json_object(path, what="autotune cache", error=ConfigError)
    except ConfigError as e:
        note(f"warning: {e}; not used ({fix})")
        return None
    if key not in data:
        return None
    problem = cache_entry_problem(data[key])
    if problem:
        note(f"warning: autotune cache '{path}', entry {key}: {problem}; not used ({fix})")
        return None
    e = data[key]
    return Settings(float(e["bucket_mb"]), int(e["streams"]), int(e["slices"]))


def cache_store(path: Path, key: str, tuner: AutoTuner, note=_note_stderr) -> None:
    """Add the tuner's winner to the cache at `path` (written to a temp file and renamed, never through a link).
    A file there that is not a tuner cache is left as it is, with one line saying so."""
    data = {}
    if path.exists() or path.is_symlink():
        try:
            data = reader.read_json_object(path, what="autotune cache", error=ConfigError)
        except ConfigError as e:
            note(f"warning: {e}; the winner was not stored (delete the file to keep winners)")
            return
    win = tuner.winner()
    data[key] = {
        **asdict(win.settings),
        "median_step_s": win.score,
        "tuned_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "candidates": tuner.table(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)  # our own leftover (same pid)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)
