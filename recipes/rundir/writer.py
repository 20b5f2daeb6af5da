"""Every file a training writes into its run directory goes through here: no symlink followed, never half-written.

A file is written to a temp file in the same directory (opened with O_NOFOLLOW | O_EXCL, so a planted link is never
written through), fsynced and renamed over its name. progress.json, a hint rewritten at every log window, skips the
fsync, which would stall the training loop for milliseconds. A name that is a symbolic link is refused with one line
that names it (the rename would replace the link, but a planted link means someone else uses the directory). A writer
killed between the temp file and the rename leaves `.<name>.tmp<pid>`: `remove_stale_temps` deletes them when the
next training takes the directory's lock. JSON is strict: NaN and infinities are written as null, never as the
`NaN` that JSON readers refuse.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path

from recipes.errors import RunDirError

# `.<name>.tmp<pid>` (a file being written), `.<name>.link<pid>` (checkpoint.pt's new hard link), the write probe.
STALE_TEMP = re.compile(r"^\..+\.(tmp|link)\d+$|^\.write-probe-\d+$")


def temp_path(path: Path, kind: str = "tmp") -> Path:
    """The temp file `path` is written to before the rename (one per process)."""
    return path.with_name(f".{path.name}.{kind}{os.getpid()}")


def refuse_link(path: Path) -> None:
    """Raise RunDirError when `path` is a symbolic link (a planted file the run must not write through)."""
    if path.is_symlink():
        raise RunDirError(
            f"'{path}' is a symbolic link (to '{os.readlink(path)}'): a run writes only its own files; "
            "remove the link or choose another run directory"
        )


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def refuse_irregular(path: Path, what: str | None = None) -> None:
    """Raise RunDirError unless `path` is a regular file or nothing: the rename would replace a device node or a
    FIFO with our file (as root, /dev/null or /dev/full), and a link means someone else uses the name."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        if what is None:
            refuse_link(path)
        raise RunDirError(f"{what}: '{path}' is a symbolic link (to '{os.readlink(path)}'): give a path that is not")
    kind = _kind(mode)
    if kind is not None:
        prefix = f"{what}: " if what else ""
        raise RunDirError(f"{prefix}'{path}' is {kind}: expected a regular file or a new name")


def write_atomic(path: str | Path, data: bytes | str, *, durable: bool = True) -> None:
    """Write `data` as `path`: the old complete file or the new complete file, never a mix, never through a link,
    never over a device, FIFO or directory.

    durable=False skips the fsync: after a power loss the file may be the old one (the rename is still atomic)."""
    path = Path(path)
    refuse_irregular(path)
    if isinstance(data, str):
        data = data.encode()
    tmp = temp_path(path)
    tmp.unlink(missing_ok=True)  # our own leftover (same pid): never a file of someone else's
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def finite(value):
    """`value` with every non-finite float replaced by None (JSON has no NaN or infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def to_json(value, indent: int | None = 1) -> str:
    """Strict JSON text of `value` (non-finite floats as null)."""
    return json.dumps(finite(value), indent=indent, allow_nan=False) + "\n"


def write_json(path: str | Path, value, indent: int | None = 1, *, durable: bool = True) -> None:
    write_atomic(path, to_json(value, indent), durable=durable)


def remove_stale_temps(run_dir: Path) -> list[str]:
    """Delete the temp files an interrupted writer left in `run_dir` (call it holding the lock); 'name (size)' each."""
    removed = []
    if not run_dir.is_dir():
        return removed
    for p in sorted(run_dir.iterdir()):
        if STALE_TEMP.match(p.name) and (p.is_symlink() or p.is_file()):
            size = p.lstat().st_size
            p.unlink(missing_ok=True)
            removed.append(f"{p.name} ({size / 2**20:.1f} MiB)")
    return removed


def check_target(path: str | Path, what: str) -> Path:
    """Refuse, before any work, an output path a tool could not write safely: anything but a regular file or a new
    name (a link, a directory, a device, a FIFO), a folder that does not exist. One RunDirError line names `what`
    (the flag or file) and the path."""
    path = Path(path)
    refuse_irregular(path, what)
    if not path.parent.is_dir():
        raise RunDirError(f"{what}: the folder '{path.parent}' does not exist")
    return path


def write_output(path: str | Path, data: bytes | str, what: str) -> None:
    """A tool's output file (a prediction, a plot, a comparison): checked, written atomically, never through a
    link; a full disk or a read-only folder is one RunDirError line."""
    path = check_target(path, what)
    try:
        write_atomic(path, data)
    except OSError as e:
        raise RunDirError(f"{what}: cannot write '{path}': {e.strerror or e}") from None


def figure_bytes(fig, **savefig) -> bytes:
    """A matplotlib figure rendered as PNG bytes (to go through write_output, never `savefig(path)` in place)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", **savefig)
    return buf.getvalue()
