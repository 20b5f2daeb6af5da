"""The run directory's side of the one writer (base/writer.py): stale temps, figures as bytes.

The writer itself (temp file and rename, no link followed, a regular file or nothing, strict JSON) is base/writer.py,
below data/ so that the data tools use it too; every run-directory file goes through it, and this module adds what only
a run directory needs. A writer killed between the temp file and the rename leaves `.<name>.tmp<pid>`:
`remove_stale_temps` deletes them when the next training takes the directory's lock. progress.json, a hint rewritten
at every log window, is written with durable=False (an fsync would stall the training loop for milliseconds).
"""

from __future__ import annotations

import re
from pathlib import Path

# `.<name>.tmp<pid>` (a file being written), `.<name>.link<pid>` (checkpoint.pt's new hard link), the write probe.
STALE_TEMP = re.compile(r"^\..+\.(tmp|link)\d+$|^\.write-probe-\d+$")


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


def figure_bytes(fig, **savefig) -> bytes:
    """A matplotlib figure rendered as PNG bytes (to go through write_output, never `savefig(path)` in place)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", **savefig)
    return buf.getvalue()
