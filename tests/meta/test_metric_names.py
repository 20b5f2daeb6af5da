"""The metrics' names live in their record (recipes/metrics.py): no other module spells a TensorBoard tag of one
(`"train/images_per_s"`, or `f"val/{k}"` built by hand), and the modules that write the sinks (console line,
TensorBoard, progress.json, history rows, summary.json) take a log window's metric names from the record, so that a
metric is added or renamed in one place."""

from __future__ import annotations

import ast

from support import ROOT

from recipes import metrics

# The modules between the step and the sinks.
SINKS = [
    "recipes/steps.py",
    "recipes/epoch_clock.py",
    "recipes/trainer.py",
    "recipes/logger.py",
    "recipes/report.py",
    "recipes/rundir/outputs.py",
]
# (module, name): why the string is not the metric's name
EXEMPT = {
    ("recipes/steps.py", "lr"): "torch's param_group key, written into a device tensor the captured step reads",
    ("recipes/steps.py", "momentum"): "torch's param_group key, written into a device tensor the captured step reads",
}
TAG_PREFIXES = ("train/", "val/", "epoch/")


def tags() -> set[str]:
    out = {metrics.window_tag(m) for m in metrics.WINDOW}
    return out | {metrics.epoch_tag(m) for m in metrics.EPOCH if metrics.epoch_tag(m)}


def spelled(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """(line, text) of every string constant in `names`, and of every f-string that starts a tag by hand."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            out.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr) and len(node.values) > 1:
            head = node.values[0]
            if isinstance(head, ast.Constant) and head.value in TAG_PREFIXES:
                out.append((node.lineno, f"f'{head.value}{{...}}'"))
    return out


def test_no_module_spells_a_metric_tag_or_a_window_metric_name():
    files = [ROOT / "train.py", ROOT / "evaluate.py"]
    for pkg in ("base", "recipes", "scripts", "data", "models"):
        files += sorted((ROOT / pkg).rglob("*.py"))
    window = {m.name for m in metrics.WINDOW}
    bad = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel == "recipes/metrics.py":
            continue
        names = tags() | (window if rel in SINKS else set())
        found = spelled(ast.parse(path.read_text(), rel), names)
        bad += [f"{rel}:{line}: {text!r}" for line, text in found if (rel, text) not in EXEMPT]
    assert not bad, "metric names spelled outside recipes/metrics.py (take them from its record):\n" + "\n".join(bad)


def test_every_exemption_is_still_needed_and_says_why():
    for (rel, name), why in EXEMPT.items():
        assert len(why) > 20, (rel, name)
        assert (rel, name) in {(rel, t) for _, t in spelled(ast.parse((ROOT / rel).read_text()), {name})}


def test_the_check_finds_a_spelled_tag_and_name():
    tree = ast.parse('log("train/images_per_s", x)\nd = {f"val/{k}": v}\nrow["grad_norm"]\nf"epoch {e}/{n}"\n')
    assert spelled(tree, tags() | {"grad_norm"}) == [(1, "train/images_per_s"), (2, "f'val/{...}'"), (3, "grad_norm")]
