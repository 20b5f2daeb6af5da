"""Every file path the docs, the configs, the Makefile and the code's docstrings and help name exists: a module that
moved (recipes/timemodel.py became a package) leaves no stale pointer behind."""

from __future__ import annotations

import re

from support import ROOT

PATH = re.compile(
    r"(?<![\w./<-])((?:base|recipes|scripts|data|models|configs|tests|docs)/[\w./-]*\w\.(?:py|md|yaml|sh|json))"
)


def _texts():
    files = [*ROOT.glob("*.md"), *ROOT.glob("docs/*.md"), *ROOT.glob("configs/**/*.yaml"), ROOT / "Makefile"]
    files += [ROOT / "train.py", ROOT / "evaluate.py"]
    for folder in ("base", "recipes", "scripts", "data", "models"):
        files += sorted((ROOT / folder).rglob("*.py"))
    return files


def test_every_named_path_exists():
    missing = []
    for f in _texts():
        for m in PATH.finditer(f.read_text(errors="replace")):
            named = m.group(1)
            if "DATE" in named:  # a pattern for dated files, not a file
                continue
            if not (ROOT / named).exists() and not (f.parent / named).exists():  # docs link relative to docs/
                missing.append(f"{f.relative_to(ROOT)}: {named}")
    assert missing == []


def test_the_scan_finds_a_stale_path(tmp_path):
    assert PATH.findall("its model (recipes/timemodel.py) and `scripts/predict.py`") == [
        "recipes/timemodel.py",
        "scripts/predict.py",
    ]
