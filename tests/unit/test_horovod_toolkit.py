"""scripts/install_horovod.sh's choice of CUDA compiler, headers and NCCL for Horovod's NCCL operations, on faked
toolkits: a system toolkit wins, else pip's nvidia-* wheels (CUDA 13's one prefix, CUDA 12's separate folders),
else the pip packages to install; the assembled prefix is laid out as a toolkit."""

from __future__ import annotations

import os
import subprocess

import pytest
from support import ROOT

from scripts import horovod_toolkit
from scripts.horovod_toolkit import assemble, pip_parts, plan


def _touch(path, text=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _fake_nvcc(prefix):
    nvcc = _touch(prefix / "bin" / "nvcc", "#!/bin/sh\necho 'Cuda compilation tools, release 13.0'\n")
    nvcc.chmod(0o755)


def _site_cu13(site, nccl=True):
    cu = site / "nvidia" / "cu13"
    _fake_nvcc(cu)
    _touch(cu / "include" / "cuda_runtime.h")
    _touch(cu / "lib" / "libcudart.so.13")
    if nccl:
        _touch(site / "nvidia" / "nccl" / "include" / "nccl.h")
        _touch(site / "nvidia" / "nccl" / "lib" / "libnccl.so.2")
    return site


NO_SYSTEM = {"HOROVOD_DEFAULT_CUDA": "/nonexistent-cuda"}


def test_pip_cu13_wheels_are_used_when_no_toolkit_is_installed(tmp_path):
    site = _site_cu13(tmp_path / "site")
    out = plan(site=site, cuda="13.0", env=NO_SYSTEM, assemble_dir=tmp_path / "tk")
    assert out["CUDA_SOURCE"] == "pip" and out["PIP_TOOLKIT"] == ""
    tk = tmp_path / "tk"
    assert out["CUDA_HOME"] == str(tk)
    assert (tk / "bin" / "nvcc").resolve() == (site / "nvidia" / "cu13" / "bin" / "nvcc").resolve()
    assert (tk / "include" / "cuda_runtime.h").exists()
    assert os.readlink(tk / "lib" / "libcudart.so") == "libcudart.so.13"  # the link name a build needs
    assert (tk / "lib64" / "libcudart.so").exists()
    assert out["NCCL_HOME"] == str(site / "nvidia" / "nccl") and out["NCCL_MISSING"] == ""


def test_cu12_headers_beside_nvcc_are_merged_into_one_include(tmp_path):
    site = tmp_path / "site"
    _fake_nvcc(site / "nvidia" / "cuda_nvcc")
    _touch(site / "nvidia" / "cuda_runtime" / "include" / "cuda_runtime.h")
    _touch(site / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12")
    _touch(site / "nvidia" / "cuda_cccl" / "include" / "cub" / "cub.cuh")
    assert pip_parts(site, "13.0") is None  # CUDA 12's folders do not make a CUDA 13 toolkit
    tk = assemble(pip_parts(site, "12.6"), tmp_path / "tk")
    assert {p.name for p in (tk / "include").iterdir()} == {"cuda_runtime.h", "cub"}
    assert os.readlink(tk / "lib" / "libcudart.so") == "libcudart.so.12"
    assemble(pip_parts(site, "12.6"), tk)  # rebuilt in place without error (links follow the wheels of now)
    assert (site / "nvidia" / "cuda_cccl" / "include" / "cub" / "cub.cuh").exists()  # rebuilding kept the sources


def test_a_named_toolkit_wins_and_a_wrong_one_is_refused(tmp_path):
    site = _site_cu13(tmp_path / "site")
    system = tmp_path / "cuda-13.0"
    _fake_nvcc(system)
    out = plan(site=site, cuda="13.0", env={**NO_SYSTEM, "CUDA_HOME": str(system)}, assemble_dir=None)
    assert (out["CUDA_SOURCE"], out["CUDA_HOME"], out["CUDA_NAMED_BY"]) == ("system", str(system), "CUDA_HOME")
    with pytest.raises(SystemExit, match=r"HOROVOD_CUDA_HOME=.*nothing has no bin/nvcc"):
        plan(site=site, cuda="13.0", env={"HOROVOD_CUDA_HOME": str(tmp_path / "nothing")}, assemble_dir=None)


def test_nothing_installed_names_the_pip_packages_for_torchs_cuda(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    out = plan(site=site, cuda="13.0", env=NO_SYSTEM, assemble_dir=None)
    assert out["CUDA_SOURCE"] == "missing"
    assert out["PIP_TOOLKIT"].split() == [
        "nvidia-cuda-nvcc==13.0.*",
        "nvidia-cuda-crt==13.0.*",
        "nvidia-nvvm==13.0.*",
        "nvidia-cuda-cccl==13.0.*",
        "nvidia-cuda-runtime==13.0.*",
    ]
    assert (
        "nvidia-cuda-nvcc-cu12==12.6.*" in plan(site=site, cuda="12.6", env=NO_SYSTEM, assemble_dir=None)["PIP_TOOLKIT"]
    )
    assert out["NCCL_HOME"] == "" and "no include/nccl.h" in out["NCCL_MISSING"]


def test_install_script_plan_reports_pip_toolkit_and_nccl(tmp_path):
    """The shell script's --plan, on a faked site and no system toolkit: NCCL asked for, nothing built."""
    site = _site_cu13(tmp_path / "site")
    env = {**os.environ, **NO_SYSTEM, "HOROVOD_PIP_SITE": str(site), "PY": str(ROOT / ".venv" / "bin" / "python")}
    for k in ("CUDA_HOME", "HOROVOD_CUDA_HOME", "HOROVOD_NCCL_HOME", "WHEELHOUSE"):
        env.pop(k, None)
    p = subprocess.run(
        ["bash", "scripts/install_horovod.sh", "--plan", "--nccl"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "variant=nccl" in p.stdout
    assert f"cuda_toolkit=pip {site}/nvidia/cu13" in p.stdout
    assert f"nccl={site}/nvidia/nccl" in p.stdout
    bad = subprocess.run(
        ["bash", "scripts/install_horovod.sh", "--gpu"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "unknown argument '--gpu'" in bad.stderr


def test_pins_give_the_wheelhouse_the_versions_the_venv_resolved(capsys):
    import importlib.metadata

    assert horovod_toolkit.main(["pins", "pyyaml>=6.0", "packaging"]) == 0
    want = f"pyyaml=={importlib.metadata.version('pyyaml')} packaging=={importlib.metadata.version('packaging')}"
    assert capsys.readouterr().out == want + "\n"
    with pytest.raises(SystemExit, match="no-such-dist-here is not installed"):
        horovod_toolkit.pins(["no-such-dist-here>=1"])
