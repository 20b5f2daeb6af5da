#!/usr/bin/env python
"""Check a venv against the requirement files it was installed from: every requirement is installed (at its pin,
where the file pins one) and its module imports. `make install` writes its stamp only after this and `pip check`.

    .venv/bin/python scripts/check_install.py -r requirements.txt -r requirements-dev.txt

Exit 0 with one line when all is well, 1 with one line per missing or broken requirement, 2 with one line for a
requirement file that cannot be read as one (missing, not a regular file, too large, not UTF-8, an include cycle).
Standard library only:
it runs before anything it checks is known to work.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import re
import stat
import sys
from pathlib import Path

# The module a distribution is imported as, where its name does not say it (else the name with '-' as '_').
IMPORTS = {
    "pyyaml": "yaml",
    "pillow": "PIL",
    "pytest-xdist": "xdist",
    "nvidia-dali-cuda130": "nvidia.dali",
    "nvidia-dali-cuda120": "nvidia.dali",
}

_REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(==\s*([^\s;,#]+))?")


# A requirement file is a few KB; the cap keeps a wrong path (/dev/zero, a copy of a disk image) from filling memory.
MAX_BYTES = 1024 * 1024
MAX_DEPTH = 8  # `-r` includes inside includes: the repository's go one deep
_INCLUDE = re.compile(r"^(?:-r\s*|--requirement(?:\s*=\s*|\s+))(\S.*)$")


class RequirementsError(Exception):
    """A requirement file that cannot be read as one: one line naming it."""


def read_requirement_file(path: Path) -> str:
    """The text of the requirement file `path` by the rules of base/reader.py (this tool stays standard-library
    only): a regular file (a FIFO opens at once and is refused, never waited on), at most MAX_BYTES, UTF-8 with a
    byte-order mark dropped (it hid the first requirement)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise RequirementsError(f"requirement file '{path}' does not exist") from None
    except OSError as e:
        raise RequirementsError(f"requirement file '{path}' cannot be read: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RequirementsError(f"requirement file '{path}' is not a regular file (a directory, FIFO or device)")
        if st.st_size > MAX_BYTES:
            raise RequirementsError(
                f"requirement file '{path}' is {st.st_size:,} bytes: expected at most {MAX_BYTES:,}"
            )
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise RequirementsError(
            f"requirement file '{path}' is over {MAX_BYTES:,} bytes: expected at most {MAX_BYTES:,}"
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise RequirementsError(f"requirement file '{path}' is not UTF-8 text (byte {e.start})") from None


def requirements(files: list[Path], _within: tuple[Path, ...] = ()) -> list[tuple[str, str | None]]:
    """(name, exact pin or None) of every requirement line in `files`; `-r` includes are followed (a cycle or more
    than MAX_DEPTH levels is one line), options skipped."""
    out = []
    for f in files:
        key = Path(os.path.realpath(f))
        if key in _within:
            raise RequirementsError(f"requirement file '{f}' includes itself (through -r)")
        if len(_within) >= MAX_DEPTH:
            raise RequirementsError(f"requirement file '{f}': -r includes more than {MAX_DEPTH} deep")
        for line in read_requirement_file(f).splitlines():
            line = line.split("#", 1)[0].strip()
            if m := _INCLUDE.match(line):
                out += requirements([f.parent / m.group(1).strip()], (*_within, key))
            elif line and not line.startswith("-") and (m := _REQ.match(line)):
                out.append((m.group(1).lower().replace("_", "-"), m.group(3)))
    return out


def module_of(name: str) -> str:
    """The module that distribution `name` is imported as."""
    return IMPORTS.get(name, name.replace("-", "_").replace(".", "_"))


def problems(reqs: list[tuple[str, str | None]]) -> list[str]:
    """One line per requirement that is missing, at another version than its pin, or does not import."""
    out = []
    for name, pin in reqs:
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{name}: not installed")
            continue
        if pin is not None and have != pin:
            out.append(f"{name}: {have} installed, the requirements pin {pin}")
            continue
        try:
            importlib.import_module(module_of(name))
        except Exception as e:  # any failure to import is the finding, whatever its type
            out.append(f"{name}: import {module_of(name)} failed: {type(e).__name__}: {str(e).splitlines()[0]}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-r", dest="files", action="append", type=Path, required=True, help="a requirement file")
    args = ap.parse_args(argv)
    try:
        reqs = requirements(args.files)
    except RequirementsError as e:
        print(f"check_install: {e}", file=sys.stderr)
        return 2
    bad = problems(reqs)
    for line in bad:
        print(f"check_install: {line}", file=sys.stderr)
    if bad:
        return 1
    print(f"check_install: {len(reqs)} requirements installed and importable")
    return 0


if __name__ == "__main__":
    sys.exit(main())
