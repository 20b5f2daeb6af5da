"""The plug-ins' names live in their records (base/registry.py): no other module, tests included, keeps a list,
tuple, set or dict of two or more allreduce backend, optimizer, input pipeline or model names by hand, where a new one
would have to be added: not as a literal collection, not as a list of pairs, not inside a string ("read by lars,
hybrid"). A list that must name them derives from the registry's tables (a test parametrizes from them); one name as
a specific case (ddp as the reference, `optim.name=lars` in an override) is not a list.

A test that registers a record of its own (a made-up plug-in) names it with MADE_UP's prefix, so that it is not, and
never becomes, a real plug-in's name; one that changes a real record writes the change as
`monkeypatch.setitem(registry.TABLE, "name", dataclasses.replace(registry.TABLE["name"], field=...))`, one field of
that record and its own name, not another record put in its place."""

from __future__ import annotations

import ast
import re

from support import ROOT

from base import registry

# Collections whose strings happen to be plug-in names but name something else, each with what it names; keyed by
# file and the names found, so that any other list in the same file is still caught.
NOT_PLUGIN_NAMES = {
    ("recipes/environment.py", ("torch", "dali")): "package versions compared across hosts (torch, DALI)",
    ("scripts/gpu_check/gpu_check_perf.py", ("resnet50d", "resnet50")): "timm architectures timed against "
    "NVIDIA's published ResNet-50 rows (their floors): the comparison, not the registered models",
    ("scripts/gpu_check/gpu_check_perf.py", ("synthetic", "dali")): "the two pipelines whose trainer rates give "
    "DALI's cost in the loop (against prebuilt batches): one measured difference, not the registered pipelines",
    # Tests that hold published numbers: the names are those of the measurement the document reports, which a new
    # plug-in does not change.
    ("tests/meta/test_bench_numbers.py", ("resnet50_tweaked", "resnet26d")): "the two networks of the published "
    "inference benchmark (docs/data) whose reading the docs quote",
    ("tests/meta/test_docs_numbers.py", ("ddp", "multistream")): "the methods the published lab runs measured "
    "(docs/data/lab-*.json), as the docs' tables print them",
    ("tests/meta/test_docs_numbers.py", ("ddp", "horovod")): "the published lab's one-flow methods the docs quote",
    ("tests/meta/test_record_prediction.py", ("ddp", "multistream", "horovod")): "the published prediction of the "
    "record (docs), one row per backend as it was printed: numbers, not the registry's list",
    # Tables of cases, one row per case of a specific plug-in (its own keys, dtypes, overrides): each row tests
    # that plug-in's behaviour, not the list of plug-ins; a new plug-in's cases are its own tests.
    (
        "tests/integration/test_input_backends.py",
        ("dali", "dali", "dali", "torch", "torch", "synthetic", "synthetic"),
    ): "each input pipeline's own settings and the dtype and layout they give",
    (
        "tests/unit/test_resume_force.py",
        (
            "sgd",
            "sgd",
            "sgd",
            "lars",
            "lars",
            "lars",
            "lars",
            "lars",
            "hybrid",
            "hybrid",
            "hybrid",
            "hybrid",
            "lamb",
            "lamb",
        ),
    ): "each optimizer's own keys and the parameter-group key each one sets",
    ("tests/lab/test_stepmodel_flows.py", ("ddp", "multistream", "horovod", "ddp", "multistream", "horovod")): "the "
    "published lab runs' methods (docs/data/lab-multiflow-*.json) and their prediction errors that docs quote",
    ("tests/lab/test_predict_lab.py", ("ddp", "multistream")): "the network lab's methods (lab/lab_methods.py) "
    "one lab run measures, whose published fit the test checks: the lab's names, not the registered backends",
}
# The prefix of a plug-in name a test makes up for a record of its own.
MADE_UP = "made_up_"
# The record classes of base/registry.py, whose first argument (or `name=`) is the plug-in's name.
RECORDS = ("Allreduce", "Optimizer", "Input", "Model")
# A run of names in a string, as a list is written: separated by commas, slashes or bars.
_NAME = r"[A-Za-z0-9_]+"
_RUN = re.compile(rf"{_NAME}(?:\s*[,/|]\s*{_NAME})+")
# This file's own examples of what the check finds.
SELF = "tests/meta/test_plugin_lists.py"


def _strings(node: ast.AST) -> list[str]:
    """Every string constant inside a literal collection, its nested pairs and tuples included."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [v for e in node.elts for v in _strings(e)]
    if isinstance(node, ast.Dict):
        return [v for k in node.keys if k is not None for v in _strings(k)]
    return []


def hand_lists(tree: ast.AST, names: set[str], strings: bool = True) -> list[tuple[int, list[str]]]:
    """(line, names) of every literal collection (or dict's keys, or a list of pairs) naming two or more of `names`,
    and of every string that lists two or more of them ("read by lars, hybrid", "ddp,multistream")."""
    out, inner = [], set()
    for node in ast.walk(tree):
        if id(node) in inner:
            continue
        if isinstance(node, ast.List | ast.Tuple | ast.Set | ast.Dict):
            found = [v for v in _strings(node) if v in names]
            if len(set(found)) >= 2:
                out.append((node.lineno, found))
                inner.update(id(n) for n in ast.walk(node))  # a pair inside a flagged list is not a second hit
        elif strings and isinstance(node, ast.Constant) and isinstance(node.value, str):
            for run in _RUN.findall(node.value):
                found = [w for w in re.split(r"\s*[,/|]\s*", run) if w in names]
                if len(set(found)) >= 2:
                    out.append((node.lineno, found))
    return out


def _table(node: ast.AST) -> str | None:
    """The registry table an expression names (`registry.OPTIMIZERS` -> "OPTIMIZERS"), else None."""
    text = ast.unparse(node)
    return text.split(".")[-1] if text.startswith("registry.") and text.split(".")[-1].isupper() else None


def _own_copy(value: ast.AST, table: str, name: str) -> bool:
    """`dataclasses.replace(registry.TABLE["name"], field=...)`: that record with a field changed, its name kept."""
    if not (isinstance(value, ast.Call) and ast.unparse(value.func).endswith("replace") and value.args):
        return False
    src = value.args[0]
    same = (
        isinstance(src, ast.Subscript)
        and _table(src.value) == table
        and isinstance(src.slice, ast.Constant)
        and src.slice.value == name
    )
    return same and all(k.arg != "name" for k in value.keywords)


def made_up_records(tree: ast.AST, real: set[str]) -> list[tuple[int, str]]:
    """(line, what) of every record a test builds or puts into a registry table under a name that is a real
    plug-in's or lacks MADE_UP's prefix (`registry.Allreduce("ddp_fp16", ...)`, `monkeypatch.setitem(registry.
    OPTIMIZERS, "sgd", other)`); a real record changed in one field under its own name is allowed (`_own_copy`)."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = ast.unparse(node.func)
        if fn.startswith("registry.") and fn.split(".")[-1] in RECORDS:
            arg = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "name"), None)
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and not arg.value.startswith(MADE_UP):
                out.append((node.lineno, f"{fn}({arg.value!r}, ...): a record made in a test is named {MADE_UP}*"))
        elif fn.endswith("setitem") and len(node.args) == 3 and (table := _table(node.args[0])):
            key, value = node.args[1], node.args[2]
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                continue
            if key.value in real and not _own_copy(value, table, key.value):
                out.append(
                    (node.lineno, f"setitem(registry.{table}, {key.value!r}, ...): another record under a real name")
                )
            elif key.value not in real and not key.value.startswith(MADE_UP):
                out.append(
                    (node.lineno, f"setitem(registry.{table}, {key.value!r}, ...): a made-up name is {MADE_UP}*")
                )
    return out


def test_no_hand_kept_list_of_backends_or_optimizers():
    kinds = {
        "allreduce backends": set(registry.ALLREDUCE_BACKENDS),
        "optimizers": set(registry.OPTIMIZERS),
        "input pipelines": set(registry.INPUT_PIPELINES),
        "models": set(registry.MODELS),
    }
    bad = []
    for pkg in ("base", "recipes", "data", "models", "scripts", "tests"):  # tests: they parametrize from the records
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ("base/registry.py", SELF):
                continue
            tree = ast.parse(path.read_text(), rel)
            for kind, names in kinds.items():
                # strings: in tests (an expected message's "read by lars, hybrid"); the product's help texts say
                # which plug-ins read a key in words, and docs/config.md's reference is generated from the records
                hits = [(line, found) for line, found in hand_lists(tree, names, strings=pkg == "tests")]
                bad += [f"{rel}:{ln}: {kind} {f}" for ln, f in hits if (rel, tuple(f)) not in NOT_PLUGIN_NAMES]
    real = set().union(*kinds.values())
    for path in sorted((ROOT / "tests").rglob("*.py")):  # a record a test makes is named as one
        rel = path.relative_to(ROOT).as_posix()
        if rel != SELF:
            bad += [f"{rel}:{ln}: {what}" for ln, what in made_up_records(ast.parse(path.read_text(), rel), real)]
    for path in [ROOT / "train.py", ROOT / "evaluate.py"]:
        for kind, names in kinds.items():
            bad += [f"{path.name}:{ln}: {kind} {f}" for ln, f in hand_lists(ast.parse(path.read_text()), names)]
    assert not bad, "names kept by hand outside base/registry.py:\n" + "\n".join(bad)


def test_the_check_finds_a_hand_kept_list():
    tree = ast.parse('BACKENDS = ("ddp", "horovod")\nLABELS = {"sgd": 1, "lamb": 2}\nONE = ["ddp", "other"]\n')
    assert hand_lists(tree, {"ddp", "horovod"}) == [(1, ["ddp", "horovod"])]
    assert hand_lists(tree, {"sgd", "lamb"}) == [(2, ["sgd", "lamb"])]
    pairs = ast.parse('CASES = [("sgd", 0.1), ("lamb", 0.2)]\nWANT = "read by sgd, lamb"\nONE = "optim.name=sgd"\n')
    assert hand_lists(pairs, {"sgd", "lamb"}) == [(1, ["sgd", "lamb"]), (2, ["sgd", "lamb"])]
    assert hand_lists(pairs, {"sgd", "lamb"}, strings=False) == [(1, ["sgd", "lamb"])]


def test_the_check_finds_a_record_named_by_hand():
    """One name is enough: a test's own record under a plausible name (it would shadow a plug-in registered later),
    or another record put over a real one; a made-up name and a real record changed in place pass."""
    text = (
        'fp16 = registry.Allreduce("ddp_fp16", "m:C", "ddp fp16", "")\n'
        'monkeypatch.setitem(registry.ALLREDUCE_BACKENDS, "ddp_fp16", fp16)\n'
        'monkeypatch.setitem(registry.OPTIMIZERS, "sgd", registry.OPTIMIZERS["lars"])\n'
        'ok = registry.Optimizer(name="made_up_adam", impl="m:f", config="")\n'
        'monkeypatch.setitem(registry.OPTIMIZERS, "made_up_adam", ok)\n'
        'monkeypatch.setitem(registry.OPTIMIZERS, "sgd", replace(registry.OPTIMIZERS["sgd"], tensor_hparams=True))\n'
    )
    found = made_up_records(ast.parse(text), {"sgd", "lars", "ddp"})
    assert [line for line, _ in found] == [1, 2, 3], found


def test_every_listed_exception_is_still_there():
    """An entry of NOT_PLUGIN_NAMES whose collection is gone is removed with it (no stale pass)."""
    for (rel, names), why in NOT_PLUGIN_NAMES.items():
        tree = ast.parse((ROOT / rel).read_text(), rel)
        assert any(tuple(found) == names for _, found in hand_lists(tree, set(names))), (rel, names, why)
