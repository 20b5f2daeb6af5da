"""scripts/check_install.py, which `make install` runs before it writes its stamp: every requirement installed at its
pin and importable, and the requirement files name every module the project imports."""

from __future__ import annotations

import ast
import sys

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
