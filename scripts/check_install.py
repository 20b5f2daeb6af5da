#!/usr/bin/env python
"""Check a venv against the requirement files it was installed from: every requirement is installed (at its pin,
where the file pins one) and its module imports. `make install` writes its stamp only after this and `pip check`.

    .venv/bin/python scripts/check_install.py -r requirements.txt -r requirements-dev.txt

Exit 0 with one line when all is well, 1 with one line per missing or broken requirement. Standard library only:
it runs before anything it checks is known to work.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import re
import sys
from pathlib import Path

# The module a distribution is imported as, where its name does not say it (else the name with '-' as '_').
IMPORTS = {
    "pyyaml": "yaml",
    "pillow": "PIL",
    "nvidia-dali-cuda130": "nvidia.dali",
    "nvidia-dali-cuda120": "nvidia.dali",
}

_REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(==\s*([^\s;,#]+))?")


def requirements(files: list[Path]) -> list[tuple[str, str | None]]:
    """(name, exact pin or None) of every requirement line in `files`; `-r` includes are followed, options skipped."""
    out = []
    for f in files:
        for line in f.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith(("-r ", "--requirement ")):
                out += requirements([f.parent / line.split(None, 1)[1]])
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
    reqs = requirements(args.files)
    bad = problems(reqs)
    for line in bad:
        print(f"check_install: {line}", file=sys.stderr)
    if bad:
        return 1
    print(f"check_install: {len(reqs)} requirements installed and importable")
    return 0


if __name__ == "__main__":
    sys.exit(main())
