"""make variables that hold make code: what docs/security.md promises, checked over generated values. A value with
'$' on the make command line (or, for the plain names, in the environment) is refused before make expands it;
the same value as DAWNBENCH_<NAME> in the environment reaches the command as text."""

from __future__ import annotations

import os
import re
import shlex
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import ROOT

MAKEFILE = (ROOT / "Makefile").read_text()
# Every name the Makefile gives a default with `?=` is read from the environment (derived here as the Makefile
# derives its guard: a new variable is covered without joining a list).
USER_VARS = re.findall(r"^([A-Z][A-Z0-9_]*) *\?=", MAKEFILE, re.M) + ["PY"]
ENV_ROUTE = re.search(r"^ENV_ROUTE := (.*)$", MAKEFILE, re.M).group(1).split()
TARGETS = ["quickstart", "reproduce-158s", "reproduce-8gpu", "baseline-horovod", "compare", "test", "gpu-check"]
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)


def _payloads(marker: str):
    """make code in a value: each would run a command or write a file if make expanded it."""
    return st.sampled_from(
        [
            f"$(shell touch {marker})",
            f"${{shell touch {marker}}}",
            f"x$(file >{marker},pwned)y",
            f"/d/$(shell touch {marker})/data",
            f"$(eval $$(shell touch {marker}))",
        ]
    )


def _make(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-n", "--no-print-directory", "-o", ".venv/.installed", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


@SETTINGS
@given(data=st.data(), var=st.sampled_from(USER_VARS + ENV_ROUTE + [f"DAWNBENCH_{v}" for v in ENV_ROUTE]))
def test_make_code_on_the_command_line_is_refused_before_it_runs(data, var, tmp_path_factory):
    marker = tmp_path_factory.mktemp("make") / "ran"
    value = data.draw(_payloads(str(marker)))
    target = data.draw(st.sampled_from(TARGETS))
    p = _make([target, f"{var}={value}"])
    assert not marker.exists(), f"{var}={value}: make ran it"
    assert p.returncode == 2
    errors = [ln for ln in p.stderr.splitlines() if "***" in ln]
    assert len(errors) == 1 and f"{var}: a value with '$' on the make command line" in errors[0], p.stderr


@SETTINGS
@given(data=st.data(), var=st.sampled_from(ENV_ROUTE))
def test_the_environment_route_passes_make_code_as_text(data, var, tmp_path_factory):
    """DAWNBENCH_<NAME> is read with $(value) and quoted: the value reaches the launcher's command line as it is."""
    marker = tmp_path_factory.mktemp("make") / "ran"
    value = data.draw(_payloads(str(marker))) + " $x 'q'"
    if var == "CUDA":
        p = _make(["install"], {f"DAWNBENCH_{var}": value})
        assert not marker.exists() and p.returncode == 2 and "expected cu130" in p.stderr  # refused, not run
        return
    p = _make(["reproduce-158s"], {f"DAWNBENCH_{var}": value})
    assert p.returncode == 0, p.stderr
    assert not marker.exists()
    words = shlex.split(" ".join(p.stdout.replace("\\\n", " ").split("\n")))
    if var == "DATA":
        value = f"data.root={value}"
    assert value in words


@pytest.mark.parametrize("var", USER_VARS)
def test_plain_names_with_make_code_in_the_environment_are_refused(var, tmp_path):
    marker = tmp_path / "ran"
    p = _make(["quickstart"], {var: f"$(shell touch {marker})"})
    assert not marker.exists() and p.returncode == 2
    assert f"{var}: a value with '$' in the environment is expanded by make" in p.stderr


def test_ordinary_values_still_work():
    p = _make(["reproduce-8gpu", "DATA=/data/my imagenet;x", "RUN_DIR=runs/a b"])
    assert p.returncode == 0, p.stderr
    assert "'data.root=/data/my imagenet;x'" in p.stdout and "--run-dir 'runs/a b'" in p.stdout


@pytest.mark.parametrize("route", ["command line", "environment"])
@pytest.mark.parametrize("value", ["cu130 ;touch {m};", "cu126 cu130", "cu130;touch {m}", "", "cu130 x", "CU130"])
def test_cuda_is_exactly_one_word_of_its_list(tmp_path, route, value):
    """A list holding one valid word once passed the check (make CUDA='cu130 ;touch x;' ran the command)."""
    value = value.format(m=tmp_path / "ran")
    args, env = (
        (["install", f"CUDA={value}"], None) if route == "command line" else (["install"], {"DAWNBENCH_CUDA": value})
    )
    if route == "environment" and value == "":
        env = {"DAWNBENCH_CUDA": " "}  # an empty one means "the default"
    p = _make(args, env)
    errors = [ln for ln in p.stderr.splitlines() if "***" in ln]
    assert (
        p.returncode == 2
        and len(errors) == 1
        and "expected cu130 " in errors[0]
        and errors[0].endswith("exactly one word.  Stop.")
    ), p.stderr
    assert not (tmp_path / "ran").exists()


REQS = {"cu130": "-r requirements.txt -r requirements-dev.txt", "cu126": "-r requirements-cu126.txt -r "}


@pytest.mark.parametrize("route", ["command line", "environment"])
@pytest.mark.parametrize(("value", "cuda"), [(" cu130 ", "cu130"), ("\tcu126", "cu126"), ("cu130\n", "cu130")])
def test_cuda_with_blanks_around_it_installs_that_variant(tmp_path, route, value, cuda):
    """' cu130 ' once named no requirements list: pip installed no torch and check_install checked nothing (exit 0).
    The blanks are dropped and the name compared exactly: torch's requirements are installed and checked."""
    venv = tmp_path / "venv"
    args, env = ([f"CUDA={value}"], {}) if route == "command line" else ([], {"DAWNBENCH_CUDA": value})
    p = subprocess.run(
        ["make", "-n", "-B", "--no-print-directory", f"{venv}/.installed", f"VENV={venv}", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    pip = next(ln for ln in p.stdout.splitlines() if " -m pip install " in ln)
    check = next(ln for ln in p.stdout.splitlines() if "scripts/check_install.py" in ln)
    assert REQS[cuda] in pip and REQS[cuda] in check, p.stdout
    assert f"echo '{cuda}' > {venv}/.installed" in p.stdout


@pytest.mark.parametrize("cuda", ["cu130", "cu126"])
def test_cuda_is_quoted_where_the_recipes_use_it(tmp_path, cuda):
    venv = tmp_path / "venv"
    p = subprocess.run(
        ["make", "-n", "-B", "--no-print-directory", f"{venv}/.installed", f"CUDA={cuda}", f"VENV={venv}"],
        cwd=ROOT,
        env={**os.environ, "DAWNBENCH_WHEELHOUSE": str(tmp_path / "wheels")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert f"grep -sqx '{cuda}' " in p.stdout and f"echo '{cuda}' > {venv}/.installed" in p.stdout, p.stdout


PATH_VARS = re.search(r"^PATH_VARS := (.*)$", MAKEFILE, re.M).group(1).split()
# Where each variable is pasted into a command (a new variable fails the coverage test until it is placed here).
USED_BY = {
    "NPROC": "quickstart",
    "SAMPLE": "quickstart",
    "RUN_DIR": "quickstart",
    "PYTEST_ARGS": "test",
    "TEST_WORKERS": "test",
    "HOROVOD_NCCL": "wheelhouse",
    "GPU_CHECK_OUT": "gpu-check",
    "GPU_CHECK_WORK": "gpu-check",
    "NCCL_PRESET": "baseline-ddp-flows",
    "RUNS": "compare",
    "COMPARE_OUT": "compare",
    **{v: "reproduce-158s" for v in ENV_ROUTE if v != "CUDA"},
}
REFUSED = {*PATH_VARS, "CUDA"}
# ('$' has its own refusal, in the tests above.)
SHELL_PAYLOADS = [
    "x; touch {m} #",
    "x `touch {m}` y",
    "x & touch {m}",
    "x | touch {m}",
    "x ' y \" z",
    "x\ntouch {m}",
    "x\ttouch {m}",
]


def _words(stdout: str) -> list[str]:
    """The shell words of make -n's output: ';', '&' and '|' outside quotes are words of their own."""
    lex = shlex.shlex(stdout.replace("\\\n", " "), posix=True, punctuation_chars=True)
    lex.whitespace_split, lex.commenters = True, ""
    return list(lex)


def test_every_user_variable_is_placed():
    assert set(USER_VARS + ENV_ROUTE) == set(USED_BY) | REFUSED


@pytest.mark.parametrize("var", sorted(set(USER_VARS + ENV_ROUTE)))
def test_shell_characters_in_every_variable_are_quoted_or_refused(var, tmp_path):
    """`;`, backticks, `&`, `|`, quotes, blanks and newlines: a pasted path variable is refused with one line before
    anything expands (VENV='x;touch M;#' ran the touch through $(shell cat $(VENV)/.installed), even under -n); every
    other variable reaches the command as one quoted shell word (or, HOROVOD_NCCL, is only compared)."""
    marker = tmp_path / "ran"
    for payload in SHELL_PAYLOADS:
        value = payload.format(m=marker)
        for route in ("command line", "environment") if var in PATH_VARS else ("command line",):
            args, env = ([f"{var}={value}"], None) if route == "command line" else ([], {var: value})
            p = _make([USED_BY.get(var, "lint"), *args], env)
            assert not marker.exists(), f"{var}={value!r}: make ran it"
            if var in REFUSED:
                errors = [ln for ln in p.stderr.splitlines() if "***" in ln]
                assert p.returncode == 2 and len(errors) == 1, (value, p.stderr)
                assert errors[0].split("*** ")[1].startswith(f"{var}="), errors[0]
                assert "expected" in errors[0], errors[0]
                continue
            assert p.returncode == 0, (var, value, p.stderr)
            if var == "HOROVOD_NCCL":
                assert value not in p.stdout
                continue
            words = _words(p.stdout)
            pieces = value.split() if var == "RUNS" else [value]  # RUNS: a list of paths, each quoted on its own
            for piece in pieces:
                assert any(piece in w for w in words), (var, value, piece, words)


def test_a_failing_pip_install_fails_make_at_that_line(tmp_path):
    """The pip line's own status stops make there, not later through check_install (which then checked a venv
    that pip had left half-installed)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    calls = tmp_path / "calls"
    python = venv / "bin" / "python"
    python.write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\n'
        'case "$*" in *"pip install"*) echo ERROR: no matching distribution; exit 7;; esac\nexit 0\n'
    )
    python.chmod(0o755)
    p = subprocess.run(
        ["make", "-B", "--no-print-directory", f"{venv}/.installed", f"VENV={venv}"],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "DAWNBENCH_WHEELHOUSE"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "ERROR: no matching distribution" in p.stdout, p.stderr
    assert [ln.split()[:3] for ln in calls.read_text().splitlines()] == [["-m", "pip", "install"]]
    assert not (venv / ".installed").exists()


def test_clean_removes_only_what_the_makefile_made(tmp_path):
    """An inherited SAMPLE=/data/mine made `make clean` delete that folder."""
    p = _make(["clean"], {"SAMPLE": str(tmp_path / "mine")})
    assert p.returncode == 0 and p.stdout.strip() == "rm -rf runs data/sample .pytest_cache", p.stdout
