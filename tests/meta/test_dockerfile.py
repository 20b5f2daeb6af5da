"""The Dockerfile stays thin: its steps are the ones CI runs (make install, scripts/install_horovod.sh).

Docker is not available where the tests run, so this checks what can go stale without building: every file the
image copies exists, the Python environment comes from the Makefile's install step with the Python the Makefile
prefers, and the base image is CUDA 13 as torch's cu130 wheels need.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from support import ROOT


def _instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), " ".join(rest.split())))
    return out


# The GPU architectures (sm_XY as XY) each CUDA release's nvcc accepts: CUDA 12.6 still builds Volta (70); CUDA 13.0
# starts at Turing (75) (`nvcc --list-gpu-arch` of each release; checked against the nvcc installed, if any).
NVCC_ARCHS = {
    "12.6": {50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90},
    "13.0": {75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121},
}


def _bases() -> dict[str, tuple[str, list[int]]]:
    """{variant: (CUDA version of its base image, its HOROVOD_BUILD_CUDA_CC_LIST)} from the Dockerfile's stages."""
    out, current = {}, None
    for word, args in _instructions():
        if word == "FROM":
            m = re.fullmatch(r"nvidia/cuda:(\d+\.\d+)\.\d+-devel-ubuntu\d\d\.04 AS base-(cu\d+)", args)
            current = (m.group(2), m.group(1)) if m else None
        elif word == "ENV" and current and args.startswith("HOROVOD_BUILD_CUDA_CC_LIST="):
            out[current[0]] = (current[1], [int(a) for a in args.split("=", 1)[1].split(",")])
    return out


def test_each_cuda_variant_builds_only_architectures_its_nvcc_accepts():
    bases = _bases()
    assert set(bases) == {"cu130", "cu126"}
    assert bases["cu126"][0] == "12.6" and bases["cu130"][0] == "13.0"
    for variant, (cuda, archs) in bases.items():
        unsupported = sorted(set(archs) - NVCC_ARCHS[cuda])
        assert not unsupported, f"{variant} (CUDA {cuda}) asks nvcc for sm_{unsupported}, which it rejects"
    assert 70 in bases["cu126"][1]  # V100, the record's GPUs, needs the CUDA 12.6 variant
    nvcc = shutil.which("nvcc")
    if nvcc:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
        version = re.search(r"release (\d+\.\d+)", out).group(1)
        listed = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True).stdout.split()
        if version in NVCC_ARCHS:
            assert {int(a.split("_")[1]) for a in listed} == NVCC_ARCHS[version], f"nvcc {version}: {listed}"


def test_run_steps_call_only_what_ci_runs():
    """Every RUN step is the system packages, the Makefile's install target, or a script that CI runs too."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci  # make test = make install + scripts/install_horovod.sh (make horovod) + pytest
    make = (ROOT / "Makefile").read_text()
    for word, args in _instructions():
        if word != "RUN" or args.startswith("apt-get update"):
            continue
        if args.startswith("make "):
            target = args.split()[1]
            assert target == "install" and re.search(rf"^{target}:", make, re.M), args
        else:
            scripts = re.findall(r"bash (scripts/\S+)", args)
            assert scripts == ["scripts/install_horovod.sh"] and "scripts/install_horovod.sh" in make, args


def test_make_install_variants(tmp_path):
    def dry(*args):
        p = subprocess.run(
            ["make", "-n", "install", f"VENV={tmp_path / 'venv'}", *args], cwd=ROOT, capture_output=True, text=True
        )
        return p.returncode, p.stdout + p.stderr

    rc, out = dry()
    assert rc == 0 and "-r requirements.txt -r requirements-dev.txt" in out and "cu126" not in out
    rc, out = dry("CUDA=cu126")
    assert rc == 0 and "-r requirements-cu126.txt" in out and "requirements-common.txt" in out
    assert "grep -v -E '^(torch|torchvision|nvidia-dali-cuda130)==' requirements.txt" in out
    reqs = (ROOT / "requirements-cu126.txt").read_text()
    pins = dict(re.findall(r"^(torch|torchvision)==([\d.]+)", (ROOT / "requirements.txt").read_text(), re.M))
    for name, version in pins.items():  # the same versions, CUDA 12.6 builds
        assert f"{name}=={version}+cu126" in reqs
    assert "nvidia-dali-cuda120" in reqs and "download.pytorch.org/whl/cu126" in reqs
    rc, out = dry("CUDA=cu118")
    assert rc != 0 and "CUDA=cu118: expected cu130" in out


def test_dockerfile_uses_the_makefile_install_and_cuda_13():
    steps = _instructions()
    runs = [a for w, a in steps if w == "RUN"]
    assert any("make install PYTHON_SYS=python3.11 CUDA=${CUDA}" in r for r in runs)
    makefile = (ROOT / "Makefile").read_text()
    assert "python3.11" in makefile.split("PYTHON_SYS ?=", 1)[1].splitlines()[0]
    assert any("bash scripts/install_horovod.sh" in r and "HOROVOD_GPU_OPERATIONS=NCCL" in r for r in runs)
    assert any("openssh-server" in r for r in runs)  # the launcher's ssh transport between containers
    # requirements are installed before the sources are copied, so a code change does not reinstall torch
    copies = [a for w, a in steps if w == "COPY"]
    assert copies[0] == "Makefile requirements.txt requirements-dev.txt requirements-cu126.txt ./"
    assert copies[-1] == ". ."


def test_every_copied_file_exists():
    sources = []
    for word, args in _instructions():
        if word == "COPY" and args != ". .":
            sources += args.split()[:-1]
    missing = [s for s in sources if not (ROOT / s).exists()]
    if missing == ["scripts/install_horovod.sh"]:
        pytest.skip("scripts/install_horovod.sh arrives with the allreduce backends (issue 5)")
    assert missing == []
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and "runs" in ignored  # the image's own .venv is never overwritten by COPY . .


def test_what_the_install_steps_run_is_copied_before_them():
    """make install runs scripts/check_install.py and install_horovod.sh runs scripts/horovod_toolkit.py: each is in
    the image before the RUN step that needs it (the sources arrive only with the last COPY)."""
    make = (ROOT / "Makefile").read_text()
    recipe = make.split("$(VENV)/.installed:", 1)[1].split("\ninstall:", 1)[0]
    needed = {"make install": set(re.findall(r"scripts/\w+\.py", recipe))}
    script = (ROOT / "scripts" / "install_horovod.sh").read_text()
    needed["install_horovod.sh"] = {f"scripts/{n}" for n in re.findall(r"\$HERE/(\w+\.py)", script)}
    assert needed == {
        "make install": {"scripts/check_install.py"},
        "install_horovod.sh": {"scripts/horovod_toolkit.py"},
    }
    copied: set[str] = set()
    for word, args in _instructions():
        if word == "COPY" and args != ". .":
            copied |= set(args.split()[:-1])
        elif word == "RUN":
            for step, files in needed.items():
                if step in args:
                    assert files <= copied, (step, files - copied)
