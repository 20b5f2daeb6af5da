"""base/reader.py: every malformed input file a user can hand the project gets one line naming the file, never a
hang, a memory blow-up or a traceback; and the readers built on it (the tuner cache) refuse the same inputs."""

from __future__ import annotations

import json
import os

import pytest

from base import reader
from base.errors import ConfigError
from recipes.comm import tuner as tuning
from recipes.comm.plan import Settings

KEY = tuning.cache_key("resnet50", 8, "nccl", "float32", "none", "2nodes-x4")


def malformed(tmp_path):
    """(label, path, words the error must contain) for every class of bad input file."""
    cases = []

    def file(name, data: bytes, words):
        p = tmp_path / name
        p.write_bytes(data)
        cases.append((name, p, words))

    file("nan.json", b'{"a": NaN}', "NaN")
    file("inf.json", b'{"a": Infinity}', "Infinity")
    file("neginf.json", b'{"a": -Infinity}', "Infinity")
    file("overflow.json", b'{"a": 1e999}', "overflows")
    file("truncated.json", b'{"a": 1', "not valid JSON")
    file("latin1.json", b'{"a": "caf\xe9"}', "not UTF-8")
    file("list.json", b"[1, 2]", "expected an object")
    file("big.json", b" " * 2048 + b"{}", "at most")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    cases.append(("fifo", fifo, "not a regular file"))
    cases.append(("device", "/dev/zero", "not a regular file"))
    cases.append(("directory", tmp_path, "a directory"))
    cases.append(("missing", tmp_path / "none.json", "does not exist"))
    return cases


def test_every_malformed_input_is_one_line_naming_the_file(tmp_path):
    for label, path, words in malformed(tmp_path):
        with pytest.raises(ConfigError) as e:
            reader.read_json_object(path, what="network file", error=ConfigError, max_bytes=1024)
        text = str(e.value)
        assert "\n" not in text, label
        assert f"network file '{path}'" in text, (label, text)
        assert words in text, (label, text)


def test_good_input_is_read_as_it_is(tmp_path):
    p = tmp_path / "ok.json"
    p.write_text('{"a": 1.5, "b": [1, "x"], "c": null}')
    assert reader.read_json_object(p, what="x") == {"a": 1.5, "b": [1, "x"], "c": None}


@pytest.mark.parametrize(
    "entry, words",
    [
        ({"bucket_mb": 8.0, "streams": 100000, "slices": 2}, "streams=100000 is outside comm.streams's domain"),
        ({"bucket_mb": -1, "streams": 4, "slices": 2}, "bucket_mb=-1"),
        ({"bucket_mb": 8.0, "streams": 2.5, "slices": 2}, "streams must be an integer"),
        ({"bucket_mb": 8.0, "streams": 4}, "slices must be an integer"),
        ({"bucket_mb": "8", "streams": 4, "slices": 2}, "bucket_mb must be a number"),
        ([8, 4, 2], "an entry must be an object"),
    ],
)
def test_a_cache_entry_outside_comms_domains_is_never_used(tmp_path, entry, words):
    path = tmp_path / "tune.json"
    path.write_text(json.dumps({KEY: entry}))
    notes = []
    assert tuning.cache_load(path, KEY, note=notes.append) is None
    assert len(notes) == 1 and words in notes[0] and str(path) in notes[0], notes


def test_a_cache_that_is_no_tuner_cache_is_said_and_left_alone(tmp_path):
    path = tmp_path / "tune.json"
    for label, bad, words in malformed(tmp_path):
        if label in ("directory", "missing", "device", "big.json"):
            continue
        notes = []
        assert tuning.cache_load(bad, KEY, note=notes.append) is None, label
        assert len(notes) == 1 and words in notes[0], (label, notes)
    path.write_text("[1, 2]")  # someone else's file: a winner must not replace it
    notes = []
    tuning.cache_store(path, KEY, _tuned(), note=notes.append)
    assert path.read_text() == "[1, 2]" and "not stored" in notes[0]


def test_a_valid_entry_is_used(tmp_path):
    path = tmp_path / "tune.json"
    path.write_text(json.dumps({KEY: {"bucket_mb": 16, "streams": 3, "slices": 2}}))
    assert tuning.cache_load(path, KEY, note=pytest.fail) == Settings(16.0, 3, 2)


def _tuned():
    from support import drive_tuner, tuner

    t = tuner([Settings(16, 3, 2)], Settings(4, 1, 1))
    drive_tuner(t, lambda s: 1.0 / s.streams)
    return t


@pytest.mark.parametrize("opening", ["[", '{"a":'])
def test_deeply_nested_brackets_are_one_line_not_a_recursion_error(tmp_path, opening):
    """60 KB of nested brackets exhaust json's recursion: every tool that reads a JSON file reported a traceback."""
    p = tmp_path / "progress.json"
    p.write_text(opening * 60_000)
    with pytest.raises(ConfigError) as e:
        reader.read_json(p, what="progress file", error=ConfigError)
    assert str(e.value) == f"progress file '{p}' is nested too deeply: expected the file's own shape"


@pytest.mark.parametrize(
    "text, kind",
    [('"x"', "str"), ("5", "int"), ("1.5", "float"), ("null", "NoneType"), ("[]", "list"), ("true", "bool")],
)
def test_json_that_is_not_an_object_is_one_line(tmp_path, text, kind):
    p = tmp_path / "summary.json"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        reader.read_json_object(p, what="summary", error=ConfigError)
    assert str(e.value) == f"summary '{p}' holds a JSON {kind}: expected an object ({{...}})"


def test_the_size_cap_admits_a_file_of_exactly_the_cap(tmp_path):
    p = tmp_path / "cap.json"
    p.write_bytes(b"{}" + b" " * 98)
    assert reader.read_json_object(p, what="x", max_bytes=100) == {}
    p.write_bytes(b"{}" + b" " * 99)
    with pytest.raises(ValueError, match="is 101 bytes: expected at most 100"):
        reader.read_json_object(p, what="x", max_bytes=100)
