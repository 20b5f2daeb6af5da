"""The command lines shown in README.md and docs/*.md keep working as the code changes.

Every `python ...`, `torchrun ...`, `horovodrun ...` and `make ...` command, in a code block or an inline code span,
is checked without training anything:
- the script (or `-m` module) exists, and every `--flag` it is given appears in its `--help` (a `-m` module of
  the repository's scripts/ or lab/ too);
- torchrun's and horovodrun's own flags appear in their `--help`; the command they start is checked the same way;
- `train.py` / `scripts/launch.py -c FILE key=value ...`: the real config loader accepts the file and the overrides;
- `make TARGET VAR=...`: `make -n` (print the recipe, run nothing) knows the target.
`[...]` marks an optional part: its flags are checked too. A failure names the doc, the line and the command.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support import ROOT

from base.errors import ConfigError
from recipes.config import load_config

TOOLS = ("python", "python3", "torchrun", "horovodrun", "make")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
BIN = Path(sys.executable).parent


def docs() -> list[Path]:
    return [ROOT / "README.md", ROOT / "lab" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def commands_in(text: str) -> list[tuple[int, str]]:
    """(line, command) for every code-block line and inline code span that starts with one of TOOLS."""
    found: list[tuple[int, str]] = []
    lines = text.splitlines()
    prose = list(lines)
    in_block, pending, start = False, "", 0
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            in_block = not in_block
            prose[i] = ""
            continue
        if not in_block:
            continue
        prose[i] = ""
        if not pending:
            start = i + 1
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        found.append((start, pending.strip()))
        pending = ""
    joined = "\n".join(prose)
    for m in re.finditer(r"`([^`\n]+(?:\n[^`\n]+)?)`", joined):
        found.append((joined.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split())))
    return [(n, c) for n, c in found if _program(c) is not None]


def _tokens(command: str) -> list[str]:
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        words = command.split()
    return [w.strip("[]") for w in words if w.strip("[]")]  # [--quick], [CHECKPOINT]: optional parts


def _strip_prefix(words: list[str]) -> list[str]:
    """Drop `sudo`, `env` and VAR=value assignments before the program."""
    while words and (words[0] in ("sudo", "env") or ASSIGNMENT.match(words[0])):
        words = words[1:]
    return words


def _program(command: str) -> str | None:
    words = _strip_prefix(_tokens(command))
    if len(words) < 2:
        return None  # the bare name of a tool in prose
    name = Path(words[0]).name
    return name if name in TOOLS else None


@functools.cache
def help_text(*argv: str) -> str:
    p = subprocess.run(list(argv), cwd=ROOT, capture_output=True, text=True, timeout=300)
    return p.stdout + p.stderr if p.returncode == 0 else ""


@functools.cache
def make_dry_run(*args: str) -> str | None:
    """None when `make -n args` knows what to do, else its error."""
    p = subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return None if p.returncode == 0 else (p.stderr.strip().splitlines() or ["failed"])[-1]


def _flags_missing(words: list[str], help_out: str) -> list[str]:
    known = set(FLAG.findall(help_out))
    missing = []
    for w in words:
        if w == "--":
            break
        if w.startswith("-") and not re.fullmatch(r"-[\d.]+", w):
            flag = w.split("=", 1)[0]
            if flag not in known:
                missing.append(flag)
    return missing


def check_command(command: str) -> list[str]:
    """What is wrong with one documented command (empty: nothing)."""
    words = _strip_prefix(_tokens(command))
    return _check(words)


def _check(words: list[str]) -> list[str]:
    if not words:
        return []
    name = Path(words[0]).name
    if name == "make":
        err = make_dry_run(*words[1:])
        return [f"`make -n {' '.join(words[1:])}` fails: {err}"] if err else []
    if name == "torchrun":
        return _check_launcher([sys.executable, "-m", "torch.distributed.run"], "torchrun", words[1:])
    if name == "horovodrun":
        return _check_launcher([str(BIN / "horovodrun")], "horovodrun", words[1:])
    if name not in ("python", "python3"):
        return []
    args = words[1:]
    if args[:2] == ["-m", "torch.distributed.run"]:
        return _check_launcher([sys.executable, "-m", "torch.distributed.run"], "torchrun", args[2:])
    if args[:1] == ["-m"]:
        if not importlib.util.find_spec(args[1]):
            return [f"module '{args[1]}' not found"]
        return _check_module(args[1], args[2:]) if args[1].split(".")[0] in ("scripts", "lab") else []
    return _check_script(args[0], args[1:])


def _check_module(module: str, args: list[str]) -> list[str]:
    """`python -m scripts.x ...` or `lab.x` (the repository's own tools): every flag it is given is in its `--help`."""
    out = help_text(sys.executable, "-m", module, "--help")
    if not out:
        return [f"`python -m {module} --help` fails"]
    problems = [f"{module} has no option {f}" for f in _flags_missing(args, out)]
    if "--" in args:  # e.g. lab.netlab ... -- COMMAND: check the command it runs too
        problems += _check(_strip_prefix(args[args.index("--") + 1 :]))
    return problems


def _check_launcher(argv: list[str], name: str, args: list[str]) -> list[str]:
    """torchrun/horovodrun: their own flags (up to the script or `python`), then the command they start."""
    split = next((i for i, a in enumerate(args) if a.endswith(".py") or Path(a).name in ("python", "python3")), None)
    own, rest = (args, []) if split is None else (args[:split], args[split:])
    problems = []
    if name == "horovodrun" and not Path(argv[0]).exists():
        pass  # horovodrun is not installed here: its own flags cannot be checked
    else:
        out = help_text(*argv, "--help")
        if not out:
            return [f"`{name} --help` fails"]
        problems += [f"{name} has no option {f}" for f in _flags_missing(own, out)]
    if rest and rest[0].endswith(".py"):
        problems += _check_script(rest[0], rest[1:])
    elif rest:
        problems += _check(rest)
    return problems


def _check_script(script: str, args: list[str]) -> list[str]:
    path = ROOT / script
    if not path.is_file():
        return [f"{script}: no such script"]
    out = help_text(sys.executable, script, "--help")
    if not out:
        return [f"`python {script} --help` fails"]
    problems = [f"{script} has no option {f}" for f in _flags_missing(args, out)]
    if "--" in args:  # e.g. netlab.py ... -- COMMAND: check the command it runs too
        problems += _check(_strip_prefix(args[args.index("--") + 1 :]))
    if script in ("train.py", "scripts/launch.py"):  # both read -c FILE key=value ... with the config loader
        problems += _check_train_config(args)
    return problems


def _check_train_config(args: list[str]) -> list[str]:
    config, overrides = None, []
    it = iter(args)
    for a in it:
        if a in ("-c", "--config"):
            config = next(it, None)
        elif a.startswith("--config="):
            config = a.split("=", 1)[1]
        elif a == "--":
            break
        elif "=" in a and not a.startswith("-"):
            overrides.append(a)
    if config is None and not overrides:
        return []
    try:
        load_config(ROOT / config if config else None, overrides)
    except ConfigError as e:
        return [f"the config loader refuses it: {e}"]
    return []


def check_docs(paths: list[Path]) -> list[str]:
    """'doc:line: `command`: problem' for every documented command that no longer fits the code."""
    found = [(p, n, c) for p in paths for n, c in commands_in(p.read_text())]
    # Warm the --help cache in parallel: each is a Python start-up that imports torch.
    helps = set()
    for _, _, c in found:
        words = _strip_prefix(_tokens(c))
        helps |= {(sys.executable, w, "--help") for w in words if w.endswith(".py") and (ROOT / w).is_file()}
        if Path(words[0]).name == "torchrun" or "torch.distributed.run" in words:
            helps.add((sys.executable, "-m", "torch.distributed.run", "--help"))
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda argv: help_text(*argv), sorted(helps)))
    problems = []
    for path, line, command in found:
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for problem in check_command(command):
            problems.append(f"{where}:{line}: `{command}`: {problem}")
    return problems


def test_the_docs_show_commands():
    """The extraction finds the commands a reader copies (so an empty check cannot pass by accident)."""
    found = {c for p in docs() for _, c in commands_in(p.read_text())}
    assert "make quickstart" in {c.split("#")[0].strip() for c in found}
    assert any(c.startswith("python train.py -c configs/quickstart.yaml --print-config") for c in found)
    assert any("torchrun" in c and "train.py" in c for c in found)
    assert len(found) > 40


@pytest.mark.slow  # a --help of every script (each imports torch): about 30 s on 2 cores
def test_every_documented_command_fits_the_code():
    problems = check_docs(docs())
    assert not problems, "commands in the docs that no longer fit the code:\n" + "\n".join(problems)


def test_a_stale_command_is_named_with_doc_line_and_reason(tmp_path):
    doc = tmp_path / "new.md"
    doc.write_text(
        "# A new page\n\n```bash\npython train.py -c configs/quickstart.yaml --no-such-flag\n"
        "python scripts/gone.py --x\n```\n\nThen `make no-such-target` and\n`torchrun --nproc-per-node 2 train.py "
        "optim.lrr=1`.\n\n```sh\npython -m scripts.bench.bench_optim --no-such-flag\npython -m scripts.gone\n```\n"
    )
    problems = check_docs([doc])
    text = "\n".join(problems)
    flag = "`python train.py -c configs/quickstart.yaml --no-such-flag`: train.py has no option --no-such-flag"
    assert f"{doc}:4: {flag}" in text
    assert f"{doc}:5: `python scripts/gone.py --x`: scripts/gone.py: no such script" in text
    assert f"{doc}:8: `make no-such-target`: `make -n no-such-target` fails" in text
    key = "the config loader refuses it: unknown key 'optim.lrr' (did you mean 'optim.lr'?)"
    assert f"{doc}:9: `torchrun --nproc-per-node 2 train.py optim.lrr=1`: {key}" in text
    assert (
        f"{doc}:12: `python -m scripts.bench.bench_optim --no-such-flag`: scripts.bench.bench_optim has no option"
        in text
    )
    assert f"{doc}:13: `python -m scripts.gone`: module 'scripts.gone' not found" in text
    assert len(problems) == 6, text


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_targets_in_the_docs_exist():
    assert make_dry_run("quickstart") is None
    assert make_dry_run("no-such-target") is not None
