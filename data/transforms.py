"""Augmentation parameters and image ops for the PyTorch backend (PIL decode, torchvision resize)."""

from __future__ import annotations

import functools
import math
import struct

import numpy as np
import torch
import torchvision.transforms.functional as TF
from PIL import Image

from base.errors import DataError
from data.check import open_image, too_many_pixels

IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def load_rgb(path: str, max_pixels: int | None = None) -> Image.Image:
    """Decode any image PIL reads (CMYK and grayscale JPEG, PNG content named .JPEG) as RGB; an image with more
    than `max_pixels` pixels (data.max_image_pixels) is refused before it is decoded."""
    limit = Image.MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
    try:
        with open_image(path) as img:  # the size from the header, compared here (not PIL's bomb check)
            if img.width * img.height > limit:
                raise DataError(too_many_pixels(path, img.width, img.height, limit))
            img.load()
            return img.convert("RGB")
    except (OSError, ValueError, SyntaxError, struct.error, EOFError) as e:
        raise DataError(f"cannot decode image '{path}': {e}") from None


def random_resized_crop_params(
    rng: np.random.Generator, width: int, height: int, scale: tuple[float, float], ratio=(3 / 4, 4 / 3)
) -> tuple[int, int, int, int]:
    """(top, left, h, w) as torchvision's RandomResizedCrop draws them, from an explicit generator."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def crop_min_area(phase) -> float:
    """Lower bound of the random crop's area fraction: max(min_scale, min_object_area).

    TensorFlow's sample_distorted_bounding_box (the record's crop) rejects crops that cover less than
    min_object_covered of the object box; with no boxes the box is the whole image, so the crop covers at least
    min_object_area of the image, on top of area_range's lower bound min_scale. RandomResizedCrop and DALI's
    random_area take that one bound."""
    return max(phase.min_scale, phase.min_object_area)


def crop_and_flip(img: Image.Image, size: int, min_area: float, rng: np.random.Generator) -> Image.Image:
    top, left, h, w = random_resized_crop_params(rng, img.width, img.height, (min_area, 1.0))
    img = TF.resized_crop(img, top, left, h, w, [size, size], antialias=True)
    return TF.hflip(img) if rng.random() < 0.5 else img


def timm_augmentation(spec: str, size: int):
    """timm's PIL augmentation for `spec`: 'rand-...' (RandAugment) or 'augmix-...' (AugMix's mixing chains)."""
    from timm.data.auto_augment import augment_and_mix_transform, rand_augment_transform

    hparams = {"translate_const": int(size * 0.45), "img_mean": tuple(round(x) for x in IMAGENET_MEAN)}
    if spec.startswith("rand"):
        return rand_augment_transform(spec, hparams)
    if spec.startswith("augmix"):
        return augment_and_mix_transform(spec, hparams)
    raise DataError(f"data.auto_augment: expected a timm spec starting with 'rand' or 'augmix', got {spec!r}")


def seed_global_random(rng: np.random.Generator) -> None:
    """timm's augmentations draw from `random` and `np.random`: seed both from the sample's own generator."""
    import random

    seed = int(rng.integers(2**32))
    random.seed(seed)
    np.random.seed(seed)


def val_transform(img: Image.Image, size: int, crop_ratio: float) -> torch.Tensor:
    img = TF.resize(img, int(round(size / crop_ratio)), antialias=True)
    img = TF.center_crop(img, [size, size])
    return TF.pil_to_tensor(img)


def rect_transform(img: Image.Image, height: int, width: int) -> torch.Tensor:
    """Rectangular validation: the whole image resized to its batch's shape, no crop (data/rect.py)."""
    return TF.pil_to_tensor(TF.resize(img, [height, width], antialias=True))


@functools.cache
def _mean_std(device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The ImageNet mean and std on `device`, made once: on a GPU, torch.tensor from a list is a blocking copy."""
    mean = torch.tensor(IMAGENET_MEAN, device=device, dtype=dtype).view(1, 3, 1, 1)
    return mean, torch.tensor(IMAGENET_STD, device=device, dtype=dtype).view(1, 3, 1, 1)


def normalize(batch_u8: torch.Tensor, channels_last: bool, dtype=torch.float32) -> torch.Tensor:
    """uint8 NCHW batch -> normalized float on the batch's device."""
    mean, std = _mean_std(batch_u8.device, dtype)
    out = (batch_u8.to(dtype) - mean) / std
    return out.contiguous(memory_format=torch.channels_last) if channels_last else out
