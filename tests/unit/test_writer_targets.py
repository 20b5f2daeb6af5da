"""An output is a regular file or nothing: the writer never renames its temp file over a device node, a FIFO, a socket
or a folder (as root, `--plot /dev/full` once turned /dev/full into a PNG)."""

from __future__ import annotations

import os
import socket
import stat

import pytest

from base.errors import RunDirError
from base.writer import check_target, write_atomic, write_output


def _plant(kind: str, path):
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        if os.geteuid() != 0:
            pytest.skip("mknod of a device node needs root")
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a /dev/null of our own
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    else:
        path.mkdir()


KINDS = {"fifo": "a FIFO", "device": "a device", "socket": "a socket", "folder": "a directory"}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_an_output_that_is_not_a_regular_file_is_refused_and_left_as_it_was(tmp_path, kind):
    target = tmp_path / "out.png"
    _plant(kind, target)
    before = target.lstat()
    for call in (lambda: check_target(target, "--plot"), lambda: write_output(target, b"png", "--plot")):
        with pytest.raises(RunDirError) as e:
            call()
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("--plot: ") and f"'{target}' is {KINDS[kind]}" in msg, msg
    after = target.lstat()
    assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.png"]  # no temp file left


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_run_file_that_is_not_regular_is_refused(tmp_path, kind):
    target = tmp_path / "progress.json"
    _plant(kind, target)
    with pytest.raises(RunDirError, match=f"is {KINDS[kind]}: expected a regular file"):
        write_atomic(target, "{}")
    assert not target.is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["progress.json"]


def test_a_regular_file_or_a_new_name_is_written(tmp_path):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text("before\n")
    write_output(old, "after\n", "--json")
    write_output(new, b"\x89PNG", "--png")
    assert old.read_text() == "after\n" and new.read_bytes() == b"\x89PNG"


def test_a_folder_that_refuses_the_write_is_one_line_saying_what_to_check():
    with pytest.raises(RunDirError) as e:
        write_output("/proc/dawnbench-out.json", "{}", "--json")  # /proc refuses new files, even to root
    msg = str(e.value)
    assert (
        "\n" not in msg
        and msg.startswith("--json: cannot write '/proc/dawnbench-out.json': ")
        and msg.endswith("; check the folder's permissions and free space")
    ), msg
