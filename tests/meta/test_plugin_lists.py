"""The plug-ins' names live in their records (recipes/registry.py): no other module keeps a list, tuple, set or
dict of two or more allreduce backend or optimizer names by hand, where a new backend or optimizer would have to be
added. A list that must name them derives from `registry.ALLREDUCE_BACKENDS` / `registry.OPTIMIZERS`."""

from __future__ import annotations

import ast

from support import ROOT

from recipes import registry

# Lab contenders, not registered backends: each is a way of reducing the gradients that the network lab measures
# with its own code (per-tensor, ddp with N flows, multistream at fixed and tuned settings, Horovod), the model's
# predictions of them (predict_lab) and the GPU check's ddp-against-multistream equality runs.
LAB_CONTENDERS = {
    "scripts/bench/bench_allreduce.py",
    "scripts/predict_lab.py",
    "scripts/gpu_check/gpu_check_runs.py",
    "scripts/gpu_check/gpu_check_worker.py",
}


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
    kinds = {"allreduce backends": set(registry.ALLREDUCE_BACKENDS), "optimizers": set(registry.OPTIMIZERS)}
    bad = []
    for pkg in ("recipes", "data", "models", "scripts"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "recipes/registry.py" or rel in LAB_CONTENDERS:
                continue
            tree = ast.parse(path.read_text(), rel)
            for kind, names in kinds.items():
                bad += [f"{rel}:{line}: {kind} {found}" for line, found in hand_lists(tree, names)]
    for path in [ROOT / "train.py", ROOT / "evaluate.py"]:
        for kind, names in kinds.items():
            bad += [f"{path.name}:{ln}: {kind} {f}" for ln, f in hand_lists(ast.parse(path.read_text()), names)]
    assert not bad, "names kept by hand outside recipes/registry.py:\n" + "\n".join(bad)


def test_the_check_finds_a_hand_kept_list():
    tree = ast.parse('BACKENDS = ("ddp", "horovod")\nLABELS = {"sgd": 1, "lamb": 2}\nONE = ["ddp", "other"]\n')
    assert hand_lists(tree, {"ddp", "horovod"}) == [(1, ["ddp", "horovod"])]
    assert hand_lists(tree, {"sgd", "lamb"}) == [(2, ["sgd", "lamb"])]
