"""recipes/memory.py: the per-phase memory estimate, its published anchors, and the refusal that names the fix."""

from __future__ import annotations

import pytest

from base.errors import ConfigError
from recipes import memory
from recipes.config import load_config
from recipes.schedule import Schedule

IMAGES = 1_281_167


def _need(size: int, micro: int, amp: str = "fp16", per_gpu: int | None = None) -> memory.Need:
    return memory.need("resnet50", image_size=size, micro_batch=micro, per_gpu_batch=per_gpu or micro, amp=amp)


def test_activation_bytes_are_measured_and_scale_with_pixels_batch_and_dtype():
    per_px = memory.activation_bytes_per_pixel("resnet50")
    assert 1500 < per_px < 2100  # timm resnet50: ~86 MB saved per 224 px image in float32
    a, b = _need(224, 64), _need(224, 128)
    assert b.activations == pytest.approx(2 * a.activations, rel=1e-6)
    assert _need(448, 64).activations == pytest.approx(4 * a.activations, rel=1e-6)
    assert _need(224, 64, "none").activations == pytest.approx(a.activations / memory.HALF_SHARE, rel=1e-6)
    assert a.states == memory.parameter_count("resnet50") * 16


def test_published_batches_fit_and_twice_them_do_not():
    v100, v100_32 = memory.gpu_memory_bytes("v100"), memory.gpu_memory_bytes("v100-32gb")
    usable = memory.usable_bytes
    assert _need(224, 256).total <= usable(v100)  # NVIDIA's examples: AMP, 256 per V100 16 GB
    assert _need(224, 512).total > usable(v100)
    assert _need(288, 128).total <= usable(v100_32)  # the record: 128 per V100 32 GB at 288 px
    assert _need(288, 512).total > usable(v100_32)


def _cfg(*overrides):
    return load_config("configs/dawnbench_8gpu.yaml", list(overrides))


def test_a_phase_that_does_not_fit_is_named_with_the_accumulation_that_does():
    cfg = _cfg()
    gpu = memory.gpu_memory_bytes("a100")
    problems = memory.check_fits(
        cfg, Schedule(cfg.phases, cfg.optim, num_images=IMAGES, world_size=1, **memory.accumulation(cfg)), gpu, "a100"
    )
    assert [p.split(" ")[0] for p in problems] == ["phases.2", "phases.3"]  # 224 and 288 px; 96/128 px fit
    assert "2048 images per GPU as 1 x 2048" in problems[0] and "set run.accumulate=2" in problems[0]
    fix = problems[0].split("set ")[1].split(" ")[0]
    cap = problems[0].rsplit("run.max_gpu_batch=", 1)[1]
    for override in (fix, f"run.max_gpu_batch={cap}"):
        fixed = _cfg(override)
        left = memory.check_fits(
            fixed,
            Schedule(fixed.phases, fixed.optim, num_images=IMAGES, world_size=1, **memory.accumulation(fixed)),
            gpu,
            "a100",
        )
        assert not [p for p in left if p.startswith("phases.2")], override


def test_nothing_fits_is_said_so():
    cfg = _cfg("phases=[{epochs: 6, image_size: 4096, batch_size: 8}]")
    (line,) = memory.check_fits(
        cfg,
        Schedule(cfg.phases, cfg.optim, num_images=IMAGES, world_size=1, **memory.accumulation(cfg)),
        memory.gpu_memory_bytes("v100"),
        "v100",
    )
    assert "no micro-batch fits" in line


def test_an_unknown_gpu_names_the_choices():
    with pytest.raises(ConfigError, match="--gpu: expected one of v100, v100-32gb"):
        memory.gpu_memory_bytes("k80")


def test_a_captured_phase_counts_its_graph_pool():
    """NVIDIA's 256 images per V100 16 GB at 224 px fits eagerly (13.9 of 14.4 GiB) but not as a CUDA graph, whose
    pool holds the step's activations again; the line names the pool and the micro-batch that fits then."""
    eager, graph = (
        _need(224, 256),
        memory.need("resnet50", image_size=224, micro_batch=256, per_gpu_batch=256, amp="fp16", captured=True),
    )
    assert graph.graph_pool == eager.activations and graph.total == eager.total + eager.activations
    cfg = _cfg("model.name=resnet50", "phases=[{epochs: 6, image_size: 224, batch_size: 256}]", "run.amp=fp16")
    plan = Schedule(cfg.phases, cfg.optim, num_images=IMAGES, world_size=1, **memory.accumulation(cfg))
    v100 = memory.gpu_memory_bytes("v100")
    assert memory.check_fits(cfg, plan, v100, "v100", captured=[False]) == []
    (line,) = memory.check_fits(cfg, plan, v100, "v100", captured=[True])
    pool = eager.activations / memory.GIB
    assert f"(of which the CUDA graph's pool ~{pool:.1f} GiB), v100 has 16 GiB" in line
    fits = memory.largest_micro_batch(
        "resnet50", image_size=224, per_gpu_batch=256, amp="fp16", gpu_bytes=v100, captured=True
    )
    assert 100 < fits < 140 and f"run.max_gpu_batch={fits}" in line  # about half of eager's 266
    assert memory.captured_phases(cfg, plan) == [False]  # run.cuda_graph=auto: nothing proven, nothing captured
