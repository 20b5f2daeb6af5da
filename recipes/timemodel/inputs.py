"""The input term: the images per second a GPU's DALI pipeline decodes, against what its training steps consume.

A step cannot be shorter than the time its pipeline takes to decode and crop the step's images; where it would be,
the difference is the "input wait" term. The rates are measured, not published: DALI's `mixed` decode (nvJPEG) and
random-resized-crop on one H200 with 8 CPU threads (`make gpu-check`, docs/gpu.md, 2026-12-04), taken per decode
thread and scaled by `data.workers` threads per GPU. Per host it is the same per GPU times the GPUs per host
(a host core per thread assumed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from base import registry

# make gpu-check on an H200, 2026-12-04 (docs/gpu.md, "DALI mixed decode + random-resized-crop"): img/s by image size
H200_DALI_MIXED = {96: 18729.0, 128: 18782.0, 224: 15361.0, 288: 16813.0}
H200_THREADS = 8  # DALI CPU threads of that measurement (the record config's data.workers)
# The measurement's JPEGs are the sample's (150-500 px); ImageNet's average 400 x 350 and some are far larger, which
# decode slower: the high end of the term takes 1.5x the time, the low end 0.8x.
LOW_HIGH = (0.8, 1.5)
SOURCE = (
    "DALI mixed decode + random-resized-crop measured on one H200 with 8 CPU threads (make gpu-check, docs/gpu.md, "
    "2026-12-04; the sample's 150-500 px JPEGs, ImageNet's decode slower), scaled by data.workers threads per GPU"
)


@dataclass(frozen=True)
class InputRate:
    """Images per second one GPU's input pipeline delivers, by image size."""

    threads_per_gpu: int
    per_thread: tuple[tuple[int, float], ...] = tuple((s, r / H200_THREADS) for s, r in H200_DALI_MIXED.items())
    source: str = SOURCE

    def images_per_s(self, image_size: int) -> float:
        """Per GPU at `image_size` (linear between the measured sizes, the nearest one's outside them)."""
        sizes, rates = zip(*self.per_thread, strict=True)
        return float(np.interp(image_size, sizes, rates)) * self.threads_per_gpu

    def step_s(self, image_size: int, batch: int) -> float:
        """Seconds one GPU's pipeline takes for a step of `batch` images at `image_size`."""
        return batch / self.images_per_s(image_size)


def input_rate(cfg) -> InputRate | None:
    """The config's input pipeline rate (one that decodes on the GPU, DALI: data.workers threads per GPU), or None
    where none was measured."""
    if not registry.INPUT_PIPELINES[cfg.data.backend].gpu_decode or cfg.data.workers < 1:
        return None
    return InputRate(cfg.data.workers)


__all__ = ["H200_DALI_MIXED", "InputRate", "input_rate"]
