"""The plug-ins' names live in their records (base/registry.py): no other module, tests included, keeps a list,
tuple, set or dict of two or more allreduce backend, optimizer, input pipeline or model names by hand, where a new one
would have to be added. A list that must name them derives from the registry's tables (a test parametrizes from them);
one name as a specific case (ddp as the reference) is not a list."""

from __future__ import annotations

import ast

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
}
# This file's own examples of what the check finds.
SELF = "tests/meta/test_plugin_lists.py"


def hand_lists(tree: ast.AST, names: set[str]) -> list[tuple[int, list[str]]]:
    """(line, names) of every literal collection (or dict's keys) naming two or more of `names`."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            elts = node.elts
        elif isinstance(node, ast.Dict):
            elts = [k for k in node.keys if k is not None]
        else:
            continue
        found = [e.value for e in elts if isinstance(e, ast.Constant) and e.value in names]
        if len(set(found)) >= 2:
            out.append((node.lineno, found))
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
                hits = [(line, found) for line, found in hand_lists(tree, names)]
                bad += [f"{rel}:{ln}: {kind} {f}" for ln, f in hits if (rel, tuple(f)) not in NOT_PLUGIN_NAMES]
    for path in [ROOT / "train.py", ROOT / "evaluate.py"]:
        for kind, names in kinds.items():
            bad += [f"{path.name}:{ln}: {kind} {f}" for ln, f in hand_lists(ast.parse(path.read_text()), names)]
    assert not bad, "names kept by hand outside base/registry.py:\n" + "\n".join(bad)


def test_the_check_finds_a_hand_kept_list():
    tree = ast.parse('BACKENDS = ("ddp", "horovod")\nLABELS = {"sgd": 1, "lamb": 2}\nONE = ["ddp", "other"]\n')
    assert hand_lists(tree, {"ddp", "horovod"}) == [(1, ["ddp", "horovod"])]
    assert hand_lists(tree, {"sgd", "lamb"}) == [(2, ["sgd", "lamb"])]


def test_every_listed_exception_is_still_there():
    """An entry of NOT_PLUGIN_NAMES whose collection is gone is removed with it (no stale pass)."""
    for (rel, names), why in NOT_PLUGIN_NAMES.items():
        tree = ast.parse((ROOT / rel).read_text(), rel)
        assert any(tuple(found) == names for _, found in hand_lists(tree, set(names))), (rel, names, why)
