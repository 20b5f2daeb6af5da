"""phases[].min_object_area: the record's TensorFlow crop bound, the lower bound of the crop area in both backends."""

from __future__ import annotations

import pytest
import torch
from support import FOLDER_PIPELINES, input_args, tiny_config

import data.transforms as T
from base.errors import ConfigError
from data import create_input
from recipes.config import Phase
from recipes.distributed import DistInfo
from recipes.schedule import Schedule

PHASES = "phases=[{epochs: 1, image_size: 32, batch_size: 8, min_scale: 0.11, min_object_area: 0.6}]"


def test_lower_bound_is_the_larger_of_min_scale_and_min_object_area():
    assert T.crop_min_area(Phase(epochs=1, image_size=96, batch_size=8, min_scale=0.11, min_object_area=0.15)) == 0.15
    assert T.crop_min_area(Phase(epochs=1, image_size=288, batch_size=8, min_scale=0.5, min_object_area=0.15)) == 0.5
    assert T.crop_min_area(Phase(epochs=1, image_size=96, batch_size=8, min_scale=0.35)) == 0.35  # default 0: no bound


@pytest.mark.parametrize("backend", FOLDER_PIPELINES)
def test_both_backends_crop_with_the_bound(backend, tiny_root, tmp_path, monkeypatch):
    seen = []
    if backend == "torch":
        draw = T.random_resized_crop_params

        def spy(rng, width, height, scale, *a, **k):
            seen.append(scale[0])
            return draw(rng, width, height, scale, *a, **k)  # torchvision's rule: its fallback may crop less

        monkeypatch.setattr(T, "random_resized_crop_params", spy)
    else:
        from data.dali_loader import DaliPipeline

        build = DaliPipeline._pipeline

        def spy(self, graph, batch_size, seed, **graph_args):
            if "min_scale" in graph_args:
                seen.append(graph_args["min_scale"])  # DALI's random_area = [this, 1]
            return build(self, graph, batch_size, seed, **graph_args)

        monkeypatch.setattr(DaliPipeline, "_pipeline", spy)
    cfg = tiny_config(tiny_root, tmp_path, f"data.backend={backend}", PHASES)
    pipe = create_input(cfg.data, DistInfo(0, 1, 0, 1, torch.device("cpu")), **input_args(cfg))
    x, _ = next(
        iter(pipe.train_batches(Schedule(cfg.phases, cfg.optim, num_images=pipe.num_train, world_size=1).epoch_info(0)))
    )
    pipe.close()
    assert x.shape == (8, 3, 32, 32) and seen and set(seen) == {0.6}


def test_min_object_area_outside_zero_one_is_refused(tiny_root, tmp_path):
    with pytest.raises(ConfigError, match=r"phases.0.min_object_area: expected a number in \[0, 1\], got 1.5"):
        tiny_config(tiny_root, tmp_path, "phases=[{epochs: 1, image_size: 32, batch_size: 8, min_object_area: 1.5}]")
