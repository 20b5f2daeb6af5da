"""Imports run downwards only: every module of the repository sits in one layer of `LAYERS`, and imports (at the top
of the file or inside a function) only modules of lower layers, or of its own layer and top-level package.

    bottom            recipes.errors, recipes.registry, recipes.run_files, recipes.comm.stats, recipes.environment:
                      no project imports
    data and models   data/, models/: take the config as a plain object, never import recipes.config or above
    config            recipes.config: the schema, with the names from recipes.registry
    recipe parts      schedule, optimizers, allreduce backends, checkpoints, resume, the step, logging, outputs, ...
    evaluation        recipes.evaluation: accuracy, inference modes, latency, evaluate.py's command line
    trainer           recipes.trainer: puts the parts together
    command line      recipes.cli: what train.py does with its arguments
    entry points      train.py, evaluate.py, scripts/

A new module goes into one of the layers below (the test names it until it does).
"""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
from conftest import ROOT

BOTTOM = ["recipes", "recipes.errors", "recipes.registry", "recipes.run_files", "recipes.comm.stats"]
BOTTOM += ["recipes.environment"]
RECIPE_PARTS = ["recipes.lars", "recipes.optim", "recipes.schedule", "recipes.plan", "recipes.distributed"]
RECIPE_PARTS += ["recipes.checkpoint", "recipes.logger", "recipes.dawnbench", "recipes.comm"]
RECIPE_PARTS += ["recipes.rundir", "recipes.resume", "recipes.steps", "recipes.progress", "recipes.outputs"]
RECIPE_PARTS += ["recipes.report"]
LAYERS: list[tuple[str, list[str]]] = [
    ("bottom", BOTTOM),
    ("data and models", ["data", "models"]),
    ("config", ["recipes.config"]),
    ("recipe parts", RECIPE_PARTS),
    ("evaluation", ["recipes.evaluation"]),
    ("trainer", ["recipes.trainer"]),
    ("command line", ["recipes.cli"]),
    ("entry points", ["train", "evaluate", "scripts"]),
]
PACKAGES = ("data", "models", "recipes", "scripts")


def module_name(path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, object]:
    files = [ROOT / "train.py", ROOT / "evaluate.py"]
    for pkg in PACKAGES:
        files += sorted((ROOT / pkg).rglob("*.py"))
    return {module_name(f): f for f in files}


def layer_of(module: str) -> int | None:
    """Index of the layer whose longest prefix matches `module` (None: not placed)."""
    best, length = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > length:
                best, length = i, len(p)
    return best


def imports(path, modules: dict) -> list[tuple[int, str]]:
    """(line, module) for every import of a project module in `path`, resolved to its module name."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            # scripts/ put scripts/ on sys.path: `from launcher.hosts import ...` is scripts.launcher.hosts
            for candidate in (name, f"scripts.{name}"):
                if candidate in modules:
                    out.append((node.lineno, candidate))
                    break
    return out


def test_every_module_has_a_layer():
    unplaced = [m for m in project_modules() if layer_of(m) is None]
    assert not unplaced, f"add these modules to a layer in tests/test_layers.py::LAYERS: {unplaced}"


def test_imports_only_run_downwards():
    modules = project_modules()
    bad = []
    for mod, path in modules.items():
        mine = layer_of(mod)
        for line, target in imports(path, modules):
            theirs = layer_of(target)
            same_package = target.split(".")[0] == mod.split(".")[0]
            if theirs > mine or (theirs == mine and not same_package):
                bad.append(
                    f"{path.relative_to(ROOT)}:{line}: {mod} ({LAYERS[mine][0]}) imports {target} ({LAYERS[theirs][0]})"
                )
    assert not bad, "imports that run upwards:\n" + "\n".join(bad)


@pytest.mark.parametrize("package", ["data", "models"])
def test_data_and_models_import_nothing_of_the_recipe_but_the_bottom(package):
    modules = project_modules()
    allowed = set(LAYERS[0][1])
    for mod, path in modules.items():
        if mod.split(".")[0] != package:
            continue
        for line, target in imports(path, modules):
            if target.startswith("recipes"):
                assert target in allowed, f"{path.relative_to(ROOT)}:{line}: {mod} imports {target}"


def test_the_layer_check_catches_an_upward_import(tmp_path):
    """The check itself: models importing recipes.config is reported with file and line."""
    fake = tmp_path / "models" / "bad.py"
    fake.parent.mkdir()
    fake.write_text("import torch\n\n\ndef f():\n    from recipes.config import ConfigError\n")
    modules = {**project_modules(), "models.bad": fake}
    found = imports(fake, modules)
    assert found == [(5, "recipes.config")]
    assert layer_of("recipes.config") > layer_of("models.bad")


def test_bottom_and_stats_load_without_torch():
    """compare_runs reads CommStats and the run-file names without importing the training stack."""
    code = (
        "import sys; sys.path[:0] = ['scripts', '.']\n"
        "import compare_runs, recipes.errors, recipes.registry, recipes.config\n"
        "heavy = [m for m in ('torch', 'timm', 'nvidia.dali') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
