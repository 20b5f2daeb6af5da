"""scripts/check_install.py, which `make install` runs before it writes its stamp: every requirement installed at its
pin and importable, and the requirement files name every module the project imports."""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest
from support import ROOT

from scripts import check_install

OPTIONAL = {"horovod"}  # built by `make horovod`, not `make install`; its tests skip without it


def test_requirement_files_are_read_as_pip_reads_them():
    reqs = check_install.requirements([ROOT / "requirements-cu126.txt", ROOT / "requirements.txt"])
    assert ("torch", "2.14.1+cu126") in reqs and ("torch", "2.14.1") in reqs
    assert ("pyyaml", None) in reqs and ("nvidia-dali-cuda130", "2.4.0") in reqs
    assert all(not name.startswith("-") for name, _ in reqs)  # --extra-index-url is an option, not a requirement


def test_missing_wrong_pin_and_broken_import_are_each_one_line(monkeypatch):
    monkeypatch.setitem(check_install.IMPORTS, "pytest", "no_such_module_for_this_test")
    bad = check_install.problems([("no-such-dist-for-this-test", None), ("pyyaml", "0.0.1"), ("pytest", None)])
    assert bad[0] == "no-such-dist-for-this-test: not installed"
    assert bad[1].startswith("pyyaml: ") and bad[1].endswith(" installed, the requirements pin 0.0.1")
    assert bad[2].startswith("pytest: import no_such_module_for_this_test failed: ModuleNotFoundError: ")
    assert len(bad) == 3


def test_a_good_install_passes(capsys, tmp_path):
    req = tmp_path / "r.txt"
    req.write_text("# comment\n--extra-index-url https://example.invalid\npyyaml>=6.0\n")
    assert check_install.main(["-r", str(req)]) == 0
    assert capsys.readouterr().out == "check_install: 1 requirements installed and importable\n"


def _third_party_imports() -> dict[str, str]:
    """Top-level module -> a file that imports it, for every import of the project that is neither local nor stdlib."""
    ours = [p for p in ROOT.rglob("*") if not {".venv", "runs", ".git"} & set(p.relative_to(ROOT).parts)]
    files = [p for p in ours if p.suffix == ".py"]
    local = {p.stem for p in files} | {p.name for p in ours if p.is_dir()}
    found = {}
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for n in names:
                top = n.split(".")[0]
                if top not in local and top not in sys.stdlib_module_names:
                    found.setdefault(top, str(f.relative_to(ROOT)))
    return found


def test_every_module_the_project_imports_is_checked_by_make_install():
    reqs = check_install.requirements([ROOT / "requirements.txt", ROOT / "requirements-dev.txt"])
    checked = {check_install.module_of(name).split(".")[0] for name, _ in reqs}
    found = _third_party_imports()
    assert {"torch", "yaml", "PIL", "nvidia", "scipy", "matplotlib", "hypothesis"} <= set(found)
    unchecked = {m: f for m, f in found.items() if m not in checked | OPTIONAL}
    assert unchecked == {}, f"imported but in no requirement file (or check_install.IMPORTS): {unchecked}"


def test_includes_are_followed_and_a_bom_hides_nothing(tmp_path):
    """CI1: `-r` includes are read (in each of pip's spellings); a byte-order mark once hid the first requirement."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("\ufeffpillow==1.0\n--requirement=c.txt\n")
    (tmp_path / "sub" / "c.txt").write_text("numpy\n")
    (tmp_path / "a.txt").write_bytes("\ufeffpyyaml\n-r sub/b.txt\n-rsub/c.txt\n".encode())
    assert check_install.requirements([tmp_path / "a.txt"]) == [
        ("pyyaml", None),
        ("pillow", "1.0"),
        ("numpy", None),
        ("numpy", None),
    ]


def test_a_pin_is_compared_whole(monkeypatch):
    """CI2: 2.14.10 installed does not satisfy a 2.14.1 pin (nor 2.14.1+cu126 a plain 2.14.1)."""
    versions = {"torch": "2.14.10", "torchvision": "2.14.1+cu126"}
    monkeypatch.setattr(check_install.importlib.metadata, "version", lambda name: versions[name])
    assert check_install.problems([("torch", "2.14.1"), ("torchvision", "2.14.1")]) == [
        "torch: 2.14.10 installed, the requirements pin 2.14.1",
        "torchvision: 2.14.1+cu126 installed, the requirements pin 2.14.1",
    ]


def _fifo(tmp_path):
    os.mkfifo(tmp_path / "fifo.txt")
    return tmp_path / "fifo.txt"


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda t: t / "none.txt", "does not exist"),
        (lambda t: t, "is not a regular file"),
        (_fifo, "is not a regular file"),
        (lambda t: Path("/dev/zero"), "is not a regular file"),
        (lambda t: (t / "big.txt").write_bytes(b"#" * (2 << 20)) and t / "big.txt", "expected at most 1,048,576"),
        (lambda t: (t / "l1.txt").write_bytes(b"caf\xe9\n") and t / "l1.txt", "is not UTF-8 text (byte 3)"),
        (lambda t: (t / "self.txt").write_text("-r self.txt\n") and t / "self.txt", "includes itself"),
    ],
)
def test_a_requirement_file_that_is_not_one_is_one_line(tmp_path, capsys, make, words):
    """A FIFO hung, /dev/zero filled memory, a self-include was a RecursionError, a missing or Latin-1 file a
    traceback."""
    path = make(tmp_path)
    assert check_install.main(["-r", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("check_install: requirement file '") and words in err, err


def test_includes_deeper_than_the_limit_are_refused(tmp_path):
    for i in range(12):
        (tmp_path / f"r{i}.txt").write_text(f"-r r{i + 1}.txt\n")
    (tmp_path / "r12.txt").write_text("pyyaml\n")
    with pytest.raises(check_install.RequirementsError, match="-r includes more than 8 deep"):
        check_install.requirements([tmp_path / "r0.txt"])
