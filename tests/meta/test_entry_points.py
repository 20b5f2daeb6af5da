"""Every script with a `__main__` block starts both ways from the repository root: as a file (`python
scripts/bench/bench.py --help`) and as a module (`python -m scripts.bench.bench --help`).

Started as a file, Python puts the script's own folder on the path, not the repository: a script whose imports are
the repository's packages puts the root there first (the two-line bootstrap). Every test imports the scripts as
modules, so without this check a missing bootstrap is invisible until a user types the command (make_sample.py
once stopped `make quickstart` on every fresh clone with `No module named 'base'`). The scripts are found by walking
the tree, so a new folder of tools is covered the day it lands.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from support import ROOT, quiet_env, start_all, started

# Not entry points a user starts: the test suite itself (its workers are started by the tests, with their own path).
SKIP_DIRS = {"tests", "runs", "__pycache__", "node_modules"}


def entry_points(root: Path = ROOT) -> list[str]:
    """Every .py file under root (hidden folders, tests/ and runs/ left out) with an `if __name__ == "__main__"`."""
    found = []
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS)
        for name in sorted(files):
            path = Path(here) / name
            if name.endswith(".py") and _has_main(path):
                found.append(path.relative_to(root).as_posix())
    return found


def _has_main(path: Path) -> bool:
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            left, right = node.test.left, node.test.comparators
            if getattr(left, "id", "") == "__name__" and right and getattr(right[0], "value", "") == "__main__":
                return True
    return False


def module_name(script: str) -> str:
    return script.removesuffix(".py").replace("/", ".")


def _last_line(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def file_start_problems(scripts: list[str], root: Path = ROOT) -> list[str]:
    """'`python X --help`: exit N: last line' for every script that does not start as a file."""
    start_all(((sys.executable, s, "--help") for s in scripts), cwd=root)
    problems = []
    for s in scripts:
        rc, out = started(sys.executable, s, "--help", cwd=root)
        if rc != 0:
            problems.append(f"`python {s} --help`: exit {rc}: {_last_line(out)}")
    return problems


# The module starts, in one process: `python -m M` is runpy's run of M as __main__ with the current folder first on
# the path, and the difference between two modules' starts is only in what they import, so one interpreter runs them
# in turn (the repository's modules forgotten between them) instead of paying torch's import once per script.
MODULE_DRIVER = """
import runpy, sys
base_path, base_modules = list(sys.path), set(sys.modules)
for name in sys.argv[1:]:
    sys.path[:] = base_path
    for m in [m for m in sys.modules if m not in base_modules and m.split(".")[0] in PROJECT]:
        del sys.modules[m]
    sys.argv = [name, "--help"]
    try:
        runpy.run_module(name, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:
        code, msg = 1, f"{type(e).__name__}: {e}"
        print(f"MODULE-START {name} 1 {msg}", flush=True)
        continue
    print(f"MODULE-START {name} {code}", flush=True)
"""


def module_start_problems(scripts: list[str], root: Path = ROOT) -> list[str]:
    """'`python -m M --help`: exit N: why' for every script that does not start as a module."""
    packages = sorted({s.split("/")[0] for s in scripts if "/" in s} | {"base", "recipes", "data", "models"})
    code = f"PROJECT = {packages!r}\n" + MODULE_DRIVER
    env = quiet_env()
    env.pop("PYTHONPATH", None)
    names = [module_name(s) for s in scripts]
    p = subprocess.run(
        [sys.executable, "-c", code, *names], cwd=root, capture_output=True, text=True, timeout=600, env=env
    )
    results = {}
    for line in p.stdout.splitlines():
        if line.startswith("MODULE-START "):
            _, name, rc, *why = line.split(" ", 3)
            results[name] = (int(rc), why[0] if why else "")
    problems = []
    for name in names:
        rc, why = results.get(name, (None, _last_line(p.stderr)))
        if rc != 0:
            problems.append(f"`python -m {name} --help`: exit {rc}: {why}")
    return problems


def test_the_walk_finds_the_entry_points():
    found = entry_points()
    for script in ("train.py", "evaluate.py", "data/make_sample.py", "scripts/launch.py", "scripts/bench/bench.py"):
        assert script in found
    assert "scripts/gpu_check/gpu_check_worker.py" in found
    assert not [s for s in found if s.startswith("tests/")]
    assert len(found) >= 30


def test_every_entry_point_starts_as_a_file():
    problems = file_start_problems(entry_points())
    assert not problems, "scripts that do not start as a file from the repository root:\n" + "\n".join(problems)


def test_every_entry_point_starts_as_a_module():
    problems = module_start_problems(entry_points())
    assert not problems, "scripts that do not start as a module:\n" + "\n".join(problems)


def test_a_script_without_the_bootstrap_is_named(tmp_path):
    """The check itself, on a tree of its own: a tool that imports a package of the tree fails as a file (by name,
    with Python's own line), starts as a module, and the same tool with the bootstrap starts both ways."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "__init__.py").write_text("VALUE = 1\n")
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "__init__.py").write_text("")
    main = 'import argparse\n\nif __name__ == "__main__":\n    argparse.ArgumentParser().parse_args()\n'
    (tmp_path / "tools" / "bare.py").write_text("from lib import VALUE\n" + main)
    boot = "import sys\nfrom pathlib import Path\n\nsys.path.insert(0, str(Path(__file__).resolve().parents[1]))\n"
    (tmp_path / "tools" / "booted.py").write_text(boot + "from lib import VALUE\n" + main)
    assert entry_points(tmp_path) == ["tools/bare.py", "tools/booted.py"]
    assert file_start_problems(["tools/bare.py", "tools/booted.py"], root=tmp_path) == [
        "`python tools/bare.py --help`: exit 1: ModuleNotFoundError: No module named 'lib'"
    ]
    assert module_start_problems(["tools/bare.py", "tools/booted.py"], root=tmp_path) == []
    (tmp_path / "tools" / "broken.py").write_text("from lib import NOTHING\n" + main)
    assert module_start_problems(["tools/broken.py"], root=tmp_path) == [
        "`python -m tools.broken --help`: exit 1: ImportError: cannot import name 'NOTHING' from 'lib' "
        f"({tmp_path}/lib/__init__.py)"
    ]
