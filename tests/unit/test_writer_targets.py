"""An output is a regular file or nothing: the writer never renames its temp file over a device node, a FIFO, a socket
or a folder (as root, `--plot /dev/full` once turned /dev/full into a PNG)."""

from __future__ import annotations

import os
import socket
import stat

import pytest

from base import writer
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


def test_a_folder_swapped_for_a_link_mid_write_cannot_redirect_the_output(tmp_path, monkeypatch):
    """The folder is opened once: swapping it for a link to another folder between the checks and the rename (a
    race a planted process can win) leaves the other folder untouched, with no output and no stray temp file."""
    run, other = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    other.mkdir()

    def swap(folder_fd, name):
        run.rename(tmp_path / "run.moved")
        run.symlink_to(other)

    monkeypatch.setattr(writer, "_before_rename", swap)
    write_atomic(run / "summary.json", "{}\n")
    assert list(other.iterdir()) == []
    assert [p.name for p in (tmp_path / "run.moved").iterdir()] == ["summary.json"]
    assert (tmp_path / "run.moved" / "summary.json").read_text() == "{}\n"


def test_a_link_planted_at_the_name_mid_write_is_refused_and_nothing_is_left(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    monkeypatch.setattr(writer, "_before_rename", lambda fd, name: target.symlink_to("/etc/passwd"))
    with pytest.raises(RunDirError) as e:
        write_atomic(target, "{}\n")
    assert str(e.value).startswith(f"'{target}' is a symbolic link (to '/etc/passwd'): a run writes only its own")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"] and target.is_symlink()


def test_a_link_that_vanishes_between_lstat_and_readlink_is_still_one_line(tmp_path, monkeypatch):
    """The readlink after lstat races whoever planted the link: it was a FileNotFoundError traceback."""
    target = tmp_path / "out.png"
    target.symlink_to(tmp_path / "x")

    def gone(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(writer.os, "readlink", gone)
    for call in (lambda: check_target(target, "--plot"), lambda: write_atomic(target, b"png")):
        with pytest.raises(RunDirError) as e:
            call()
        assert "is a symbolic link (to '?, changed while being checked')" in str(e.value)


def test_a_missing_output_folder_is_refused_before_any_work(tmp_path):
    target = tmp_path / "no" / "such" / "out.json"
    with pytest.raises(RunDirError) as e:
        check_target(target, "--out")
    assert str(e.value) == f"--out: the folder '{tmp_path / 'no' / 'such'}' does not exist"
    with pytest.raises(RunDirError) as e:
        write_output(target, "{}", "--out")
    assert str(e.value) == f"--out: the folder '{tmp_path / 'no' / 'such'}' does not exist"
