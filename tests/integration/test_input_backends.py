"""Every input backend: batch shapes, dtypes and layouts; the same labels, classes and pixels across backends."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from support import FOLDER_PIPELINES, ROOT, input_args, input_from, run_context, tiny_config

from base import registry
from base.errors import ConfigError
from data import create_input
from data.make_sample import main as make_sample
from recipes.config import load_config
from recipes.distributed import DistInfo
from recipes.schedule import Schedule

CPU = DistInfo(0, 1, 0, 1, torch.device("cpu"))


def _first_batches(cfg):
    pipe = create_input(cfg.data, CPU, **input_args(cfg))
    info = Schedule(cfg.phases, cfg.optim, num_images=pipe.num_train, world_size=1).epoch_info(0)
    train = next(iter(pipe.train_batches(info)))
    val = next(iter(pipe.val_batches(info.phase)))
    pipe.close()
    return train, val


@pytest.mark.parametrize(
    "backend, overrides, dtype, channels_last",
    [
        ("dali", [], torch.float32, False),
        ("dali", ["run.channels_last=true"], torch.float32, True),  # DALI writes NHWC: no transpose afterwards
        ("dali", ["data.dali_dtype=float16"], torch.float16, False),
        ("torch", [], torch.float32, False),
        ("torch", ["run.channels_last=true"], torch.float32, True),
        ("synthetic", ["data.synthetic_size=48", "data.synthetic_classes=4"], torch.float32, False),
        (
            "synthetic",
            ["data.synthetic_size=48", "data.synthetic_classes=4", "run.channels_last=true"],
            torch.float32,
            True,
        ),
    ],
)
def test_batch_shape_dtype_and_layout(tiny_root, tmp_path, backend, overrides, dtype, channels_last):
    phases = "phases=[{epochs: 1, image_size: 40, batch_size: 6, val_image_size: 36}]"
    cfg = tiny_config(tiny_root, tmp_path, f"data.backend={backend}", "data.val_batch_size=5", phases, *overrides)
    (x, y), (vx, vy) = _first_batches(cfg)
    assert x.shape == (6, 3, 40, 40) and vx.shape[1:] == (3, 36, 36)
    assert vx.shape[0] == (10 if backend == "synthetic" else 5)  # synthetic: its whole val share in one batch
    for images, labels in ((x, y), (vx, vy)):
        assert images.dtype == dtype and images.device.type == "cpu"
        assert images.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        assert labels.dtype == torch.int64 and labels.min() >= 0 and labels.max() < 4
        if backend != "synthetic":  # normalized with the ImageNet mean/std: roughly zero-centred, unit spread
            assert -3.0 < float(images.float().mean()) < 3.0 and 0.2 < float(images.float().std()) < 3.0


@pytest.mark.parametrize("rect", [False, True])
def test_dali_and_torch_agree_on_classes_labels_and_validation_pixels(tiny_root, tmp_path, rect):
    phases = f"phases=[{{epochs: 1, image_size: 48, batch_size: 6, rect_val: {str(rect).lower()}}}]"
    out = {}
    for backend in FOLDER_PIPELINES:
        cfg = tiny_config(tiny_root, tmp_path, f"data.backend={backend}", "data.val_batch_size=7", phases)
        pipe = create_input(cfg.data, CPU, **input_args(cfg))
        batches = [(x.clone(), y.clone()) for x, y in pipe.val_batches(cfg.phases[0])]
        out[backend] = (pipe.classes, batches)
        pipe.close()
    assert out["dali"][0] == out["torch"][0] == sorted(p.name for p in (tiny_root / "train").iterdir())
    dali, tv = out["dali"][1], out["torch"][1]
    assert [y.tolist() for _, y in dali] == [y.tolist() for _, y in tv]
    for (a, _), (b, _) in zip(dali, tv, strict=True):
        assert a.shape == b.shape
        # Same resize, same crop window: they differ only by resampling rounding (measured ~0.003).
        assert (a - b).abs().mean() < 0.02


@pytest.fixture(scope="module")
def odd_val_root(tmp_path_factory):
    """A dataset whose validation split holds a CMYK JPEG, a grayscale JPEG and a PNG named .JPEG."""
    root = tmp_path_factory.mktemp("oddval")
    make_sample(["--out", str(root), "--classes", "3", "--train-per-class", "2", "--val-per-class", "1", "--odd"])
    for path in (root / "train").rglob("*_odd_*"):
        shutil.move(path, root / "val" / path.parent.name / path.name)
    return root


def test_odd_files_decode_as_the_same_rgb_in_every_backend(odd_val_root, tmp_path):
    odd = sorted(p.name.rsplit("_", 1)[1] for p in (odd_val_root / "val").rglob("*_odd_*"))
    assert odd == ["cmyk.JPEG", "gray.JPEG", "png.JPEG"]
    phases = "phases=[{epochs: 1, image_size: 32, batch_size: 3, rect_val: true, val_image_size: 40}]"
    out = {}
    for backend in FOLDER_PIPELINES:
        cfg = tiny_config(odd_val_root, tmp_path, f"data.backend={backend}", "data.val_batch_size=1", phases)
        pipe = create_input(cfg.data, CPU, **input_args(cfg))
        out[backend] = [x for x, _ in pipe.val_batches(cfg.phases[0])]
        pipe.close()
    assert len(out["dali"]) == len(out["torch"]) == 6
    for a, b in zip(out["dali"], out["torch"], strict=True):
        assert a.shape[:2] == (1, 3) and a.shape == b.shape
        assert (a - b).abs().mean() < 0.02  # CMYK and grayscale converted to RGB the same way as PIL does


def test_dali_keys_are_checked_and_the_quickstart_uses_dali():
    assert load_config(ROOT / "configs" / "quickstart.yaml").data.backend == "dali"
    with pytest.raises(ConfigError, match="data.dali_prefetch: expected an integer > 0, got 0"):
        load_config(None, ["data.dali_prefetch=0"])
    with pytest.raises(ConfigError, match="data.dali_dtype: expected one of 'auto', 'float32', 'float16'"):
        load_config(None, ["data.dali_dtype=bf16"])


def _indexed(split, n):
    """The first n files of a split, with label = file index (a batch's labels say which files it holds)."""
    from data.folder import Split

    return Split(split.root, split.classes, split.files[:n], list(range(n)))


@pytest.mark.parametrize("world", [1, 2])
def test_short_last_batch_is_filled_the_same_way_by_every_folder_pipeline(tiny_root, tmp_path, world):
    """17 images, global batch 8: every batch is full (no 1-image batch for BatchNorm) and every pipeline that reads
    folders (the registry's `reads_folders`) reads the same samples in the same order, the shard wrapping around to
    fill the last batch."""
    from data.folder import scan_split

    train, val = _indexed(scan_split(tiny_root, "train"), 17), scan_split(tiny_root, "val")
    streams = {}
    assert len(FOLDER_PIPELINES) >= 2  # a comparison: torch's and DALI's decoders today
    for name in FOLDER_PIPELINES:
        cls = registry.resolve(registry.INPUT_PIPELINES[name].impl)
        cfg = tiny_config(
            tiny_root, tmp_path, f"data.backend={name}", "phases=[{epochs: 1, image_size: 16, batch_size: 8}]"
        )
        plan = Schedule(cfg.phases, cfg.optim, num_images=len(train), world_size=world)
        info = plan.epoch_info(0)
        for rank in range(world):
            d = DistInfo(rank, world, rank, world, torch.device("cpu"))
            pipe = cls(cfg.data, d, run_context(cfg), train, val, {"full": (train, val)})
            batches = list(pipe.train_batches(info))
            assert len(batches) == info.steps
            assert [len(y) for _, y in batches] == [8 // world] * info.steps
            streams[name, rank] = [int(v) for _, y in batches for v in y]
            pipe.close()
    for rank in range(world):
        assert all(streams[name, rank] == streams[FOLDER_PIPELINES[0], rank] for name in FOLDER_PIPELINES), rank


def test_dali_refuses_images_above_the_pixel_limit_and_non_utf8_names(tiny_root, tmp_path, capsys):
    """Judged from the file name and image header before DALI decodes anything; the torch backend applies the
    same data.max_image_pixels when it opens the file."""
    from PIL import Image

    from base.errors import DataError
    from data.transforms import load_rgb

    root = tmp_path / "data"
    shutil.copytree(tiny_root, root)
    wnid = sorted(p.name for p in (root / "train").iterdir())[0]
    bomb = root / "train" / wnid / "bomb.png"
    Image.new("L", (3000, 2000)).save(bomb)  # 6 Mpixel, a few kB on disk
    cfg = tiny_config(root, tmp_path, "data.backend=dali", "data.max_image_pixels=5000000")
    info = Schedule(cfg.phases, cfg.optim, num_images=49, world_size=1).epoch_info(0)
    pipe = create_input(cfg.data, CPU, **input_args(cfg))
    with pytest.raises(DataError) as e:
        pipe.train_batches(info)  # checked when the phase's pipeline is built, before DALI decodes anything
    pipe.close()
    assert str(e.value) == (
        f"image '{bomb}' has 3000x2000 = 6,000,000 pixels, above data.max_image_pixels (5,000,000): refused "
        "before decoding (a decompression bomb, or raise the limit) (set data.skip_corrupt: true to skip such files)"
    )
    with pytest.raises(DataError, match="above data.max_image_pixels"):
        load_rgb(str(bomb), 5_000_000)
    assert load_rgb(str(bomb), 6_000_000).size == (3000, 2000)
    pipe = input_from(
        tiny_config(root, tmp_path, "data.backend=dali", "data.max_image_pixels=5000000", "data.skip_corrupt=true"), CPU
    )
    assert len(list(pipe.train_batches(info))) == info.steps
    assert [p for p, _ in pipe.skipped] == [str(bomb)]
    assert f"warning: skipping training file: image '{bomb}'" in capsys.readouterr().err
    pipe.close()
    bomb.unlink()

    odd = os.path.join(os.fsencode(root / "val" / wnid), b"caf\xe9.JPEG")
    shutil.copyfile(next((root / "val" / wnid).iterdir()), odd)
    pipe = input_from(tiny_config(root, tmp_path, "data.backend=dali"), CPU)
    with pytest.raises(DataError) as e:
        pipe.val_batches(cfg.phases[0])
    assert str(e.value) == (
        f"file name {odd!r} is not valid UTF-8 (DALI reads UTF-8 names only) (set data.skip_corrupt: true to skip "
        "such files)"
    )
    pipe.close()
    torch_pipe = input_from(tiny_config(root, tmp_path, "data.backend=torch"), CPU)  # PIL opens it
    assert sum(len(y) for _, y in torch_pipe.val_batches(cfg.phases[0])) == 21
