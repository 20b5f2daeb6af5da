"""Every file the project writes goes through here: a regular file or a new name only, no link followed, never
half-written; images go through `copy_image` / `write_image` of the data tools, which use `open_new` below.

A file is written to a temp file in the same directory (opened with O_NOFOLLOW | O_EXCL, so a planted link is never
written through), fsynced and renamed over its name. A name that is a symbolic link is refused with one line that
names it (the rename would replace the link, but a planted link means someone else uses the name); so is a name that
is a directory, a FIFO, a socket or a device node (as root the rename would replace /dev/null). JSON is strict: NaN
and infinities are written as null, never as the `NaN` that JSON readers refuse. The caller chooses the error class
(RunDirError for a run's files and a tool's outputs, DataError for the data tools' control files), as with
base/reader.py.
"""

from __future__ import annotations

import io
import json
import math
import os
import stat
from pathlib import Path
from typing import IO

from base.errors import RunDirError


def temp_path(path: Path, kind: str = "tmp") -> Path:
    """The temp file `path` is written to before the rename (one per process)."""
    return path.with_name(f".{path.name}.{kind}{os.getpid()}")


def refuse_link(path: Path, error: type[Exception] = RunDirError) -> None:
    """Raise `error` when `path` is a symbolic link (a planted file the run must not write through)."""
    if path.is_symlink():
        raise error(
            f"'{path}' is a symbolic link (to '{_link_target(path)}'): a run writes only its own files; "
            "remove the link or choose another run directory"
        )


def _link_target(path: Path | str, dir_fd: int | None = None) -> str:
    """Where the link `path` points, for an error line; a link removed or replaced since it was seen (a race with
    whoever planted it) must still give that line, never a FileNotFoundError traceback."""
    try:
        return os.readlink(path, dir_fd=dir_fd)
    except OSError:
        return "?, changed while being checked"


def _kind(mode: int) -> str | None:
    """What a file that is not regular is, in words; None for a regular file."""
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


def refuse_irregular(path: Path, what: str | None = None, error: type[Exception] = RunDirError) -> None:
    """Raise `error` unless `path` is a regular file or nothing (`what`: the flag or file, named first)."""
    try:
        mode = path.lstat().st_mode
    except (FileNotFoundError, NotADirectoryError):  # nothing there (a missing folder is the caller's to report)
        return
    except OSError as e:
        raise error(f"{what + ': ' if what else ''}cannot write '{path}': {e.strerror or e}") from None
    if stat.S_ISLNK(mode):
        if what is None:
            refuse_link(path, error)
        raise error(f"{what}: '{path}' is a symbolic link (to '{_link_target(path)}'): give a path that is not")
    kind = _kind(mode)
    if kind is not None:
        raise error(f"{what + ': ' if what else ''}'{path}' is {kind}: expected a regular file or a new name")


def _before_rename(folder_fd: int, name: str) -> None:
    """Called between the checks and the rename (tests swap the folder here to prove the rename cannot follow)."""


def write_atomic(
    path: str | Path, data: bytes | str, *, durable: bool = True, error: type[Exception] = RunDirError
) -> None:
    """Write `data` as `path`: the old complete file or the new complete file, never a mix, never through a link,
    never over a device, FIFO or directory.

    The folder is resolved once and opened; the temp file, the check of the name, the rename and the fsync all work
    relative to that open folder, so a folder swapped for a link while the file is written cannot send the output
    (or a stray temp file) anywhere else. durable=False skips the fsyncs: after a power loss the file may be the old
    one (the rename is still atomic)."""
    path = Path(path)
    refuse_irregular(path, error=error)
    if isinstance(data, str):
        data = data.encode()
    name, tmp = path.name, temp_path(path).name
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            os.unlink(tmp, dir_fd=folder)  # our own leftover (same pid): never a file of someone else's
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                if durable:
                    os.fsync(f.fileno())
            _before_rename(folder, name)
            _refuse_irregular_at(folder, name, path, error)  # planted in the folder since the first check
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
            if durable:
                os.fsync(folder)  # the rename itself survives a power loss
        finally:
            try:
                os.unlink(tmp, dir_fd=folder)
            except FileNotFoundError:
                pass
    finally:
        os.close(folder)


def _refuse_irregular_at(folder: int, name: str, path: Path, error: type[Exception]) -> None:
    """refuse_irregular for `name` inside the open folder `folder` (`path`: how errors name it)."""
    try:
        mode = os.lstat(name, dir_fd=folder).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise error(
            f"'{path}' is a symbolic link (to '{_link_target(name, folder)}'): a run writes only its own files; "
            "remove the link or choose another run directory"
        )
    kind = _kind(mode)
    if kind is not None:
        raise error(f"'{path}' is {kind}: expected a regular file or a new name")


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


def write_json(
    path: str | Path, value, indent: int | None = 1, *, durable: bool = True, error: type[Exception] = RunDirError
) -> None:
    write_atomic(path, to_json(value, indent), durable=durable, error=error)


def check_target(path: str | Path, what: str, error: type[Exception] = RunDirError) -> Path:
    """Refuse, before any work, an output path a tool could not write safely: anything but a regular file or a new
    name (a link, a directory, a device, a FIFO), a folder that does not exist. One line names `what` (the flag or
    file) and the path."""
    path = Path(path)
    refuse_irregular(path, what, error)
    if not path.parent.is_dir():
        raise error(f"{what}: the folder '{path.parent}' does not exist")
    return path


def write_output(
    path: str | Path, data: bytes | str, what: str, error: type[Exception] = RunDirError, *, durable: bool = True
) -> None:
    """A tool's output file (a prediction, a plot, a comparison, a data tool's control file, a generated image):
    checked, written atomically, never through a link; a full disk or a read-only folder is one line."""
    path = check_target(path, what, error)
    try:
        write_atomic(path, data, durable=durable, error=error)
    except OSError as e:
        why = e.strerror or e
        raise error(f"{what}: cannot write '{path}': {why}; check the folder's permissions and free space") from None


def encoded(image, **save_args) -> bytes:
    """A PIL image's file bytes, encoded in memory (`save_args`: PIL's, `format=` included), so that an image is
    written through write_output like any other file and PIL never opens a path itself."""
    buf = io.BytesIO()
    image.save(buf, **save_args)
    return buf.getvalue()


def open_new(path: str | Path, what: str, error: type[Exception] = RunDirError) -> IO[bytes]:
    """`path` opened for writing as a new file (O_EXCL | O_NOFOLLOW: never an existing file, link, device or FIFO),
    for the data tools' temp files that are streamed rather than held in memory; the caller renames it."""
    try:
        return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "wb")
    except OSError as e:
        raise error(f"{what}: cannot create '{path}': {e.strerror or e}") from None


def open_append(path: str | Path, what: str, error: type[Exception] = RunDirError) -> IO[str]:
    """The log file `path` opened to append text: a regular file or a new one, never through a link."""
    path = Path(path)
    refuse_irregular(path, what, error)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as e:
        raise error(f"{what}: cannot write '{path}': {e.strerror or e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped in after the check above
        os.close(fd)
        raise error(f"{what}: '{path}' is not a regular file")
    return os.fdopen(fd, "a", encoding="utf-8")
