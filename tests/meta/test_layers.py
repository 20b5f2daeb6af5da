"""Imports run downwards only: every module of the repository sits in one layer of `LAYERS`, and imports (at the top
of the file or inside a function, `import x` or `from x import y`, relative imports resolved) only modules of lower
layers, or of its own layer and top-level package. data/ and models/ share a layer, so neither imports the other.

    base              base/: errors, the one reader and the one writer, the plug-in records; imports nothing else
    data and models   data/, models/: take the config as a plain object, import nothing of recipes/
    recipe bottom     recipes.rundir.files, recipes.comm.stats, recipes.environment, recipes.argtypes,
                      recipes.metrics, recipes.exit_codes: no project imports but base
    config            recipes.config: the schema, with the names from base.registry
    recipe parts      schedule, optimizers, allreduce backends, the run package (checkpoints, resume, outputs), ...
    evaluation        recipes.evaluation: accuracy, inference modes, latency, evaluate.py's command line
    trainer           recipes.trainer: puts the parts together
    command line      recipes.cli: what train.py does with its arguments
    entry points      train.py, evaluate.py, scripts/
    lab               lab/: the network lab and the research tools; they import the product, nothing imports them

A new module goes into one of the layers below (the test names it until it does).
"""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
from support import ROOT

RECIPE_BOTTOM = ["recipes", "recipes.rundir.files", "recipes.comm.stats", "recipes.environment", "recipes.argtypes"]
RECIPE_BOTTOM += ["recipes.metrics", "recipes.exit_codes"]
RECIPE_PARTS = ["recipes.lars", "recipes.optim", "recipes.schedule", "recipes.schedule_report", "recipes.distributed"]
RECIPE_PARTS += ["recipes.rundir", "recipes.logger", "recipes.dawnbench", "recipes.comm"]
RECIPE_PARTS += ["recipes.steps", "recipes.step_builder", "recipes.epoch_clock", "recipes.preemption", "recipes.ema"]
RECIPE_PARTS += ["recipes.report", "recipes.timemodel", "recipes.memory"]
LAYERS: list[tuple[str, list[str]]] = [
    ("base", ["base"]),
    ("data and models", ["data", "models"]),
    ("recipe bottom", RECIPE_BOTTOM),
    ("config", ["recipes.config"]),
    ("recipe parts", RECIPE_PARTS),
    ("evaluation", ["recipes.evaluation"]),
    ("trainer", ["recipes.trainer"]),
    ("command line", ["recipes.cli"]),
    ("entry points", ["train", "evaluate", "scripts"]),
    ("lab", ["lab"]),
]
PACKAGES = ("base", "data", "models", "recipes", "scripts", "lab")
PRODUCT = ("base", "data", "models", "recipes", "scripts", "train", "evaluate")  # what a user of the recipe runs


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


def absolute_source(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a `from ... import` in `module` names, a relative one (`from .x import y`) resolved."""
    if node.level == 0:
        return node.module
    package = module.split(".") if is_package else module.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def imports(path, modules: dict, module: str | None = None) -> list[tuple[int, str]]:
    """(line, module) for every import of a project module in `path` (the module `module`, by default its name under
    the root), at the top or inside a function, resolved to its module name."""
    module = module or module_name(path)
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = absolute_source(node, module, path.name == "__init__.py")
            names = [source] + [f"{source}.{a.name}".lstrip(".") for a in node.names]
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
    assert not unplaced, f"add these modules to a layer in tests/meta/test_layers.py::LAYERS: {unplaced}"


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


def imports_of_the_lab(modules: dict) -> list[tuple[str, int, str]]:
    """(module, line, lab module) for every import of lab/ in the product (at the top or inside a function)."""
    return [
        (mod, line, target)
        for mod, path in modules.items()
        if mod.split(".")[0] in PRODUCT
        for line, target in imports(path, modules, mod)
        if target.split(".")[0] == "lab"
    ]


def test_the_product_never_imports_the_lab():
    """The lab depends one way on the product: a tool of scripts/ or a part of recipes/ that needs a lab module
    takes that code into the product, so the recipe reads and runs without lab/."""
    bad = [f"{mod}:{line} imports {target}" for mod, line, target in imports_of_the_lab(project_modules())]
    assert not bad, "the product imports the lab (lab/ may import the product, never the reverse): " + ", ".join(bad)


def test_the_lab_check_catches_a_product_module_importing_the_lab(tmp_path):
    """A product module importing the lab inside a function is found, with its line; the lab importing the product
    is not."""
    fake = tmp_path / "scripts" / "uses_lab.py"
    fake.parent.mkdir()
    fake.write_text("import base.errors\n\n\ndef f():\n    from lab import netlab\n")
    found = imports_of_the_lab({**project_modules(), "scripts.uses_lab": fake})
    assert found == [("scripts.uses_lab", 5, "lab"), ("scripts.uses_lab", 5, "lab.netlab")]


# What each of the lower packages may import of the project: base nothing but itself, data and models base and
# themselves (neither the other, nor anything of recipes/ or scripts/, at the top or inside a function).
MAY_IMPORT = {"base": {"base"}, "data": {"base", "data"}, "models": {"base", "models"}}


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_base_data_and_models_import_nothing_above_them(package):
    modules = project_modules()
    bad = []
    for mod, path in modules.items():
        if mod.split(".")[0] != package:
            continue
        for line, target in imports(path, modules):
            if target.split(".")[0] not in MAY_IMPORT[package]:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {mod} imports {target}")
    assert not bad, f"{package}/ may import only {sorted(MAY_IMPORT[package])} of this repository:\n" + "\n".join(bad)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle of `graph` (module -> modules it imports), each once, as [a, b, ..., a]."""
    cycles, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                cycle = path[path.index(nxt) :] + [nxt]
                if frozenset(cycle) not in done:
                    done.add(frozenset(cycle))
                    cycles.append(cycle)
            elif nxt not in seen:
                seen.add(nxt)
                visit(nxt, path + [nxt])

    for start in sorted(graph):
        seen = {start}
        visit(start, [start])
    return cycles


def package_graph(modules: dict, package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same top-level package it imports (at the top or inside a function)."""
    graph = {}
    for mod, path in modules.items():
        if mod.split(".")[0] == package:
            graph[mod] = {t for _, t in imports(path, modules) if t.split(".")[0] == package and t != mod}
    return graph


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles(package):
    """A part split in files imports one way only (netlab.py imports netlab_procs.py, never back; the time model's
    modules never import schedule_report, which imports them), even through an import inside a function."""
    cycles = import_cycles(package_graph(project_modules(), package))
    assert not cycles, f"import cycles in {package}/: " + "; ".join(" -> ".join(c) for c in cycles)


def room(module: str) -> str:
    """The room a module sits in: a subpackage of a top-level package as a whole (recipes.comm, recipes.rundir,
    scripts.launcher, ...), else the module itself."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or (ROOT / "/".join(parts[:2])).is_dir() else module


def room_graph(modules: dict, package: str) -> dict[str, set[str]]:
    """Room -> the other rooms of the same top-level package its modules import (at the top or inside a function)."""
    graph: dict[str, set[str]] = {}
    for mod, targets in package_graph(modules, package).items():
        graph.setdefault(room(mod), set()).update(room(t) for t in targets if room(t) != room(mod))
    return graph


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles_between_rooms(package):
    """A subpackage is one room, and rooms import one way only: no module of recipes/comm/ imports a module that
    imports one of comm's, even when no single pair of modules ties both ways."""
    cycles = import_cycles(room_graph(project_modules(), package))
    assert not cycles, f"rooms of {package}/ that import each other: " + "; ".join(" -> ".join(c) for c in cycles)


# Two pairs that once tied both ways, and the way each now runs. distributed imported comm for the backend's process
# environment while comm's multistream took distributed's collectives: the caller now hands that environment to
# `setup(cfg, env=recipes.comm.process_env(cfg.comm))`. rundir's outputs call dawnbench.write_entry while dawnbench
# took the writer's functions from rundir's writer: it takes them from base.writer, their one import path.
UNTIED = [("recipes.distributed", "recipes.comm"), ("recipes.dawnbench", "recipes.rundir")]


@pytest.mark.parametrize(("lower", "upper"), UNTIED)
def test_the_untied_pairs_import_one_way(lower, upper):
    graph = room_graph(project_modules(), "recipes")
    assert upper not in graph.get(lower, set()), f"{lower} imports {upper}, which imports it: hand the value in"


def test_the_cycle_check_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_only_entry_points_edit_sys_path():
    """The two-line bootstrap belongs to scripts started as files (tests/meta/test_entry_points.py starts each
    both ways); a module that is only imported gets the path from whoever runs it."""
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("tests/", ".")) or "/." in rel:
            continue  # the suite's own path set-up (tests/support.py), the venv
        tree = ast.parse(path.read_text(), str(path))
        is_entry = '__name__ == "__main__"' in path.read_text()
        for node in ast.walk(tree):
            chain = node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else None
            if isinstance(chain, ast.Attribute) and chain.attr == "path" and getattr(chain.value, "id", "") == "sys":
                if not is_entry:
                    bad.append(f"{rel}:{node.lineno}")
    assert not bad, "sys.path edits where `python -m scripts...` or a package import does the job: " + ", ".join(bad)


def test_the_layer_check_catches_an_upward_import(tmp_path):
    """The check itself: models importing recipes.config (inside a function), data (absolutely) and a sibling
    (relatively) is reported with file and line; a relative import from a package's __init__ resolves to the package."""
    fake = tmp_path / "models" / "bad.py"
    fake.parent.mkdir()
    fake.write_text(
        "import torch\nimport data.folder\nfrom . import factory\n\n\n"
        "def f():\n    from recipes.config import ConfigError\n"
    )
    modules = {**project_modules(), "models.bad": fake}
    found = imports(fake, modules, "models.bad")
    assert found == [(2, "data.folder"), (3, "models"), (3, "models.factory"), (7, "recipes.config")]
    assert layer_of("recipes.config") > layer_of("models.bad") == layer_of("data.folder")
    init = tmp_path / "models" / "__init__.py"
    init.write_text("from .factory import create_model\nfrom ..base import errors\n")
    assert imports(init, modules, "models") == [(1, "models.factory"), (2, "base"), (2, "base.errors")]


def test_bottom_and_stats_load_without_torch():
    """compare_runs reads CommStats and the run-file names without importing the training stack."""
    code = (
        "import sys\n"
        "import scripts.compare_runs, base.errors, base.registry, recipes.config\n"
        "heavy = [m for m in ('torch', 'timm', 'nvidia.dali') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def test_every_error_class_has_one_import_path():
    """No project module re-exports an error class: `from base.errors import X` is the only way in."""
    from base import errors

    names = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, Exception)}
    bad = []
    for path in [*project_modules().values(), *(ROOT / "tests").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "base.errors" and node.level == 0:
                bad += [f"{path.relative_to(ROOT)}:{node.lineno} {a.name}" for a in node.names if a.name in names]
    assert not bad, "import these from base.errors: " + ", ".join(bad)


# A part's config sections: what it may read as `cfg.<section>`; anything else it needs comes as a named argument.
# (The loss is built from data.aug_splits and optim.label_smoothing; the checkpointer saves the whole config.)
PART_SECTIONS = {
    "recipes/steps.py": {"data", "optim"},
    "recipes/schedule.py": set(),  # Schedule(cfg.phases, cfg.optim, num_images=, world_size=)
    "recipes/epoch_clock.py": set(),
    "recipes/logger.py": set(),
    "recipes/rundir/files.py": set(),
    "recipes/rundir/payload.py": set(),
    "recipes/rundir/checkpoint_files.py": set(),
    "recipes/rundir/directory.py": set(),
    "recipes/rundir/checkpointer.py": {"checkpoint", "dist", "model"},
}
# The allreduce backends are built from the comm section (`create_allreduce(cfg.comm, dist, timeout_s=, model_name=)`).
PART_SECTIONS |= {p.relative_to(ROOT).as_posix(): set() for p in sorted((ROOT / "recipes" / "comm").glob("*.py"))}
# The input pipelines are built from the data section (`create_input(cfg.data, dist, phases=, seed=, ...)`).
PART_SECTIONS |= {p.relative_to(ROOT).as_posix(): set() for p in sorted((ROOT / "data").glob("*.py"))}


def config_sections_read(path) -> set[str]:
    """`X` of every `cfg.X.<key>` / `self.cfg.X.<key>` in a module."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            holder = node.value.value
            named_cfg = isinstance(holder, ast.Name) and holder.id == "cfg"
            self_cfg = isinstance(holder, ast.Attribute) and holder.attr == "cfg"
            if named_cfg or self_cfg:
                out.add(node.value.attr)
    return out


@pytest.mark.parametrize("path", sorted(PART_SECTIONS))
def test_parts_read_only_their_own_config_sections(path):
    extra = config_sections_read(ROOT / path) - PART_SECTIONS[path]
    assert not extra, f"{path} reads cfg.{sorted(extra)}: take the value as a named argument instead"


MAX_POSITIONAL = 6  # beyond this a signature takes keyword-only arguments or a small dataclass


def long_signatures(path) -> list[str]:
    """'name (n positional)' for every function of `path` with more than MAX_POSITIONAL positional parameters."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [a.arg for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")]
            if len(names) > MAX_POSITIONAL:
                out.append(f"{node.name}:{node.lineno} ({len(names)} positional)")
    return out


def test_no_function_takes_seven_positional_parameters():
    bad = [f"{path.relative_to(ROOT)}:{s}" for path in project_modules().values() for s in long_signatures(path)]
    assert not bad, "make these keyword-only (`*,`) or give them a small dataclass:\n" + "\n".join(bad)


def test_the_signature_check_counts_positional_parameters(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def a(p, q, r, s, t, u, v): ...\ndef b(self, p, q, r, s, t, u, *, v): ...\n")
    assert long_signatures(f) == ["a:1 (7 positional)"]


def test_no_test_module_imports_another():
    """Tests share code through tests/support.py; conftest.py holds fixtures only."""
    tests = ROOT / "tests"
    own = {p.stem for p in tests.rglob("*.py") if p.stem.startswith("test_") or p.stem == "conftest"}
    bad = []
    for path in tests.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            bad += [f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in own]
    assert not bad, "\n".join(bad)
