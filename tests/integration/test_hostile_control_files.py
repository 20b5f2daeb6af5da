"""The data tools' and evaluate.py's own files (the blacklist, the progress markers, prepare.json, the manifest,
`--check --out`, `--out`/`--entry`) go through the one writer: a planted link, even one that points nowhere yet, is
refused with one line and never written through; a FIFO given as a file is refused, never waited on."""

from __future__ import annotations

import argparse
import io
import os
import tarfile

import pytest

from base.errors import ConfigError, DataError
from data.download import PROGRESS, extract_train, extract_val
from data.labels import BLACKLIST, write_blacklist
from data.make_sample import main as make_sample
from data.prepare import main as prepare_main
from recipes.evaluation import cli


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _tar(path, members: dict[str, bytes]):
    with tarfile.open(fileobj=path, mode="w") if isinstance(path, io.BytesIO) else tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture()
def sample(tmp_path):
    src = tmp_path / "src"
    make_sample(["--out", str(src), "--classes", "2", "--train-per-class", "2", "--val-per-class", "1"])
    return src


def test_the_blacklist_is_never_written_through_a_planted_temp_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "root"
    out.mkdir()
    (out / "ILSVRC2012_validation_blacklist.tmp").symlink_to(victim)  # the old temp name
    (out / f".{BLACKLIST}.tmp{os.getpid()}").symlink_to(victim)  # the writer's own temp name
    write_blacklist(b"3\n1\n", "test", out)
    assert victim.read_text() == "precious\n" and (out / BLACKLIST).read_text() == "3\n1\n"
    assert not (out / BLACKLIST).is_symlink()


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_progress_marker_that_is_a_link_is_refused_before_its_split_is_extracted(tmp_path, split):
    wnid = "n01440764"
    dst = tmp_path / "imagenet"
    (dst / PROGRESS / "train").mkdir(parents=True)
    victim = tmp_path / "victim"  # does not exist: the old writer created it through the link
    marker = dst / PROGRESS / ("val" if split == "val" else f"train/{wnid}")
    marker.symlink_to(victim)
    with pytest.raises(DataError) as e:
        if split == "val":
            extract_val(_tar(tmp_path / "val.tar", {"ILSVRC2012_val_00000001.JPEG": b"jpeg"}), dst, [wnid])
        else:
            inner = io.BytesIO()
            _tar(inner, {f"{wnid}_1.JPEG": b"jpeg"})
            extract_train(_tar(tmp_path / "train.tar", {f"{wnid}.tar": inner.getvalue()}), dst, stream=io.StringIO())
    assert str(e.value).startswith(f"a progress marker: '{marker}' is a symbolic link"), str(e.value)
    assert not victim.exists() and not (dst / split).exists()  # refused before any image was written


@pytest.mark.parametrize("name", ["prepare.json", "manifest.jsonl"])
def test_prepares_settings_and_manifest_are_never_written_through_a_link(sample, tmp_path, capsys, name):
    dst = tmp_path / "copy"
    dst.mkdir()
    victim = tmp_path / "victim"
    (dst / name).symlink_to(victim)
    assert prepare_main(["--src", str(sample), "--dst", str(dst), "--short-side", "16", "--workers", "1"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"'{dst / name}' is a symbolic link" in line, line
    assert not victim.exists()


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_check_out_is_refused_before_the_inspection(sample, tmp_path, capsys, kind):
    out = tmp_path / "report.tsv"
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out.symlink_to(victim) if kind == "link" else os.mkfifo(out)
    assert prepare_main(["--check", str(sample), "--workers", "1", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    line = _one_error_line(captured.err)
    assert line.startswith("error: --out: ") and f"'{out}' is a" in line, line
    assert "checked" not in captured.out  # refused before the inspection
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("flag", ["--out", "--entry"])
@pytest.mark.parametrize("kind", ["link", "dangling", "fifo"])
def test_evaluates_outputs_are_refused_up_front_and_never_written_through(tmp_path, flag, kind):
    out, victim = tmp_path / "out.json", tmp_path / "victim"
    if kind == "link":
        victim.write_text("precious\n")
    if kind == "fifo":
        os.mkfifo(out)
    else:
        out.symlink_to(victim)
    args = argparse.Namespace(**{"out": None, "entry": None, "export_file": None, flag[2:]: str(out)})
    with pytest.raises(ConfigError) as e:
        cli.check_args(args)  # the old probe opened a FIFO for writing: it waited for a reader forever
    assert str(e.value).startswith(f"{flag}: '{out}' is a"), str(e.value)
    with pytest.raises(ConfigError):
        cli._write_json(str(out), {"top1": 1.0}, flag)
    assert (victim.read_text() == "precious\n") if kind == "link" else not victim.exists()


def test_a_resized_copy_is_never_written_through_a_planted_temp_link(sample, tmp_path):
    dst = tmp_path / "copy"
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    images = sorted(p.relative_to(sample) for p in (sample / "train").rglob("*.JPEG"))
    for rel in images:  # the temp name each image is written to (one process: this one's pid)
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        (dst / f"{rel}.tmp{os.getpid()}").symlink_to(victim)
    assert prepare_main(["--src", str(sample), "--dst", str(dst), "--short-side", "16", "--workers", "1"]) == 0
    assert victim.read_text() == "precious\n"
    assert all((dst / rel).is_file() and not (dst / rel).is_symlink() for rel in images)


def test_a_copy_destination_that_cannot_be_made_is_one_line(sample, capsys):
    dst = "/proc/dawnbench-copy"  # refuses new folders, even to root (a read-only mount would too)
    assert prepare_main(["--src", str(sample), "--dst", dst, "--short-side", "16", "--workers", "1"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"cannot read or write '{dst}'" in line and "check the path, its permissions and free space" in line, line
