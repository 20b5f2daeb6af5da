"""Write a small, deterministic, learnable dataset in the ImageNet folder layout.

    python data/make_sample.py --out data/sample [--classes 10 --train-per-class 80 --val-per-class 20] [--odd]

Each class is a texture (stripes, checks, rings, ...) drawn in a class-specific hue band over noise, at
random sizes (150-500 px a side) and aspect ratios, so random crops and resizes are exercised for real.
`--odd` adds the oddities real ImageNet has: a CMYK JPEG, a grayscale JPEG and a PNG file named .JPEG.
The same arguments always give byte-identical files.
"""

from __future__ import annotations

import argparse
import colorsys
import sys
from pathlib import Path

import numpy as np
from PIL import Image

# Run as a file (`python data/make_sample.py`, as the Makefile does), Python puts data/ on the path, not the
# repository: the imports below are the repository's packages.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from base.errors import DataError  # noqa: E402
from base.writer import encoded, to_json, write_output  # noqa: E402

# The first ImageNet synsets, so folder names look like the real thing.
WNIDS = [
    "n01440764",
    "n01443537",
    "n01484850",
    "n01491361",
    "n01494475",
    "n01496331",
    "n01498041",
    "n01514668",
    "n01514859",
    "n01518878",
    "n01530575",
    "n01531178",
    "n01532829",
    "n01534433",
    "n01537544",
    "n01558993",
    "n01560419",
    "n01580077",
    "n01582220",
    "n01592084",
]
PATTERNS = ["hstripes", "vstripes", "diagonal", "checks", "rings", "dots", "disc", "frame", "cross", "blob"]


def _pattern(kind: str, h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """A float mask in [0, 1] of shape (h, w)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    period = rng.uniform(0.08, 0.16) * min(h, w)
    cy, cx = rng.uniform(0.35, 0.65) * h, rng.uniform(0.35, 0.65) * w
    r = np.hypot(y - cy, x - cx)
    if kind == "hstripes":
        m = np.sin(2 * np.pi * y / period) > 0
    elif kind == "vstripes":
        m = np.sin(2 * np.pi * x / period) > 0
    elif kind == "diagonal":
        m = np.sin(2 * np.pi * (x + y) / (period * 1.4)) > 0
    elif kind == "checks":
        m = (np.floor(x / period) + np.floor(y / period)) % 2 == 0
    elif kind == "rings":
        m = np.sin(2 * np.pi * r / period) > 0
    elif kind == "dots":
        m = np.hypot((x % period) - period / 2, (y % period) - period / 2) < period * 0.3
    elif kind == "disc":
        m = r < rng.uniform(0.3, 0.45) * min(h, w)
    elif kind == "frame":
        d = np.maximum(np.abs(y - cy) / h, np.abs(x - cx) / w)
        m = (d > 0.22) & (d < 0.34)
    elif kind == "cross":
        t = rng.uniform(0.08, 0.14)
        m = (np.abs(y - cy) < t * h) | (np.abs(x - cx) < t * w)
    else:  # blob: smooth radial gradient
        return np.clip(1.0 - r / (0.6 * min(h, w)), 0.0, 1.0)
    return m.astype(np.float32)


def make_image(label: int, num_classes: int, rng: np.random.Generator) -> Image.Image:
    w, h = (int(v) for v in rng.integers(150, 501, size=2))
    kind = PATTERNS[label % len(PATTERNS)]
    # Hue band per class (classes beyond 10 reuse a texture with another hue).
    hue = (label / num_classes + rng.uniform(-0.25, 0.25) / num_classes) % 1.0
    fg = np.array(colorsys.hsv_to_rgb(hue, rng.uniform(0.6, 1.0), rng.uniform(0.7, 1.0)), dtype=np.float32)
    bg = np.array(
        colorsys.hsv_to_rgb((hue + 0.5) % 1.0, rng.uniform(0.2, 0.5), rng.uniform(0.2, 0.5)), dtype=np.float32
    )
    m = _pattern(kind, h, w, rng)[..., None]
    img = m * fg + (1 - m) * bg
    img += rng.normal(0.0, 0.06, size=img.shape).astype(np.float32)
    return Image.fromarray((np.clip(img, 0, 1) * 255).astype(np.uint8), "RGB")


def write_split(out: Path, split: str, classes: int, per_class: int, seed: int) -> int:
    n = 0
    for c in range(classes):
        folder = out / split / WNIDS[c]
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            rng = np.random.default_rng([seed, 0 if split == "train" else 1, c, i])
            image = encoded(make_image(c, classes, rng), format="JPEG", quality=90)
            # a sample is remade from its seed: no fsync per image
            write_output(folder / f"{WNIDS[c]}_{i:05d}.JPEG", image, "make_sample.py --out", DataError, durable=False)
            n += 1
    return n


def write_odd_files(out: Path, classes: int, seed: int) -> list[str]:
    """A CMYK JPEG, a grayscale JPEG and a PNG named .JPEG, each a valid member of its class."""
    rng = np.random.default_rng([seed, 2])
    written = []
    for c, (mode, fmt, tag) in enumerate([("CMYK", "JPEG", "cmyk"), ("L", "JPEG", "gray"), ("RGB", "PNG", "png")]):
        label = c % classes
        path = out / "train" / WNIDS[label] / f"{WNIDS[label]}_odd_{tag}.JPEG"
        image = encoded(make_image(label, classes, rng).convert(mode), format=fmt)
        write_output(path, image, "make_sample.py --out", DataError, durable=False)
        written.append(str(path.relative_to(out)))
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="data/sample", help="output folder (train/ and val/ are created)")
    ap.add_argument("--classes", type=int, default=10, help=f"number of classes (at most {len(WNIDS)})")
    ap.add_argument("--train-per-class", type=int, default=80)
    ap.add_argument("--val-per-class", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--odd", action="store_true", help="add a CMYK JPEG, a grayscale JPEG, a PNG named .JPEG")
    args = ap.parse_args(argv)
    if not 2 <= args.classes <= len(WNIDS):
        ap.error(f"--classes: expected 2..{len(WNIDS)}, got {args.classes}")
    if args.train_per_class < 1 or args.val_per_class < 1:
        ap.error("--train-per-class and --val-per-class must be >= 1")
    out = Path(args.out)
    n_train = write_split(out, "train", args.classes, args.train_per_class, args.seed)
    n_val = write_split(out, "val", args.classes, args.val_per_class, args.seed)
    odd = write_odd_files(out, args.classes, args.seed) if args.odd else []
    info = {
        "classes": WNIDS[: args.classes],
        "train": n_train + len(odd),
        "val": n_val,
        "odd_files": odd,
        "seed": args.seed,
    }
    write_output(out / "sample.json", to_json(info), "sample.json", DataError)
    print(f"wrote {n_train + len(odd)} train and {n_val} val images in {args.classes} classes to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
