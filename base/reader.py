"""Every JSON or text file the project reads from a user goes through here: regular files only, a size cap, strict
UTF-8 and strict JSON, the expected shape.

A path that names a FIFO, a device (`/dev/zero`), a directory or a file larger than the cap is refused before a byte is
read, so a wrong path cannot hang the reader or exhaust memory. JSON is strict: `NaN`, `Infinity` and numbers that
overflow a float (`1e999`) are refused, where Python's json module would return them as non-finite floats. Each error
is one line that names the file and what was expected; the caller chooses the error class (ConfigError for a
network or GPU-profile file, CheckpointError for a sidecar, ...).
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

# Large enough for any file the project reads as text (a tuner cache, a network probe, a summary, the devkit's
# 50,000-line ground truth); small enough that a wrong path cannot fill memory.
MAX_BYTES = 16 * 1024 * 1024


def read_bytes(
    path: str | Path,
    *,
    what: str,
    error: type[Exception] = ValueError,
    max_bytes: int = MAX_BYTES,
    head: int | None = None,
) -> bytes:
    """The bytes of the regular file `path` (at most `max_bytes`); `what` names the file in errors. `head`: only
    its first `head` bytes, whatever its size."""
    p = Path(path)
    try:
        # O_NONBLOCK: a FIFO opens at once instead of waiting for a writer (it is then refused as not regular).
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise error(f"{what} '{p}' does not exist") from None
    except OSError as e:
        raise error(f"{what} '{p}' cannot be read: {e.strerror}") from None
    try:
        st = os.fstat(fd)  # before fdopen, which refuses a directory with its own error
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, device or socket)"
            raise error(f"{what} '{p}' is {kind}: expected a regular file")
        if head is None and st.st_size > max_bytes:
            raise error(f"{what} '{p}' is {st.st_size:,} bytes: expected at most {max_bytes:,}")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(max_bytes + 1 if head is None else head)
    finally:
        os.close(fd)
    if head is None and len(data) > max_bytes:  # grew while being read
        raise error(f"{what} '{p}' is over {max_bytes:,} bytes: expected at most {max_bytes:,}")
    return data


def read_text(path: str | Path, *, what: str, error: type[Exception] = ValueError, max_bytes: int = MAX_BYTES) -> str:
    """The UTF-8 text of the regular file `path`."""
    data = read_bytes(path, what=what, error=error, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        # the offset only: the file may be anything readable, and an error never shows what it holds
        raise error(f"{what} '{path}' is not UTF-8 text (byte {e.start})") from None


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} overflows a float")
    return value


def parse_json(text: str, *, what: str, error: type[Exception] = ValueError):
    """Strict JSON: no NaN, no Infinity, no number that overflows a float."""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError as e:
        raise error(f"{what} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    except RecursionError:
        # json's decoder recurses once per bracket: a few thousand nested ones exhaust Python's stack
        raise error(f"{what} is nested too deeply: expected the file's own shape") from None
    except ValueError as e:
        raise error(f"{what} is not strict JSON: {e}") from None


def read_json(path: str | Path, *, what: str, error: type[Exception] = ValueError, max_bytes: int = MAX_BYTES):
    """The strict JSON value in the regular file `path`."""
    text = read_text(path, what=what, error=error, max_bytes=max_bytes)
    return parse_json(text, what=f"{what} '{path}'", error=error)


def read_json_object(
    path: str | Path, *, what: str, error: type[Exception] = ValueError, max_bytes: int = MAX_BYTES
) -> dict:
    """The strict JSON object (a mapping) in the regular file `path`."""
    value = read_json(path, what=what, error=error, max_bytes=max_bytes)
    if not isinstance(value, dict):
        raise error(f"{what} '{path}' holds a JSON {type(value).__name__}: expected an object ({{...}})")
    return value
