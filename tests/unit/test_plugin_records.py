"""Every registered plug-in has what the rest of the tree shows of it, derived from its record (base/registry.py):
each allreduce backend a step-time model, a row and a prediction in the time model, a row in scripts/predict.py's
table and `train.py --plan --gpu`, and its label in compare_runs; each optimizer key is read by some optimizer."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from support import ROOT

import recipes.timemodel as tm
from base import registry
from recipes.comm import stepmodel as sm
from recipes.config import load_config
from scripts import compare_runs, predict

BACKENDS = list(registry.ALLREDUCE_BACKENDS.values())


@pytest.fixture(scope="module")
def record_cfg():
    return load_config(ROOT / "configs" / "dawnbench_158s.yaml", [])


@pytest.mark.parametrize("rec", BACKENDS, ids=lambda r: r.name)
def test_every_backend_has_a_step_model(rec):
    specs = [sm.TensorSpec(f"g{i}", (1 << 20,), "float32") for i in range(8)]
    comp = sm.no_overlap(specs, 0.1)
    net = sm.Network(4, 8, 32.0, 10.0, 50e-6)
    step = sm.predict_step(rec.name, specs, comp, net, **sm.backend_kwargs(rec.name)).step_s
    assert 0.1 < step < 10.0  # the 0.1 s of compute, then 32 MB over 32 Gbit/s links
    assert rec.name in sm.BACKENDS


@pytest.mark.parametrize("rec", BACKENDS, ids=lambda r: r.name)
def test_every_backend_has_its_rows_and_predictions(rec, record_cfg):
    rows = {b.label: b for b in tm.backends(record_cfg)}
    assert rec.time_flows, f"{rec.name}: no time-model row"
    for flows in rec.time_flows:
        label = rec.row_label(flows)
        assert rows[label].name == rec.name
        lo, mid, hi = tm.predict(16, 8, "v100-32gb", "fp16", backend=label)
        assert 60 < lo < mid < hi < 1200  # seconds of the record's schedule on its 128 V100s
    cfg = dataclasses.replace(record_cfg, comm=dataclasses.replace(record_cfg.comm, backend=rec.name))
    seconds, what = tm.predicted_seconds(cfg, 128, "v100-32gb")  # train.py --plan --gpu
    assert seconds is not None and f", {rec.label}, " in what


def test_predict_script_table_has_every_row(record_cfg):
    cluster = tm.Cluster(16, 8)
    prof = tm.profile_model(record_cfg.model.name)
    labels = [e.backend for e in predict.estimates(record_cfg, cluster, tm.published("v100-32gb"), prof)]
    want = [r.row_label(f) for r in BACKENDS for f in r.time_flows]
    assert labels[: len(want)] == want
    assert labels[len(want)].startswith("multistream (recommended: ")


@pytest.mark.parametrize("rec", BACKENDS, ids=lambda r: r.name)
def test_compare_runs_labels_every_backend(rec):
    summary = {"comm_backend": rec.name, "world_size": 2, "comm": {"backend": rec.name, "settings": {"flows": 4}}}
    assert compare_runs.backend_label(compare_runs.Run(Path("r"), summary, {}, [])) == rec.row_label(4)
    summary["comm"]["settings"] = {}
    assert compare_runs.backend_label(compare_runs.Run(Path("r"), summary, {}, [])) == rec.label
    unknown = {"comm_backend": "nccl_direct", "world_size": 2}
    assert compare_runs.backend_label(compare_runs.Run(Path("r"), unknown, {}, [])) == "nccl_direct"


def test_compression_reaches_only_the_backends_that_read_it(record_cfg):
    cfg = dataclasses.replace(record_cfg, comm=dataclasses.replace(record_cfg.comm, compression="fp16"))
    wire = {b.label: b.kwargs["compression"] for b in tm.backends(cfg)}
    for rec in BACKENDS:
        want = rec.wire_dtype or ("fp16" if rec.compression else "none")  # a fixed wire dtype whatever the config
        assert all(wire[rec.row_label(f)] == want for f in rec.time_flows), rec.name
    assert {wire["ddp"], wire["multistream"]} == {"none", "fp16"}  # DDP's hook sends the gradients' own dtype


def test_every_plugin_key_is_read_by_some_plugin():
    """Each config class of recipes/config/plugins.py is a record's config or a base of one: no key nobody reads."""
    from recipes.config import plugins
    from recipes.config.schema import own_class

    used = {base for seam in registry.SEAMS.values() for r in seam.records.values() for base in own_class(r).__mro__}
    declared = {c for c in vars(plugins).values() if dataclasses.is_dataclass(c) and c.__module__ == plugins.__name__}
    assert declared <= used, declared - used


def test_a_backend_variant_is_one_record(monkeypatch, record_cfg):
    """A DDP variant that sends fp16 (another comm hook) registered as a record only: the step model, the time
    model's row, --plan's prediction and compare_runs' label follow from it, with no other list to edit."""
    variant = registry.Allreduce("made_up_ddp_fp16", "recipes.comm.ddp:DDPBackend", "ddp fp16", "", wire_dtype="fp16")
    variant = dataclasses.replace(variant, step_model=registry.ALLREDUCE_BACKENDS["ddp"].step_model)
    monkeypatch.setitem(registry.ALLREDUCE_BACKENDS, "made_up_ddp_fp16", variant)
    specs = [sm.TensorSpec(f"g{i}", (1 << 20,), "float32") for i in range(8)]
    comp, net = sm.no_overlap(specs, 0.1), sm.Network(4, 8, 32.0, 10.0, 50e-6)
    half = sm.predict_step(
        "made_up_ddp_fp16", specs, comp, net, compression="fp16", **sm.backend_kwargs("made_up_ddp_fp16")
    )
    full = sm.predict_step("ddp", specs, comp, net, **sm.backend_kwargs("ddp"))
    assert half.messages == full.messages and 0.1 < half.step_s < full.step_s  # DDP's buckets, half the bytes
    cfg = dataclasses.replace(record_cfg, comm=dataclasses.replace(record_cfg.comm, compression="fp16"))
    rows = {b.label: b for b in tm.backends(cfg)}
    assert rows["ddp fp16"].name == "made_up_ddp_fp16" and rows["ddp fp16"].kwargs["compression"] == "fp16"
    cfg = dataclasses.replace(cfg, comm=dataclasses.replace(cfg.comm, backend="made_up_ddp_fp16"))
    seconds, what = tm.predicted_seconds(cfg, 128, "v100-32gb")
    assert seconds is not None and ", ddp fp16, " in what
    summary = {
        "comm_backend": "made_up_ddp_fp16",
        "world_size": 2,
        "comm": {"backend": "made_up_ddp_fp16", "settings": {}},
    }
    assert compare_runs.backend_label(compare_runs.Run(Path("r"), summary, {}, [])) == "ddp fp16"


def test_a_backend_that_always_sends_bf16_is_predicted_at_two_bytes(record_cfg):
    """A record's wire dtype is what the time model's bytes read: a DDP variant whose hook always sends bf16 (it
    does not read comm.compression) is predicted at 2 bytes per element, in predict_step and in the time model's row."""
    bf16 = next(r for r in BACKENDS if r.wire_dtype == "bf16")  # registered: DDP with torch's bf16 hook
    specs = [sm.TensorSpec(f"g{i}", (1 << 20,), "float32") for i in range(8)]
    comp, net = sm.no_overlap(specs, 0.1), sm.Network(4, 8, 32.0, 10.0, 50e-6)
    half = sm.messages(bf16.name, specs, comp, **sm.backend_kwargs(bf16.name))
    full = sm.messages("ddp", specs, comp, **sm.backend_kwargs("ddp"))
    assert [2 * m.nbytes for m in half] == [m.nbytes for m in full]
    step = sm.predict_step(bf16.name, specs, comp, net, **sm.backend_kwargs(bf16.name))
    assert step.step_s < sm.predict_step("ddp", specs, comp, net, **sm.backend_kwargs("ddp")).step_s
    assert step.settings.endswith(", wire bf16")
    for compression in ("none", "fp16"):  # comm.compression does not reach it
        cfg = dataclasses.replace(record_cfg, comm=dataclasses.replace(record_cfg.comm, compression=compression))
        assert {b.label: b for b in tm.backends(cfg)}[bf16.label].kwargs["compression"] == "bf16"


def test_the_docs_tables_list_every_registered_backend_and_optimizer():
    """docs/allreduce.md's backend tables and docs/recipe.md's optimizer table are written from the records
    (scripts/gen_config_reference.py; its --check is tests/unit/test_config.py's): each names every record."""
    for doc, block, table in (
        ("allreduce.md", "backends", registry.ALLREDUCE_BACKENDS),
        ("allreduce.md", "backend-measures", registry.ALLREDUCE_BACKENDS),
        ("recipe.md", "optimizers", registry.OPTIMIZERS),
    ):
        text = (ROOT / "docs" / doc).read_text()
        rows = text.split(f"<!-- {block}:begin")[1].split(f"<!-- {block}:end")[0].splitlines()[3:]
        assert [row.split(" | ")[0].strip("| `") for row in rows] == list(table), (doc, block)
