"""The command lines shown to a user keep working as the code changes: README.md, docs/*.md, the Makefile's recipes
and the presets' `Run:` lines.

Every `python ...`, `torchrun ...`, `horovodrun ...` and `make ...` command, in a code block or an inline code span,
is started or checked at the smallest size that reaches its first real work, without training anything:
- the script is started as a file from the repository root, as the user types it (`python X.py --help`: an import
  that only works under the tests' path fails here), a `-m` module of the repository (scripts/ or lab/) with
  `python -m M --help`, and every `--flag` it is given appears in that help;
- a `train.py` command whose first work is cheap (`--plan`, `--print-config`) runs for real, its files into a
  temporary folder, and must end with the exit its line documents (`# ... exit 2`), else 0;
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
from pathlib import Path

import pytest
from support import ROOT, start_all, started

from base.errors import ConfigError
from recipes.config import load_config

TOOLS = ("python", "python3", "torchrun", "horovodrun", "make")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
BIN = Path(sys.executable).parent


def docs() -> list[Path]:
    """Every place a user reads a command from: the pages, the Makefile, the presets' headers."""
    pages = [ROOT / "README.md", ROOT / "lab" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [*pages, ROOT / "Makefile", *sorted((ROOT / "configs" / "presets").glob("*.yaml"))]


def commands_of(path: Path) -> list[tuple[int, str]]:
    text = path.read_text()
    if path.name == "Makefile":
        return makefile_commands(text)
    if path.suffix == ".yaml":
        return preset_commands(text)
    return commands_in(text)


def preset_commands(text: str) -> list[tuple[int, str]]:
    """The `Run: COMMAND` and `Plan first (runs nothing): COMMAND` of a preset's header (scripts/gen_presets.py)."""
    found = []
    for i, line in enumerate(text.splitlines()):
        for label in ("Run: ", "(runs nothing): "):
            if line.startswith("#") and label in line:
                found.append((i + 1, line.split(label, 1)[1].strip()))
    return found


MAKE_PROGRAM = re.compile(r"(?:\$\(PY\)|\$\(VENV\)/bin/(?P<bin>torchrun)|python3?)\s+(?P<rest>.*)")


def makefile_commands(text: str) -> list[tuple[int, str]]:
    """Each Makefile line that starts a Python script, module or torchrun, as the command it runs: the program
    and script, then every literal `--flag` of the line (the values are make expressions, known only at run time;
    the flags inside `$(if ...)` are the ones given when that value is set)."""
    found = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        start, logical = i, lines[i]
        while logical.endswith("\\") and i + 1 < len(lines):
            i += 1
            logical = logical[:-1] + " " + lines[i].strip()
        i += 1
        if logical.lstrip().startswith("#"):
            continue
        m = MAKE_PROGRAM.search(logical)
        if not m:
            continue
        rest = re.split(r"\s(?:\|\||&&|;)\s", m.group("rest"))[0]
        words = rest.split()
        if m.group("bin"):
            script = next((w for w in words if w.endswith(".py")), None)
            flags = [f for f in FLAG.findall(rest.split(script)[0] if script else rest) if f.startswith("--")]
            after = [f for f in FLAG.findall(rest.split(script, 1)[1]) if f.startswith("--")] if script else []
            cmd = ["torchrun", *flags] + ([script, *after] if script else [])
        elif words[0] == "-m" and len(words) > 1 and words[1].startswith(("scripts.", "lab.")):
            cmd = ["python", "-m", words[1], *[f for f in FLAG.findall(" ".join(words[2:])) if f.startswith("--")]]
        elif words[0].endswith(".py"):
            cmd = ["python", words[0], *[f for f in FLAG.findall(" ".join(words[1:])) if f.startswith("--")]]
        else:
            continue  # -m pip, -m pytest, -m venv: tools of the environment
        found.append((start + 1, " ".join(cmd)))
    return found


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


def help_text(*argv: str) -> str:
    """The `--help` of a command started as the user types it ("" when it fails to start)."""
    rc, out = started(*argv)
    return out if rc == 0 else ""


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
        rc, why = started(sys.executable, script, "--help")
        last = [line for line in why.strip().splitlines() if line.strip()][-1:] or ["no output"]
        return [f"`python {script} --help` fails (exit {rc}): {last[0]}"]
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


# The first real work of these is cheap (no data, no training): they run for real, not only their --help.
RUN_FOR_REAL = ("--plan", "--print-config")
EXPECTED_EXIT = re.compile(r"#.*\bexit (\d+)")


def real_run(command: str, work: Path) -> tuple[tuple[str, ...], int] | None:
    """(argv, expected exit) for a documented train.py command whose first work is cheap; its files go to work."""
    words = _strip_prefix(_tokens(command))
    if words[:2] not in (["python", "train.py"], ["python3", "train.py"]) or not set(RUN_FOR_REAL) & set(words):
        return None
    expected = EXPECTED_EXIT.search(command)
    return (sys.executable, "train.py", *words[2:], f"run.out_dir={work}"), int(expected.group(1)) if expected else 0


def check_docs(paths: list[Path], work: Path) -> list[str]:
    """'doc:line: `command`: problem' for every documented command that no longer fits the code."""
    found = [(p, n, c) for p in paths for n, c in commands_of(p)]
    # Every start at once, in parallel: each is a Python start-up that imports torch, once per distinct command.
    starts, runs = set(), {}
    for _, _, c in found:
        words = _strip_prefix(_tokens(c))
        starts |= {(sys.executable, w, "--help") for w in words if w.endswith(".py") and (ROOT / w).is_file()}
        starts |= {
            (sys.executable, "-m", m, "--help")
            for k, m in zip(words, words[1:], strict=False)
            if k == "-m" and m.startswith(("scripts.", "lab.")) and importlib.util.find_spec(m)
        }
        if Path(words[0]).name == "torchrun" or "torch.distributed.run" in words:
            starts.add((sys.executable, "-m", "torch.distributed.run", "--help"))
        if run := real_run(c, work):
            runs[c] = run
    start_all([*starts, *(argv for argv, _ in runs.values())])
    problems = []
    for path, line, command in found:
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        found_problems = check_command(command)
        if command in runs and not found_problems:
            argv, expected = runs[command]
            rc, out = started(*argv)
            if rc != expected:
                last = [x for x in out.strip().splitlines() if x.strip()][-1:] or ["no output"]
                found_problems.append(f"run as shown, it exits {rc} (expected {expected}): {last[0]}")
        problems += [f"{where}:{line}: `{command}`: {problem}" for problem in found_problems]
    return problems


def test_the_docs_show_commands():
    """The extraction finds the commands a reader copies (so an empty check cannot pass by accident)."""
    found = {c for p in docs() for _, c in commands_of(p)}
    assert "make quickstart" in {c.split("#")[0].strip() for c in found}
    assert any(c.startswith("python train.py -c configs/quickstart.yaml --print-config") for c in found)
    assert any("torchrun" in c and "train.py" in c for c in found)
    assert len(found) > 40


# Every shown script's and module's --help and ten --plan/--print-config runs (each a Python start that imports
# torch, in parallel): about a minute on 2 cores. An import break is caught sooner, by the not-slow
# tests/meta/test_entry_points.py, whose starts this test shares in one session (support.started).
@pytest.mark.slow
def test_every_documented_command_fits_the_code(tmp_path):
    problems = check_docs(docs(), tmp_path)
    assert not problems, "commands in the docs that no longer fit the code:\n" + "\n".join(problems)


def test_a_stale_command_is_named_with_doc_line_and_reason(tmp_path):
    doc = tmp_path / "new.md"
    doc.write_text(
        "# A new page\n\n```bash\npython train.py -c configs/quickstart.yaml --no-such-flag\n"
        "python scripts/gone.py --x\n```\n\nThen `make no-such-target` and\n`torchrun --nproc-per-node 2 train.py "
        "optim.lrr=1`.\n\n```sh\npython -m scripts.bench.bench_optim --no-such-flag\npython -m scripts.gone\n```\n"
    )
    problems = check_docs([doc], tmp_path)
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
