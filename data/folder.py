"""Scanning a dataset in ImageNet folder layout (`<root>/<split>/<wnid>/*.JPEG`) with clear errors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from recipes.errors import DataError

IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png")

__all__ = ["IMAGE_EXTENSIONS", "DataError", "Split", "scan_split"]


@dataclass(frozen=True)
class Split:
    root: Path
    classes: list[str]  # sorted wnids; label = index
    files: list[str]  # absolute paths
    labels: list[int]

    def __len__(self) -> int:
        return len(self.files)


def _list(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError as e:  # PermissionError on an unreadable folder, EIO on a failing disk...
        raise DataError(f"cannot list '{folder}': {e.strerror or e}") from None


def scan_split(root: str | Path, split: str, classes: list[str] | None = None) -> Split:
    """List `<root>/<split>`; `classes` pins the label mapping (validation must reuse training's)."""
    base = Path(root)
    if not base.is_dir():
        raise DataError(f"dataset root '{base}' does not exist (set data.root or run `make sample`)")
    folder = base / split
    if not folder.is_dir():
        raise DataError(f"'{folder}' not found: expected '{split}/<class>/*.JPEG' under data.root '{base}'")
    found = sorted(d.name for d in _list(folder) if d.is_dir())
    if not found:
        raise DataError(f"'{folder}' has no class folders")
    if classes is None:
        classes = found
    else:
        unknown = sorted(set(found) - set(classes))
        if unknown:
            raise DataError(f"'{folder}' has class folders missing from train/: {', '.join(unknown[:5])}")
    index = {c: i for i, c in enumerate(classes)}
    files, labels = [], []
    for wnid in found:
        names = sorted(p for p in _list(folder / wnid) if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
        if not names:
            raise DataError(f"class folder '{folder / wnid}' is empty (no .JPEG/.jpg/.png files)")
        files.extend(str(p) for p in names)
        labels.extend([index[wnid]] * len(names))
    return Split(folder, list(classes), files, labels)
