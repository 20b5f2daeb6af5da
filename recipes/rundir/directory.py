"""The run directory: one run id per directory, one training at a time, another run's files never mixed in.

`<run_dir>/run.json` names the run (`run_id`, when and where it started); every checkpoint carries the same id,
and only checkpoints of the current run are candidates for resume. `<run_dir>/.lock` is held (`fcntl.flock`)
by the training that writes there (rank 0) and released by the kernel on any exit, so a second training into
the same directory fails at once, naming the holder's host and PID. `checkpoint.resume=false` on a directory
that holds another run moves that run's files to `<run_dir>/previous/<run id>/` (and says so): never deleted,
never resumed from again.

Hosts may each have their own run directory (local disks): every rank reports what its directory holds and
the ranks agree on one run id (`open_run`); no rank reads another host's disk. The lowest rank of each distinct
directory (its leader) writes the checkpoints there, so every host keeps a copy and a replaced host costs nothing.
"""

from __future__ import annotations

import datetime
import fcntl
import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from base import reader
from base.errors import CheckpointError, RunDirError
from base.writer import refuse_link, write_json
from recipes.distributed import DistInfo, all_gather_object, broadcast_object
from recipes.rundir import files
from recipes.rundir.checkpoint_files import check_writable, foreign_checkpoints
from recipes.rundir.writer import remove_stale_temps


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


class RunLock:
    """An exclusive advisory lock on `<run_dir>/.lock`; the file says who holds it (host, pid, since)."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / files.LOCK
        self.fd: int | None = None

    def acquire(self) -> None:
        refuse_link(self.path)
        if self.path.is_dir():
            raise RunDirError(
                f"'{self.path}' is a directory, not the run's lock file: remove it, or choose another run directory"
            )
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown holder"
            os.close(fd)
            raise RunDirError(
                f"run directory '{self.path.parent}' is in use by another training ({holder}); wait for it to "
                f"end, or give this one another run.name or --run-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"host {socket.gethostname()}, pid {os.getpid()}, since {_now()}\n".encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None


def read_run_id(run_dir: Path) -> str | None:
    """The run id in run.json (None: no run.json, or not one a run wrote); read through the one reader, so a FIFO or
    a device under that name is refused instead of waited on."""
    path = run_dir / files.RUN
    if not os.path.lexists(path):
        return None
    try:
        run_id = reader.read_json_object(path, what=files.RUN, error=RunDirError, max_bytes=64 << 10).get("run_id")
    except RunDirError:
        if path.is_symlink() or not path.is_file():
            raise
        if path.stat().st_size > 64 << 10:  # no run writes that: someone's file, never overwritten unasked
            raise RunDirError(
                f"'{path}' is {path.stat().st_size:,} bytes: a run's run.json is about 100; move it away or "
                "choose another run directory"
            ) from None
        return None  # a regular file that is not a run's run.json: the run writes its own over it
    return run_id if isinstance(run_id, str) and files.RUN_ID.match(run_id) else None  # it names previous/<id>/


def write_run_file(run_dir: Path, run_id: str) -> None:
    if read_run_id(run_dir) == run_id:
        return
    write_json(run_dir / files.RUN, {"run_id": run_id, "started": _now(), "host": socket.gethostname()})


# The run files a training reads back from its directory: each must be a regular file when it is there.
_REGULAR = (files.RUN, files.PROGRESS, files.CONFIG, files.META, files.SUMMARY)


def not_a_run(run_dir: Path) -> str | None:
    """Why `run_dir` must not be used as a run directory (None: it is new, empty, or a run's).

    A run directory is empty, or holds run.json, or holds only names a run makes; a home folder or a dataset (with
    `train/` and `val/`) is neither, and a training must not write there nor move its files to previous/.
    The path is judged as written, '..' taken lexically: `runs/..` is the folder above runs/ even while runs/ does
    not exist (the kernel would call it missing, and the launcher's logs would land in that folder).
    """
    run_dir = Path(os.path.abspath(run_dir))  # lexical: a link above it is resolved_elsewhere()'s to report
    if run_dir.is_symlink() or (run_dir.exists() and not run_dir.is_dir()):
        what = "a symbolic link" if run_dir.is_symlink() else "not a directory"
        return f"run directory '{run_dir}' is {what}; give run.out_dir/run.name or --run-dir a directory"
    if not run_dir.exists():
        return None
    try:
        entries = list(run_dir.iterdir())
    except OSError as e:
        return f"run directory '{run_dir}' cannot be listed: {e.strerror or e}"
    links = sorted(p for p in entries if p.is_symlink() and files.is_run_file(p.name))
    if links:  # planted where the run writes: refused before anything is written (the writers refuse it too)
        return f"'{links[0]}' is a symbolic link (to '{os.readlink(links[0])}'): a run writes only its own files; " + (
            "remove the link or choose another run directory"
        )
    odd = sorted(p for p in entries if p.name in _REGULAR and not p.is_file())
    if odd:  # a FIFO would hang the reader, a device or folder is no run's file
        return f"'{odd[0]}' is not a regular file (a FIFO, device, socket or folder): a run writes it as a file; " + (
            "remove it or choose another run directory"
        )
    run_json = run_dir / files.RUN
    if run_json.is_file():
        owner = run_json.stat().st_uid
        if owner != os.geteuid():
            return (
                f"run directory '{run_dir}' holds a run of another user (its {files.RUN} belongs to uid {owner}, "
                f"this training runs as uid {os.geteuid()}): a training continues only its own user's runs; choose "
                "another run directory"
            )
        return None
    foreign = sorted(p.name for p in entries if not files.is_run_file(p.name))
    if not foreign:
        # No run.json (a run writes it first): only what comes before it (the launcher's logs and probe, a
        # writer's dot files, previous/) or a checkpoint of a trainer older than run ids. A folder of the user's
        # own config.yaml or summary.json is not a run, and would be overwritten.
        if any(files.STEP_CHECKPOINT.match(p.name) or p.name == files.CHECKPOINT for p in entries):
            return None
        made = sorted(p.name for p in entries if p.name not in files.BEFORE_RUN and not p.name.startswith("."))
        if not made:
            return None
        return (
            f"run directory '{run_dir}' holds '{made[0]}' but no {files.RUN}: not a run's directory (a run writes "
            f"{files.RUN} first), and a training would overwrite it; choose an empty or new directory (--run-dir, "
            "or run.out_dir / run.name)"
        )
    shown = ", ".join(f"'{n}'" for n in foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
    return (
        f"run directory '{run_dir}' is neither empty nor a run (no {files.RUN}; it holds {shown}): nothing was "
        "written or moved; choose an empty or new directory (--run-dir, or run.out_dir / run.name)"
    )


def resolved_elsewhere(run_dir: Path) -> str | None:
    """One line when a symbolic link above `run_dir` sends the run's files somewhere else (None: it does not)."""
    given = Path(os.path.abspath(run_dir))
    real = Path(os.path.realpath(given))
    if real == given:
        return None
    return f"run directory '{run_dir}' is '{real}' (a symbolic link above it): the run's files are written there"


def run_files(run_dir: Path) -> list[Path]:
    """What a run leaves in its directory: not the archive, the launcher's logs, the lock or other dot files."""
    if not run_dir.is_dir():
        return []
    return sorted(
        p for p in run_dir.iterdir() if p.name not in (files.ARCHIVE, files.LAUNCH) and not p.name.startswith(".")
    )


def archive(run_dir: Path, run_id: str | None) -> Path:
    """Move the run's files to `<run_dir>/previous/<run id>[-N]/`; returns that directory."""
    base = run_dir / files.ARCHIVE / (run_id or "unnamed")
    dest, n = base, 1
    while dest.exists():
        dest, n = base.with_name(f"{base.name}-{n}"), n + 1
    dest.mkdir(parents=True)
    for p in run_files(run_dir):
        try:
            os.rename(p, dest / p.name)
        except FileNotFoundError:  # a shared directory: another host's rank moved it first
            pass
    return dest


def _share_groups(run_dir: Path, dist: DistInfo) -> int:
    """The lowest rank that sees this rank's run directory: ranks with the same answer share one directory.

    Every rank writes a token file into its run directory and looks for the others' tokens (as the launcher
    does between hosts): this holds for local disks, a shared filesystem, or a mix of both.
    """
    token = f".share-{uuid.uuid4().hex}"
    error = None
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / token).write_text(str(dist.rank))
    except OSError as e:
        error = f"run directory '{run_dir}' on host {socket.gethostname()} is not writable: {e.strerror or e}"
    tokens = all_gather_object((token, error), dist)
    errors = [e for _, e in tokens if e]
    if errors:
        (run_dir / token).unlink(missing_ok=True)
        raise RunDirError(errors[0])
    seen = min(r for r, (t, _) in enumerate(tokens) if (run_dir / t).is_file())
    all_gather_object(seen, dist)  # everyone has looked before anyone removes its token
    (run_dir / token).unlink(missing_ok=True)
    return seen


@dataclass
class RunDir:
    """This process's view of the run directory after `open_run`."""

    path: Path
    run_id: str
    lock: RunLock | None
    leader: bool  # the lowest rank of those that share this directory: it reads and writes its checkpoints
    legacy: bool  # no run.json anywhere: checkpoints written before run ids are the candidates
    notes: list[str] = field(default_factory=list)  # what a person should read in the log

    def close(self) -> None:
        if self.lock is not None:
            self.lock.release()


def _tidy(run_dir: Path, run_id: str | None, stays: bool) -> list[str]:
    """Remove the temp files an interrupted writer left; name the checkpoints of other runs (left alone)."""
    notes = []
    removed = remove_stale_temps(run_dir)
    if removed:
        notes.append(
            f"removed {len(removed)} temp file(s) an interrupted write left in {run_dir}: {', '.join(removed)}"
        )
    foreign = foreign_checkpoints(run_dir, run_id) if stays else []  # resume=false moves them all to previous/
    if foreign:
        names = ", ".join(p.name for p in foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        notes.append(
            f"{len(foreign)} checkpoint(s) in {run_dir} are not this run's ({names}): left in place, never resumed "
            "from or deleted"
        )
    return notes


def _raise_everywhere(message: str | None, dist: DistInfo) -> None:
    """Rank 0 decided; every rank raises the same error, so no rank waits on a collective that never comes."""
    message = broadcast_object(message, dist)
    if message:
        raise RunDirError(message)


def open_run(run_dir: Path, dist: DistInfo, resume) -> RunDir:
    """Lock the directory (rank 0), agree on the run id over the process group, archive for resume=false."""
    lock = None
    errors = [e for e in all_gather_object(not_a_run(run_dir), dist) if e]  # every rank looks before any writes
    if errors:
        raise RunDirError(errors[0])
    resolved = resolved_elsewhere(run_dir)
    error = None
    if dist.is_main:
        try:
            check_writable(run_dir, 0)
            lock = RunLock(run_dir)
            lock.acquire()
        except CheckpointError as e:
            error = str(e)
    try:
        _raise_everywhere(error, dist)
        host = socket.gethostname()
        mine = {
            "rank": dist.rank,
            "host": host,
            "key": _share_groups(run_dir, dist),
            "run_id": read_run_id(run_dir),
            "files": len(run_files(run_dir)),
        }
        reports = all_gather_object(mine, dist)
        leaders = {}
        for r in reports:
            leaders.setdefault(r["key"], r)
        leader = leaders[mine["key"]]["rank"] == dist.rank
        held = [r for r in leaders.values() if r["run_id"] or r["files"]]
        ids = sorted({r["run_id"] for r in held if r["run_id"]})
        notes = [resolved] if resolved and leader else []
        if leader:
            notes += _tidy(run_dir, mine["run_id"], resume is not False)
        if resume is False:
            if leader and (mine["run_id"] or mine["files"]):
                dest = archive(run_dir, mine["run_id"])
                notes.append(
                    f"checkpoint.resume=false: the files of the previous run "
                    f"{mine['run_id'] or '(no run id)'} in {run_dir} were moved to {dest}"
                )
            ids = []
        elif len(ids) > 1:
            where = "; ".join(f"{r['host']}: {r['run_id']}" for r in held if r["run_id"])
            raise RunDirError(  # every rank saw the same reports, so every rank raises here
                f"the run directories of the hosts hold different runs ({where}) in '{run_dir}': resuming "
                f"would mix them; give every host the same run's files, or start anew with checkpoint.resume=false "
                f"(which moves them to {run_dir / files.ARCHIVE})"
            )
        run_id = ids[0] if ids else broadcast_object(uuid.uuid4().hex[:16], dist)
        notes = [n for batch in all_gather_object(notes, dist) for n in batch]
        legacy = not ids and resume is not False
        return RunDir(run_dir, run_id, lock, leader, legacy, notes)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
