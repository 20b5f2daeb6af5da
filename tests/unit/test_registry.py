"""base/registry.py: every registered name loads an implementation of its seam's interface, and the config
schema accepts exactly the registered names."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import timm
import torch
from support import ROOT, input_args, input_from

from base import registry
from base.errors import ConfigError
from data import create_input
from data.pipeline import BasePipeline, InputPipeline
from recipes.comm.base import AllreduceBackend, BackendDefaults
from recipes.config import CommConfig, DataConfig, ModelConfig, OptimConfig, load_config
from recipes.distributed import DistInfo

BACKEND_METHODS = ("prepare", "on_step_end", "stats", "state_dict", "load_state_dict", "process_env")
PIPELINE_METHODS = ("train_batches", "val_batches", "close")


def _choices(cls, name: str) -> tuple:
    return typing.get_args(typing.get_type_hints(cls)[name])


def test_the_schema_takes_its_names_from_the_registries():
    assert _choices(CommConfig, "backend") == tuple(registry.ALLREDUCE_BACKENDS)
    assert _choices(DataConfig, "backend") == tuple(registry.INPUT_PIPELINES)
    assert _choices(ModelConfig, "name") == tuple(registry.MODELS)
    assert _choices(OptimConfig, "name") == tuple(registry.OPTIMIZERS)


@pytest.mark.parametrize(
    "override, message",
    [
        ("comm.backend=multistrem", "got 'multistrem' (did you mean 'multistream'?)"),
        ("model.name=resnet51", "model.name: expected one of 'resnet50_tweaked', "),
        ("optim.name=lras", "got 'lras' (did you mean 'lars'?)"),
        ("data.backend=dail", f"data.backend: expected one of {', '.join(map(repr, registry.INPUT_PIPELINES))}, got"),
        ("comm.backend=xyz", "got 'xyz'"),
    ],
)
def test_a_wrong_name_is_a_config_error_when_the_config_loads(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in str(e.value)
    if override.endswith("xyz"):
        assert "did you mean" not in str(e.value)  # nothing close: no guess


@pytest.mark.parametrize("name", list(registry.ALLREDUCE_BACKENDS))
def test_every_allreduce_backend_implements_the_interface(name):
    cls = registry.load(registry.ALLREDUCE_BACKENDS, name, "comm.backend", "backend")
    assert cls.name == name and issubclass(cls, BackendDefaults)
    assert all(callable(getattr(cls, m, None)) for m in BACKEND_METHODS)
    cfg = load_config(None, [f"comm.backend={name}"])
    backend = cls(cfg.comm, DistInfo(0, 1, 0, 1, torch.device("cpu")), timeout_s=60.0, model_name=cfg.model.name)
    assert isinstance(backend, AllreduceBackend)
    stats = backend.stats()  # one process: nothing reduced, nothing measured
    assert (stats.backend, stats.steps, stats.comm_seconds_per_step) == (name, 0, None)


@pytest.mark.parametrize("name", list(registry.INPUT_PIPELINES))
def test_every_input_pipeline_implements_the_interface(name):
    if registry.INPUT_PIPELINES[name].requires:
        pytest.importorskip(registry.INPUT_PIPELINES[name].requires, reason=f"{name} needs a package not installed")
    cls = registry.load(registry.INPUT_PIPELINES, name, "data.backend", "backend")
    assert issubclass(cls, BasePipeline)
    assert all(callable(getattr(cls, m, None)) for m in PIPELINE_METHODS)


def test_pipelines_get_the_dataset_identity_from_their_constructor(tiny_root):
    """create_input sets nothing on a pipeline after building it: the constructor has everything."""
    dist = DistInfo(0, 1, 0, 1, torch.device("cpu"))
    cfg = load_config(None, [f"data.root={tiny_root}", "data.workers=0"])
    pipe = create_input(cfg.data, dist, **input_args(cfg))
    assert isinstance(pipe, InputPipeline)
    assert (pipe.num_classes, pipe.num_train, pipe.num_val, len(pipe.classes)) == (4, 48, 20, 4)
    overrides = [
        "data.backend=synthetic",
        "data.synthetic_size=100",
        "data.synthetic_classes=7",
        "data.val_batch_size=4",
    ]
    synthetic = input_from(load_config(None, overrides), dist)
    assert isinstance(synthetic, InputPipeline)
    assert (synthetic.num_classes, synthetic.num_train, synthetic.num_val) == (7, 100, 8)
    assert synthetic.classes[:2] == ["class0000", "class0001"]


def test_optimizers_and_models_load():
    for name in registry.OPTIMIZERS:
        assert callable(registry.load(registry.OPTIMIZERS, name, "optim.name", "optimizer"))
    assert all(timm.is_model(r.arch) for r in registry.MODELS.values())
    names = ", ".join(registry.ALLREDUCE_BACKENDS)
    with pytest.raises(ConfigError, match=rf"comm.backend: unknown backend 'nope' \(expected one of {names}\)"):
        registry.load(registry.ALLREDUCE_BACKENDS, "nope", "comm.backend", "backend")


def test_every_backend_is_modelled_and_checked_by_the_gpu_check():
    """Every backend has a launcher, a bucket key of the schema and a step model; the GPU check's equality runs come
    from the records. (The network lab's methods are the lab's own: tests/lab/test_lab_methods.py.)"""
    from recipes.comm import stepmodel

    for name, r in registry.ALLREDUCE_BACKENDS.items():
        assert r.launcher in ("torchrun", "horovodrun") and r.bucket_key in r.reads, name  # its own config's key
        assert name in stepmodel.BACKENDS and isinstance(stepmodel.pattern(name), stepmodel.StepPattern), name
    assert registry.REFERENCE_BACKEND in registry.ALLREDUCE_BACKENDS
    torchrun = [n for n, r in registry.ALLREDUCE_BACKENDS.items() if r.launcher == "torchrun"]
    assert registry.compared_with_reference() == [n for n in torchrun if n != registry.REFERENCE_BACKEND]


def test_a_new_torchrun_backend_joins_the_gpu_checks_equality_runs(monkeypatch):
    fp16 = registry.Allreduce("made_up_ddp_fp16", "recipes.comm.ddp:DDPBackend", "ddp fp16", "", wire_dtype="fp16")
    monkeypatch.setitem(registry.ALLREDUCE_BACKENDS, "made_up_ddp_fp16", fp16)
    assert registry.compared_with_reference()[-1] == "made_up_ddp_fp16"


def test_a_prediction_for_a_network_the_rates_were_not_measured_on_says_so():
    import recipes.timemodel as tm

    record = load_config(ROOT / "configs" / "dawnbench_158s.yaml", [])
    seconds, what = tm.predicted_seconds(record, 128, "v100-32gb")
    assert seconds is not None and "rates measured on" not in what
    assert registry.MODELS[record.model.name].time_rates and not registry.MODELS["resnet18"].time_rates
    small = load_config(ROOT / "configs" / "dawnbench_158s.yaml", ["model.name=resnet18"])
    seconds, what = tm.predicted_seconds(small, 128, "v100-32gb")
    assert seconds is not None and what.endswith("; per-image rates measured on ResNet-50, not resnet18")


def test_the_input_term_is_asked_of_the_pipelines_record(monkeypatch):
    """The time model's input term follows the pipeline's record (`Input.gpu_decode`), not its name."""
    import recipes.timemodel as tm

    record = load_config(ROOT / "configs" / "dawnbench_158s.yaml", [])
    assert registry.INPUT_PIPELINES[record.data.backend].gpu_decode and tm.input_rate(record) is not None
    torch_input = load_config(ROOT / "configs" / "dawnbench_158s.yaml", ["data.backend=torch"])
    assert tm.input_rate(torch_input) is None
    cpu_decode = dataclasses.replace(registry.INPUT_PIPELINES[record.data.backend], gpu_decode=False)
    monkeypatch.setitem(registry.INPUT_PIPELINES, record.data.backend, cpu_decode)
    assert tm.input_rate(record) is None
