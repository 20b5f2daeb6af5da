"""What an image file really holds: an RGB JPEG, something a loader must convert, or something undecodable.

ImageNet has CMYK JPEGs, grayscale JPEGs and a PNG named .JPEG (all valid: every backend converts them to RGB);
copies on a shared disk also get truncated or emptied. `inspect_file` says which, `quick_problem` finds the
undecodable ones from a few bytes at each end (used to name the culprit when a DALI batch fails to decode).
`check_headers` finds, from names, the first and last bytes and image headers only, the files DALI must not be
handed: names that are not UTF-8, files that are not an image DALI decodes (empty, truncated, text, GIF) and images
above data.max_image_pixels (the DALI backend runs it once per split, training and validation alike;
`too_many_pixels` is the message every backend gives for such an image).

`open_image` reads an image's header without PIL's own decompression-bomb check, so that every size guard compares
the header's width x height with data.max_image_pixels itself: PIL raises DecompressionBombError only above twice
its own limit (and merely warns below), and a guard must never depend on an exception that means "too big".
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

# Kinds that decode (possibly after a conversion to RGB) and kinds that do not.
OK = "rgb-jpeg"
UNDECODABLE = ("empty", "truncated", "corrupt", "not-an-image", "too-large")
# What DALI's image decoders read (fn.decoders.image: JPEG, JPEG 2000, PNG, BMP, TIFF, PNM, WebP); a GIF, or text,
# named .JPEG makes them fail, and in validation (fn.peek_image_shape) crash the process.
DALI_FORMATS = ("JPEG", "PNG", "BMP", "TIFF", "WEBP")

_MAGIC = [
    (b"\xff\xd8\xff", "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
]


@dataclass(frozen=True)
class FileReport:
    path: str
    kind: str  # OK, "cmyk-jpeg", "grayscale-jpeg", "png", "gif", ..., or one of UNDECODABLE
    detail: str
    fmt: str | None = None  # the format its first bytes name ("JPEG", "GIF", ...); None when they name none

    @property
    def decodable(self) -> bool:
        return self.kind not in UNDECODABLE

    @property
    def dali_reads(self) -> bool:
        """Whether data.backend=dali's header scan hands this file to its decoders (a decodable format they read)."""
        return self.decodable and self.fmt in DALI_FORMATS


def sniff_format(head: bytes) -> str | None:
    """Image format from the first bytes of a file (None: not an image format we know)."""
    for magic, fmt in _MAGIC:
        if head.startswith(magic):
            return fmt
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    return None


# Exceptions a PIL format plugin raises for a header it does not understand (what Image.open catches too).
_NOT_THIS_FORMAT = (SyntaxError, IndexError, TypeError, ValueError, struct.error, EOFError, OSError)


@contextmanager
def open_image(path: str) -> Iterator[Image.Image]:
    """`path` as a lazily opened PIL image (header read, nothing decoded), without PIL's decompression-bomb check:
    the caller compares `.size` with its limit before `.load()`. Raises UnidentifiedImageError (an OSError) for
    a file no PIL plugin reads, OSError when it cannot be read."""
    Image.init()
    with open(path, "rb") as fp:
        prefix = fp.read(16)
        img = None
        for fmt in Image.ID:
            factory, accept = Image.OPEN[fmt]
            try:
                verdict = accept(prefix) if accept is not None else True
                if not verdict or isinstance(verdict, str):
                    continue
                fp.seek(0)
                img = factory(fp, path)
            except _NOT_THIS_FORMAT:
                continue
            break
        if img is None:
            raise UnidentifiedImageError(f"cannot identify image file '{path}'")
        try:
            yield img
        finally:
            img.close()


def header_size(path: str) -> tuple[int, int]:
    """(width, height) from the image header alone, however large (see open_image)."""
    with open_image(path) as img:
        return img.size


def quick_problem(path: str) -> str | None:
    """Why `path` cannot decode, judged from its size and first/last bytes; None when it looks whole.

    Cheap enough to run over a whole shard: an empty file, unknown content, a JPEG without its end-of-image
    marker or a PNG without its IEND chunk (both: a truncated copy).
    """
    try:
        size = os.path.getsize(path)
        if size == 0:
            return "empty file (0 bytes)"
        with open(path, "rb") as f:
            head = f.read(16)
            f.seek(max(0, size - 12))
            tail = f.read(12)
    except OSError as e:
        return f"cannot read: {e.strerror or e}"
    fmt = sniff_format(head)
    if fmt is None:
        return f"not an image (starts with {head[:8]!r})"
    if fmt == "JPEG" and not tail.rstrip(b"\x00").endswith(b"\xff\xd9"):
        return f"truncated JPEG (no end-of-image marker; {size} bytes)"
    if fmt == "PNG" and b"IEND" not in tail:
        return f"truncated PNG (no IEND chunk; {size} bytes)"
    return None


def inspect_file(path: str, max_pixels: int = Image.MAX_IMAGE_PIXELS) -> FileReport:
    """Decode `path` fully and say what it is (kind and a human-readable detail); an image above `max_pixels`
    (default: PIL's limit, data.max_image_pixels' default) is reported as "too-large" without being decoded."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as e:
        return FileReport(path, "corrupt", f"cannot read: {e.strerror or e}")
    if size == 0:
        return FileReport(path, "empty", "empty file (0 bytes)")
    fmt = sniff_format(head)
    if fmt is None:
        return FileReport(path, "not-an-image", f"unknown content (starts with {head[:8]!r}, {size} bytes)")
    try:
        with open_image(path) as img:
            mode, (w, h) = img.mode, img.size
            if w * h > max_pixels:
                return FileReport(path, "too-large", too_many_pixels(path, w, h, max_pixels))
            img.load()
    except OSError as e:
        msg = str(e)
        kind = "truncated" if "truncated" in msg or "broken data stream" in msg else "corrupt"
        return FileReport(path, kind, f"{fmt}: {msg}", fmt)
    except (ValueError, SyntaxError, struct.error, EOFError) as e:
        return FileReport(path, "corrupt", f"{fmt}: {e}", fmt)
    named = os.path.splitext(path)[1].lstrip(".")
    if fmt == "JPEG":
        if mode == "RGB":
            return FileReport(path, OK, f"JPEG RGB {w}x{h}", fmt)
        kind = {"CMYK": "cmyk-jpeg", "L": "grayscale-jpeg"}.get(mode, f"{mode.lower()}-jpeg")
        return FileReport(path, kind, f"JPEG {mode} {w}x{h} (converted to RGB when loaded)", fmt)
    where = f" in a .{named} file" if named.lower() in ("jpeg", "jpg") else ""
    if fmt not in DALI_FORMATS:
        return FileReport(path, fmt.lower(), f"{fmt} {mode} {w}x{h}{where}: data.backend=dali {not_for_dali(fmt)}", fmt)
    return FileReport(path, fmt.lower(), f"{fmt} {mode} {w}x{h}{where} (converted to RGB when loaded)", fmt)


def not_for_dali(fmt: str) -> str:
    """Why the DALI backend refuses an image of format `fmt` (what its header scan and --check both say)."""
    return f"refuses a {fmt} image, which DALI does not read (data.backend=torch reads it)"


def too_many_pixels(path: str, width: int, height: int, limit: int) -> str:
    return (
        f"image '{path}' has {width}x{height} = {width * height:,} pixels, above data.max_image_pixels "
        f"({limit:,}): refused before decoding (a decompression bomb, or raise the limit)"
    )


def _header_problem(path: str, limit: int) -> str | None:
    """Why DALI must not be handed `path`, from its name, first and last bytes and image header (nothing decoded)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return f"file name {path.encode('utf-8', 'surrogateescape')!r} is not valid UTF-8 (DALI reads UTF-8 names only)"
    problem = quick_problem(path)
    if problem:
        return f"cannot decode '{path}': {problem}"
    try:
        with open_image(path) as img:
            fmt, (w, h) = img.format, img.size
    except OSError as e:
        return f"cannot decode '{path}': not a readable image ({e.strerror or type(e).__name__})"
    if fmt not in DALI_FORMATS:
        return f"cannot decode '{path}': data.backend=dali {not_for_dali(fmt)}"
    return too_many_pixels(path, w, h, limit) if w * h > limit else None


def check_headers(files: list[str], limit: int, threads: int, rank: int, world: int) -> list[tuple[str, str]]:
    """(file, why) for the files of this rank's share (every world-th) that DALI must not be handed: names that are
    not UTF-8, files that are not an image DALI decodes (empty, truncated, unknown content, GIF), and images above
    `limit` pixels, which nvJPEG/libjpeg would decode in full (a decompression bomb)."""
    mine = files[rank::world]
    with ThreadPoolExecutor(max(1, threads)) as pool:
        problems = list(pool.map(lambda f: _header_problem(f, limit), mine, chunksize=256))
    return [(f, why) for f, why in zip(mine, problems, strict=True) if why]


def _gather_problems(bad: list[tuple[str, str]], dist) -> list[tuple[str, str]]:
    """Every rank's findings, so that all ranks stop together instead of the others waiting in a collective."""
    import torch.distributed as td

    if not (dist.enabled and td.is_initialized()):
        return bad
    parts: list = [None] * dist.world_size
    td.all_gather_object(parts, bad)
    return [item for part in parts for item in part]
