"""The auto-tuner's schedule, search and cache, driven by a synthetic step-time function (no processes)."""

from __future__ import annotations

import json

import pytest

from recipes.comm import tuner as tuning
from recipes.comm.plan import Settings
from recipes.config import load_config
from recipes.errors import ConfigError


def step_time(s: Settings) -> float:
    """A made-up network: more streams help up to 3, slicing helps a little, 8 MB buckets are best."""
    import math

    return 1.0 / min(s.streams, 3) + 0.05 * abs(math.log2(s.bucket_mb / 8)) + 0.02 / s.slices


def drive(tuner: tuning.AutoTuner, cost=step_time, outlier_every: int = 0) -> tuple[list[Settings], int]:
    """Run the tuner to the end the way the backend does (rank 0 proposes, everyone begins); returns the
    settings in force at every step and the number of steps."""
    seen, steps = [], 0
    while not tuner.done:
        seen.append(tuner.current)
        t = cost(tuner.current)
        steps += 1
        if outlier_every and steps % outlier_every == 0:
            t += 100.0  # e.g. the first step after validation
        if tuner.record(t):
            nxt = tuner.propose()
            if nxt is None:
                tuner.done = True
            else:
                tuner.begin(nxt)
    return seen, steps


@pytest.mark.parametrize("method", ["bayes", "grid"])
def test_search_respects_the_budget_and_keeps_the_fastest(method):
    space = tuning.search_space([2, 4, 8, 16, 32], [1, 2, 3, 4], [1, 2, 4])
    start = Settings(2.0, 1, 1)
    t = tuning.AutoTuner(space, start, max_candidates=10, warmup_steps=3, steps_per_window=2, windows=3, method=method)
    seen, steps = drive(t)
    assert len(t.trials) == 10
    assert len({tr.settings for tr in t.trials}) == 10  # never the same candidate twice
    assert steps == 3 + 10 * (1 + 3 * 2)  # warm-up, then per candidate one settling step and 3 windows of 2
    assert seen[0] == start
    win = t.winner()
    assert win.score == min(step_time(tr.settings) for tr in t.trials)
    assert all(len(tr.window_means) == 3 for tr in t.trials)


def test_bayes_finds_a_near_optimal_point_with_few_candidates():
    space = tuning.search_space([2, 4, 8, 16, 32], [1, 2, 3, 4], [1, 2, 4])
    t = tuning.AutoTuner(
        space, Settings(2.0, 1, 1), max_candidates=10, warmup_steps=0, steps_per_window=1, windows=1, method="bayes"
    )
    drive(t)
    best = min(step_time(s) for s in space)
    assert t.winner().score <= best * 1.1  # 10 of 60 points measured, within 10% of the true optimum


def test_median_over_windows_ignores_an_outlier_window():
    t = tuning.AutoTuner(
        [Settings(8, 3, 2)],
        Settings(4, 1, 1),
        max_candidates=2,
        warmup_steps=0,
        steps_per_window=2,
        windows=3,
        method="grid",
    )
    drive(t, outlier_every=5)  # one step in five is slow, so one window per candidate is inflated
    assert t.winner().settings == Settings(8, 3, 2)
    assert all(tr.score < 10 for tr in t.trials)


def test_grid_with_a_small_budget_spreads_over_the_space():
    space = tuning.search_space([2, 4, 8, 16, 32], [1, 2, 3, 4], [1, 2, 4])
    t = tuning.AutoTuner(
        space, Settings(8, 4, 2), max_candidates=5, warmup_steps=0, steps_per_window=1, windows=1, method="grid"
    )
    drive(t)
    tried = [tr.settings for tr in t.trials]
    assert tried[0] == Settings(8, 4, 2)
    assert {s.bucket_mb for s in tried[1:]} >= {2.0, 32.0}  # both ends of the grid, not just its start


def test_cache_round_trip(tmp_path):
    path = tmp_path / "sub" / "tune.json"
    t = tuning.AutoTuner(
        [Settings(16, 3, 2)],
        Settings(4, 1, 1),
        max_candidates=2,
        warmup_steps=0,
        steps_per_window=1,
        windows=1,
        method="grid",
    )
    drive(t)
    key = tuning.cache_key("resnet50", 8, "nccl", "float32", "none", "2nodes-x4")
    assert tuning.cache_load(path, key) is None
    tuning.cache_store(path, key, t)
    assert tuning.cache_load(path, key) == Settings(16.0, 3, 2)
    other = tuning.cache_key("resnet50", 16, "nccl", "float32", "none", "2nodes-x4")
    assert tuning.cache_load(path, other) is None
    data = json.loads(path.read_text())
    assert [c["streams"] for c in data[key]["candidates"]] == [1, 3]
    assert "model=resnet50|world=8|pg=nccl|dtype=float32|wire=none|net=2nodes-x4" in data
    path.write_text("{not json")
    assert tuning.cache_load(path, key) is None  # a broken cache means "tune again", never a crash


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("comm.streams=0", "comm.streams: expected an integer > 0, got 0"),
        ("comm.slices=-1", "comm.slices: expected an integer > 0"),
        ("comm.bucket_mb=0", "comm.bucket_mb: expected a number > 0"),
        ("comm.tune_streams=[]", "comm.tune_streams: expected a non-empty list"),
    ],
)
def test_bad_settings_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):  # the config's domains stop them before any backend is made
        load_config(None, ["comm.backend=multistream", override])


def test_bad_enum_is_a_config_error():
    with pytest.raises(ConfigError, match="comm.concurrency: expected one of 'auto', 'overlap', 'serialize'"):
        load_config(None, ["comm.concurrency=parallel"])
