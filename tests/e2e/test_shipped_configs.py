"""Every shipped config's code-path settings, trained for a few steps at tiny size on CPU.

The combinations are read from configs/*.yaml and configs/presets/*.yaml when the tests are collected: each
config's settings that choose a code path (MATRIX: backend, optimizer and its momentum convention, precision,
memory format, accumulation, input pipeline, AugMix, blacklist, phase kinds), everything else sized down
(SIZED) or kept as it is (VALUES). Combinations several configs share run once. Every value of the settings a user
compares across allreduce backends (optimizer, precision, memory format, accumulation) that a distributed config
uses also runs on every other backend (the Horovod baseline included): a greedy cover of the shipped combinations
per backend (`_cover`), not every combination on every backend. A config that sets a key none of the three tables
knows fails `test_every_key_a_shipped_config_sets_is_classified`.

One process runs many combinations in turn (tests/train_worker.py): all torchrun ones under one torchrun with two
ranks, all Horovod ones under one horovodrun, the one-GPU configs in one plain process.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support import ROOT, TINY_CONFIG, TINY_OVERRIDES, horovodrun, needs_horovod, quiet_env, rank_results, torchrun

from base import registry
from data.make_sample import main as make_sample
from recipes.config import load_config
from recipes.config.load import load_yaml_tree
from recipes.config.schema import Config
from recipes.memory import accumulation
from recipes.schedule import Schedule

CONFIGS = sorted((ROOT / "configs").glob("*.yaml")) + sorted((ROOT / "configs" / "presets").glob("*.yaml"))
WORKER = str(ROOT / "tests" / "train_worker.py")
CLASSES, TRAIN_PER_CLASS, VAL_PER_CLASS = 4, 6, 3  # the `few_images` dataset: 2 steps of 12 images an epoch
TRAIN_IMAGES, VAL_IMAGES = CLASSES * TRAIN_PER_CLASS, CLASSES * VAL_PER_CLASS
BLACKLISTED = 2  # a config with data.val_blacklist gets a blacklist of this many tiny validation images
IMAGENET_TRAIN = 1_281_167  # whether a config accumulates is decided at its own size

# Keys whose value in the config is carried into the tiny run; their distinct values are distinct combinations.
MATRIX = (
    "run.amp",
    "run.channels_last",
    "run.compile",
    "run.ema",
    "run.ema_warmup",
    "run.on_nonfinite",
    "run.deterministic",
    "optim.name",
    "optim.lars_momentum",
    "optim.momentum_schedule",
    "optim.nesterov",
    "optim.no_bn_decay",
    "optim.adapt_bn_bias",
    "optim.lr_scaling",
    "comm.backend",
    "comm.compression",
    "comm.concurrency",
    "comm.autotune",
    "comm.tune_start",
    "comm.static_graph",
    "comm.gloo_devices",
    "data.backend",
    "data.aug_splits",
    "data.auto_augment",
    "data.dali_dtype",
    "data.skip_corrupt",
    "model.zero_init_last_bn",
    "phases.*.rect_val",
)

# Keys replaced at tiny size, and what takes their place.
SIZED = {
    "phases.*.epochs": "one epoch per tiny phase: the first phase, and the last where the config has more",
    "phases.*.image_size": "32 px (40 px in a last phase whose images are larger); smaller leaves layer4 1 x 1 px",
    "phases.*.batch_size": "12 images (8 in a last phase whose batch is smaller)",
    "phases.*.val_image_size": "the tiny phase's size",
    "phases.*.root": "the tiny dataset has one copy",
    "data.roots": "the tiny dataset has one copy",
    "data.root": f"{CLASSES} classes of {TRAIN_PER_CLASS} training and {VAL_PER_CLASS} validation images (few_images)",
    "data.workers": "0 (tests/tiny.yaml)",
    "data.val_batch_size": "8 (tests/tiny.yaml)",
    "data.val_blacklist": f"a blacklist of {BLACKLISTED} tiny validation images where the config names one",
    "model.name": "resnet10t (tests/tiny.yaml; every model is built in tests/unit/test_models.py)",
    "run.accumulate": "2 micro-batches where a phase of the config accumulates at its own world size",
    "run.max_gpu_batch": "half the tiny per-rank batch where a phase of the config accumulates at its own world size",
    "run.max_gpu_batch_by_size": "none: the tiny phases' sizes are not the config's (run.max_gpu_batch stands in)",
    "run.nodes": "one process for a config of one GPU, else two",
    "run.procs_per_node": "one process for a config of one GPU, else two",
    "run.threads": "1 (tests/tiny.yaml)",
    "run.name": "the combination's run directory",
    "comm.tune_max_candidates": "2 candidates of 1 window of 1 step (with comm.autotune)",
    "comm.tune_warmup_steps": "0 (with comm.autotune)",
    "comm.tune_steps_per_window": "1 (with comm.autotune)",
    "comm.tune_windows": "1 (with comm.autotune)",
    "comm.tune_cache": "none (with comm.autotune)",
    "dist.timeout_s": "60 s: a rank that crashed stops its peer soon",
    "log.every_steps": "1: every step's loss is checked",
    "log.tensorboard": "off (tests/tiny.yaml)",
    "dawnbench.require": "off: a tiny run is no DAWNBench entry",
}

# Keys kept as the config sets them: numbers and labels that change no code path.
VALUES = (
    "run.seed",
    "run.target_top1",
    "run.target_top5",
    "run.stop_at_target",
    "run.ema_decay",
    "run.gpu",  # read by --plan and predict.py only
    "optim.lr",
    "optim.warmup_epochs",
    "optim.warmup_start_lr",
    "optim.final_lr",
    "optim.momentum",
    "optim.momentum_end",
    "optim.weight_decay",
    "optim.label_smoothing",
    "optim.eta",
    "optim.trust_clip_min",
    "optim.trust_clip_max",
    "model.bn_momentum",
    "model.bn_eps",
    "model.drop_rate",
    "data.val_crop_ratio",
    "comm.bucket_cap_mb",
    "comm.bucket_mb",
    "comm.streams",
    "comm.slices",
    "comm.nccl_preset",
    "comm.link_gbit",
    "comm.flow_gbit",
    "comm.latency_us",
    "dawnbench.model",
    "phases.*.min_scale",
    "phases.*.min_object_area",
)

# At tiny size the LR is the tiny run's, and warm-up takes a quarter of the tiny run whatever its share in the
# config (LR 25 on 5 million weights in a few steps diverges, which says nothing about the code path).
TINY_LR = ["optim.lr=0.1", "optim.warmup_start_lr=0.0", "optim.final_lr=0.0", "optim.warmup_epochs=0.5"]
# Where the backend is changed from the config's: the settings the user compares (optimizer, precision, memory
# format, accumulation) and the backend; the rest from the first config with them.
CROSSED = ("optim.name", "optim.lars_momentum", "run.amp", "run.channels_last", "accumulates")


def _get(cfg: Config, key: str):
    section, name = key.rsplit(".", 1)
    value = cfg
    for part in section.split("."):
        value = getattr(value, part)
    if not hasattr(value, "get"):
        return getattr(value, name)
    # a key of another plug-in than the chosen one (lars_momentum under sgd) is not read: its declared default, the
    # value the combination runs with when a test switches the plug-in ("quickstart as multistream")
    from recipes.config.schema import knob_fields

    unread = object()
    got = value.get(name, unread)
    if got is not unread:
        return got
    field = knob_fields(section.split(".")[-1])[name][0]
    return field.default_factory() if field.default is dataclasses.MISSING else field.default


def _flat(tree: dict, prefix: str = "") -> list[str]:
    keys = []
    for k, v in tree.items():
        if k == "phases" and not prefix:
            keys += [f"phases.*.{pk}" for phase in v for pk in phase]
        elif isinstance(v, dict) and k not in ("roots", "max_gpu_batch_by_size"):  # mappings of values, not sections
            keys += _flat(v, f"{prefix}{k}.")
        else:
            keys.append(prefix + k)
    return keys


def _world(cfg: Config) -> int:
    return 1 if cfg.run.nodes * cfg.run.procs_per_node == 1 else 2


def _accumulates(cfg: Config) -> bool:
    world = cfg.run.nodes * cfg.run.procs_per_node
    plan = Schedule(cfg.phases, cfg.optim, num_images=IMAGENET_TRAIN, world_size=world, **accumulation(cfg))
    return any(e.micro_batches > 1 for e in plan.epochs)


def _tiny_phases(cfg: Config) -> list[dict]:
    """The first phase, and the last where there are more (a resolution and batch change, rect validation)."""
    first, last = cfg.phases[0], cfg.phases[-1]
    kinds = [(first, 32, 12)]
    if len(cfg.phases) > 1:
        kinds.append(
            (last, 40 if last.image_size > first.image_size else 32, 8 if last.batch_size < first.batch_size else 12)
        )
    return [
        {"epochs": 1, "image_size": size, "batch_size": batch, "min_scale": p.min_scale}
        | {"min_object_area": p.min_object_area, "rect_val": p.rect_val}
        for p, size, batch in kinds
    ]


@dataclass
class Combination:
    """One distinct set of code-path settings at tiny size, and the shipped configs that have it."""

    config: Path  # the first config with these settings: its other values are used
    world: int
    settings: dict  # MATRIX keys (phases as the tiny list) and "accumulates"
    configs: list[str] = field(default_factory=list)
    crossed_from: str = ""  # the backend the configs ship with, where this one is another

    def overrides(self, data_root: Path, blacklist: Path) -> list[str]:
        s = self.settings
        out = [*TINY_OVERRIDES, *TINY_LR, f"data.root={data_root}", "data.roots={}", "run.device=cpu"]
        out += ["run.nodes=1", f"run.procs_per_node={self.world}", "dist.timeout_s=60", "dawnbench.require=false"]
        out += [f"comm.backend={s['comm.backend']}", f"phases={json.dumps(s['phases'])}", "checkpoint.keep=1"]
        out.append(f"data.val_blacklist={blacklist if s['blacklist'] else ''}")
        out.append("run.max_gpu_batch_by_size={}")
        if s["accumulates"]:
            out += ["run.accumulate=1", f"run.max_gpu_batch={12 // self.world // 2}"]
        if s["comm.autotune"]:
            out += ["comm.tune_max_candidates=2", "comm.tune_warmup_steps=0", "comm.tune_steps_per_window=1"]
            out += ["comm.tune_windows=1", "comm.tune_cache=null"]
        return out

    @property
    def launcher(self) -> str:
        if self.world == 1:
            return "single"
        return "horovodrun" if self.settings["comm.backend"] == "horovod" else "torchrun"

    @property
    def name(self) -> str:
        s = self.settings
        optim = s["optim.name"] + (
            f"/{s['optim.lars_momentum']}" if "lars_momentum" in registry.OPTIMIZERS[s["optim.name"]].reads else ""
        )
        parts = [s["comm.backend"], optim, f"amp={s['run.amp']}", s["data.backend"]]
        flags = {
            "channels_last": s["run.channels_last"],
            "accumulate": s["accumulates"],
            f"aug_splits={s['data.aug_splits']}": s["data.aug_splits"],
            "blacklist": s["blacklist"],
            "rect_val": any(p["rect_val"] for p in s["phases"]),
            f"compile={s['run.compile']}": s["run.compile"] != "none",
            "ema": s["run.ema"],
            "autotune": s["comm.autotune"],
        }
        parts += [f for f, on in flags.items() if on]
        src = "+".join(self.configs) + (f" as {s['comm.backend']}" if self.crossed_from else "")
        return f"{self.world}proc-{'-'.join(parts)}-{len(s['phases'])}phase({src})"

    def skip_reason(self) -> str | None:
        if self.settings["run.compile"] != "none":
            import torch

            from models.factory import compile_unavailable

            return compile_unavailable(torch.device("cpu"))
        if self.settings["comm.backend"] == "horovod" and self.settings["comm.compression"] == "bf16":
            return "horovod has no bf16 wire format (comm.compression)"
        return None


def _key(world: int, settings: dict) -> str:
    """What makes two combinations the same: the phases by their kind (size, batch, rect validation), not the crop
    area's numbers (the run keeps those of the first config)."""
    kinds = [(p["image_size"], p["batch_size"], p["rect_val"]) for p in settings["phases"]]
    return json.dumps([world, settings | {"phases": kinds}], sort_keys=True)


def shipped_combinations() -> list[Combination]:
    """The distinct combinations of every shipped config, then each distributed one on the other backends."""
    found: dict[str, Combination] = {}
    for path in CONFIGS:
        cfg = load_config(path)
        settings = {k: _get(cfg, k) for k in MATRIX if not k.startswith("phases.")}
        settings |= {
            "phases": _tiny_phases(cfg),
            "accumulates": _accumulates(cfg),
            "blacklist": bool(cfg.data.val_blacklist),
        }
        combo = Combination(path, _world(cfg), settings)
        found.setdefault(_key(combo.world, settings), combo).configs.append(path.stem)
    shipped = list(found.values())
    distributed = [c for c in shipped if c.world > 1]
    for backend in registry.ALLREDUCE_BACKENDS:
        for combo in _cover(backend, distributed):
            settings = combo.settings | {"comm.backend": backend}
            key = _key(combo.world, settings)
            if key not in found:
                other = Combination(combo.config, 2, settings, list(combo.configs), combo.settings["comm.backend"])
                found[key] = other
    return list(found.values())


def _values(combos: list[Combination]) -> set[tuple[str, str]]:
    """The (key, value) pairs of the compared settings (CROSSED) that `combos` run."""
    return {(k, json.dumps(c.settings[k])) for c in combos for k in CROSSED}


def _cover(backend: str, distributed: list[Combination]) -> list[Combination]:
    """The shipped distributed combinations to run again on `backend` so that every value of every compared setting
    (CROSSED) that a shipped config uses runs on it at least once: greedily, the combination that adds the most
    values not yet run there, first in config order on a tie. The full cross (every combination on every backend)
    would repeat values already run and cost a tiny training each."""
    done = _values([c for c in distributed if c.settings["comm.backend"] == backend])
    wanted, picked = _values(distributed), []
    while wanted - done:
        best = max(distributed, key=lambda c: len(_values([c]) - done))  # max keeps the first of equals
        picked.append(best)
        done |= _values([best])
    return picked


COMBINATIONS = shipped_combinations()


def _params(launcher: str) -> list:
    out = []
    for c in COMBINATIONS:
        if c.launcher != launcher:
            continue
        marks = [needs_horovod] if launcher == "horovodrun" else []
        why = c.skip_reason()
        if why:
            marks.append(pytest.mark.skip(reason=why))
        out.append(pytest.param(c, id=c.name + (f" [skipped: {why}]" if why else ""), marks=marks))
    return out


# ---------------------------------------------------------------------------------------------------------------
# Running them: one process (group) per launcher, shared by that launcher's tests.


@pytest.fixture(scope="module")
def few_images(tmp_path_factory) -> Path:
    """Fewer images than `tiny_root`: each of the many runs trains two short epochs."""
    out = tmp_path_factory.mktemp("few")
    make_sample(
        ["--out", str(out), "--classes", str(CLASSES), "--train-per-class", str(TRAIN_PER_CLASS)]
        + ["--val-per-class", str(VAL_PER_CLASS)]
    )
    return out


@pytest.fixture(scope="module")
def blacklist(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("blacklist") / "blacklist.txt"
    path.write_text("".join(f"{i}\n" for i in range(1, BLACKLISTED + 1)))  # 1-based, as the devkit's file
    return path


def _jobs(launcher: str, few_images: Path, blacklist: Path, out: Path) -> tuple[list[dict], dict]:
    jobs, by_name = [], {}
    for param in _params(launcher):
        (combo,) = param.values
        if any(m.name == "skip" for m in param.marks):
            continue
        run_dir = out / f"run{len(jobs)}"
        by_name[combo.name] = run_dir
        jobs.append(
            {
                "id": combo.name,
                "config": str(combo.config.relative_to(ROOT)),
                "overrides": combo.overrides(few_images, blacklist),
                "run_dir": str(run_dir),
            }
        )
    return jobs, by_name


def _run_group(launcher: str, few_images: Path, blacklist: Path, out: Path) -> dict:
    """Run every combination of `launcher` in one process group; {name: (run_dir, process output)}."""
    jobs, by_name = _jobs(launcher, few_images, blacklist, out)
    jobs_file = out / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    if launcher == "single":
        p = subprocess.run(
            [sys.executable, WORKER, str(jobs_file)],
            cwd=ROOT,
            env=quiet_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
    elif launcher == "torchrun":
        p = torchrun(2, [WORKER, str(jobs_file)], timeout=600)
    else:
        p = horovodrun(2, [WORKER, str(jobs_file)], timeout=600)
    output = p.stdout[-4000:] + p.stderr[-4000:]
    failed = [(name, f) for name, run_dir in by_name.items() for f in sorted(run_dir.glob("rank*.json"))]
    failed = [(name, json.loads(f.read_text())) for name, f in failed]
    first = next(((name, r["exception"]) for name, r in failed if "exception" in r), None)
    if first:  # the worker stops at its first failure: the runs after it did not run
        output = f"the run that failed first in this process: {first[0]}\n{first[1][-3000:]}"
    return {name: (run_dir, output) for name, run_dir in by_name.items()}


@pytest.fixture(scope="module")
def torchrun_runs(few_images, blacklist, tmp_path_factory):
    return _run_group("torchrun", few_images, blacklist, tmp_path_factory.mktemp("torchrun"))


@pytest.fixture(scope="module")
def horovodrun_runs(few_images, blacklist, tmp_path_factory):
    return _run_group("horovodrun", few_images, blacklist, tmp_path_factory.mktemp("horovodrun"))


@pytest.fixture(scope="module")
def single_runs(few_images, blacklist, tmp_path_factory):
    return _run_group("single", few_images, blacklist, tmp_path_factory.mktemp("single"))


# ---------------------------------------------------------------------------------------------------------------
# What each run must show.

STEP_LOSS = re.compile(r"^epoch \d+/\d+  step \d+/\d+ .* loss (\S+) ", re.M)


def _check_run(combo: Combination, run_dir: Path, output: str) -> None:
    from recipes.evaluation.accuracy import config_from_checkpoint, load_model
    from recipes.rundir.checkpoint_files import load_checkpoint

    s = combo.settings
    rank0 = rank_results(run_dir, combo.world, output)[0]
    summary, log = rank0["summary"], rank0["stdout"]
    steps = sum(math.ceil(TRAIN_IMAGES / p["batch_size"]) for p in s["phases"])
    assert summary["epochs"] == len(s["phases"]) and summary["steps"] == steps
    assert summary["world_size"] == combo.world
    # every step's training loss is logged (log.every_steps=1) and finite, and so is every validation loss
    losses = [float(v) for v in STEP_LOSS.findall(log)]
    assert len(losses) == steps and all(math.isfinite(v) for v in losses), log
    assert all(math.isfinite(row["val_loss"]) for row in summary["history"])
    # fp16's grad scaler may skip the first step or two while it finds its scale; no other skips
    assert summary["skipped_steps"] <= (2 if s["run.amp"] == "fp16" else 0), rank0["stderr"]
    assert f"optimizer {s['optim.name']}" in log and f"allreduce {s['comm.backend']}" in log
    assert ("micro-batches x images/GPU" in log) == s["accumulates"], log
    excluded = BLACKLISTED if s["blacklist"] else 0
    assert summary["val_excluded"] == excluded and summary["val_count"] == VAL_IMAGES - excluded
    comm = summary["comm"]
    assert comm["backend"] == s["comm.backend"]
    if combo.world == 1:
        assert comm["steps"] == 0 and comm["bytes"] == 0  # one process: nothing to reduce
    else:
        # every optimizer step's gradients went through the backend once (accumulation included), in the wire format
        wire = 2 if registry.ALLREDUCE_BACKENDS[s["comm.backend"]].wire(s["comm.compression"]) != "none" else 4
        assert comm["steps"] == steps and comm["bytes"] == steps * _tiny_params() * wire, comm
    ck = load_checkpoint(run_dir / "checkpoint.pt")
    assert ck.training_state().step == steps and ck.world_size == combo.world
    assert bool(ck.scaler) == (s["run.amp"] == "fp16")  # the grad scaler's state, to resume fp16 with its scale
    assert (ck.ema is not None) == s["run.ema"]
    model = load_model(ck, config_from_checkpoint(ck))  # finite weights, the model's own structure
    assert sum(p.numel() for p in model.parameters()) == _tiny_params()


@functools.cache
def _tiny_params() -> int:
    """Weights of the tiny model for the tiny dataset's 4 classes."""
    from models import create_model

    return sum(p.numel() for p in create_model(load_config(TINY_CONFIG).model, 4).parameters())


@pytest.mark.slow
@pytest.mark.parametrize("combo", _params("torchrun"))
def test_shipped_combination_under_torchrun(combo, torchrun_runs):
    _check_run(combo, *torchrun_runs[combo.name])


@pytest.mark.slow
@pytest.mark.parametrize("combo", _params("horovodrun"))
def test_shipped_combination_under_horovodrun(combo, horovodrun_runs):
    _check_run(combo, *horovodrun_runs[combo.name])


@pytest.mark.slow
@pytest.mark.parametrize("combo", _params("single"))
def test_shipped_one_gpu_combination(combo, single_runs):
    _check_run(combo, *single_runs[combo.name])


# ---------------------------------------------------------------------------------------------------------------
# The matrix knows every key the shipped configs set.


def _schema_keys() -> set[str]:
    import dataclasses

    from recipes.config.schema import Phase, section_fields

    def walk(cls, prefix):
        for name, (_, tp) in section_fields(cls).items():  # a seam's section: every part's own keys too
            if dataclasses.is_dataclass(tp):
                yield from walk(tp, f"{prefix}{name}.")
            else:
                yield prefix + name

    return {k for k in walk(Config, "") if k != "phases"} | {f"phases.*.{f.name}" for f in dataclasses.fields(Phase)}


def test_every_key_a_shipped_config_sets_is_classified():
    known = set(MATRIX) | set(SIZED) | set(VALUES)
    assert not known - _schema_keys(), "classified keys that the schema does not have"
    assert len(known) == len(MATRIX) + len(SIZED) + len(VALUES), "a key is in two tables"
    for path in CONFIGS:
        unknown = sorted(set(_flat(load_yaml_tree(path))) - known)
        assert not unknown, (
            f"{path.relative_to(ROOT)} sets {unknown}: add each to MATRIX (it chooses a code path: the tiny run keeps "
            "it), SIZED (replaced at tiny size) or VALUES (a number that changes no code path) in this file"
        )


def test_the_matrix_covers_every_config_and_backend():
    covered = {name for c in COMBINATIONS for name in c.configs}
    assert covered == {p.stem for p in CONFIGS}
    assert len({c.name for c in COMBINATIONS}) == len(COMBINATIONS)  # a test id and a run directory each
    backends = {c.settings["comm.backend"] for c in COMBINATIONS}
    assert backends == set(registry.ALLREDUCE_BACKENDS)
    by_config = {name: c for c in COMBINATIONS if not c.crossed_from for name in c.configs}
    record = by_config["dawnbench_158s"].settings
    assert (record["comm.backend"], record["optim.name"], record["optim.lars_momentum"]) == (
        "multistream",
        "hybrid",
        "tf",
    )
    assert record["run.amp"] == "fp16" and record["run.channels_last"] and record["blacklist"]
    assert [p["rect_val"] for p in record["phases"]] == [False, True]
    assert by_config["v100_1gpu"].world == 1 and by_config["v100_1gpu"].settings["accumulates"]
    assert not by_config["v100_1x8"].settings["accumulates"] and by_config["v100_2x8"].settings["accumulates"]
    # every compared value of a distributed config runs on every backend
    distributed = [c for c in COMBINATIONS if c.world > 1]
    for backend in registry.ALLREDUCE_BACKENDS:
        on = [c for c in distributed if c.settings["comm.backend"] == backend]
        assert _values(on) == _values(distributed), backend
    assert len(distributed) < len({c.name for c in distributed if not c.crossed_from}) * len(backends)  # sampled
    # the record's optimizer and precision under the Horovod baseline
    assert any(
        c.crossed_from == "multistream"
        and c.settings["comm.backend"] == "horovod"
        and c.settings["optim.name"] == "hybrid"
        for c in COMBINATIONS
    )
