"""data/folder.py's distinct-image count walks only the loader's layout: links to parent folders cannot loop."""

from __future__ import annotations

from data.folder import distinct_files


def test_links_to_parent_folders_do_not_make_the_count_endless(tmp_path):
    """Two symlinks to `..` in val/ made the count (run at the end of every run) walk forever."""
    val = tmp_path / "val"
    (val / "n01").mkdir(parents=True)
    (val / "n01" / "a.JPEG").write_bytes(b"jpeg-a")
    (val / "n01" / "b.JPEG").write_bytes(b"jpeg-b")
    (val / "n01" / "up").symlink_to("..")
    (val / "n01" / "up2").symlink_to("../..")
    (val / "loop").symlink_to(".")
    (val / "n02").symlink_to(val / "n01")  # a linked class folder is read, as the loader reads it
    (val / "n03").mkdir()
    (val / "n03" / "c.JPEG").write_bytes(b"jpeg-c")
    (val / "n03" / "deeper").mkdir()
    (val / "n03" / "deeper" / "d.JPEG").write_bytes(b"jpeg-d")  # not the loader's layout: not counted
    assert distinct_files(val) == 3
    assert distinct_files(tmp_path / "none") == 0
