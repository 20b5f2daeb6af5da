"""`make wheelhouse` fills a folder with every wheel `make install` and `make horovod` need, and on a node whose pip
can reach no package index, `make install horovod WHEELHOUSE=folder` installs from it and reports Horovod's
operations. The real Makefile and install_horovod.sh run in a copy of the repository whose requirement files name
small stand-in wheels (torch itself would be gigabytes); only the Horovod build is stood in for."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile

from support import ROOT


def _wheel(folder, name, version, files, requires=()):
    """A minimal pure-Python wheel: `files` maps paths inside it to their text; `requires` its Requires-Dist."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    deps = "".join(f"Requires-Dist: {r}\n" for r in requires)
    meta = {
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{deps}",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as z:
        for arc, text in {**files, **meta}.items():
            z.writestr(arc, text)
        z.writestr(f"{dist}.dist-info/RECORD", "".join(f"{a},,\n" for a in [*files, *meta, f"{dist}.dist-info/RECORD"]))
    return path


REQS = {  # requirement file -> (distribution, version, module) stand-ins for what the real files pin
    "requirements.txt": [
        ("torch", "2.14.1", "torch"),
        ("torchvision", "0.29.1", "torchvision"),
        ("timm", "1.0.31", "timm"),
    ]
    + [
        ("pyyaml", "6.0.2", "yaml"),
        ("tensorboard", "2.18.0", "tensorboard"),
        ("nvidia-dali-cuda130", "2.4.0", "nvidia/dali"),
    ],
    "requirements-dev.txt": [("pytest-standin", "1.0", "pytest_standin")],
}


def _project(tmp_path):
    """A copy of the repository's Makefile and install script, with stand-in requirement files and index."""
    proj, index = tmp_path / "proj", tmp_path / "index"
    (proj / "scripts").mkdir(parents=True)
    index.mkdir()
    shutil.copy(ROOT / "Makefile", proj)
    shutil.copy(ROOT / "scripts" / "check_install.py", proj / "scripts")
    for req, dists in REQS.items():
        (proj / req).write_text("".join(f"{d}=={v}\n" for d, v, _ in dists))
        for d, v, mod in dists:
            # DALI pins packaging below its newest release, as nvidia-dali 2.4 does (packaging<=26.3)
            requires = ["packaging<=26.3"] if d.startswith("nvidia-dali") else []
            _wheel(index, d, v, {f"{mod}/__init__.py": f"__version__ = {v!r}\n"}, requires)
    for v in ("26.3", "26.4"):
        _wheel(index, "packaging", v, {"packaging/__init__.py": f"__version__ = {v!r}\n"})
    (proj / "requirements-cu126.txt").write_text("torch==2.14.1\n")
    hvd = {
        "horovod/__init__.py": "__version__ = '0.28.1'\n",
        "horovod/torch/__init__.py": "def gloo_built():\n    return True\n\n\ndef nccl_built():\n    return 2307\n",
    }
    built = _wheel(tmp_path, "horovod", "0.28.1", hvd, requires=["packaging"])
    # The build itself (minutes of C++) is stood in for: the stand-in copies the wheel where --wheel-dir says.
    (proj / "scripts" / "install_horovod.sh").write_text(
        f'#!/bin/bash\n[ "$1" = --wheel-dir ] && [ "$3" = --nccl ] && cp {built} "$2"\n'
    )
    return proj, index


def _make(proj, args, env):
    py = getattr(sys, "_base_executable", sys.executable)
    return subprocess.run(
        ["make", "--no-print-directory", f"PYTHON_SYS={py}", *args],
        cwd=proj,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_install_from_a_wheelhouse_with_no_index(tmp_path):
    proj, index = _project(tmp_path)
    wh = tmp_path / "wheel house"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "DAWNBENCH_", "VIRTUAL_ENV"))}
    base["PIP_CONFIG_FILE"] = os.devnull  # no pip.conf: its extra indexes and find-links would be other sources
    # Building the wheelhouse: the stand-in index plays the package index.
    p = _make(proj, ["wheelhouse", f"WHEELHOUSE={wh}"], {**base, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index)})
    assert p.returncode == 0, p.stdout + p.stderr
    names = sorted(f.name.split("-")[0] for f in wh.glob("*.whl"))
    assert names == sorted(
        ["horovod", "nvidia_dali_cuda130", "packaging", "pytest_standin", "pyyaml", "tensorboard", "timm"]
        + ["torch", "torchvision"]
    )
    assert (wh / "cuda-variant.txt").read_text().strip() == "cu130"
    assert "make wheelhouse: 9 wheels for CUDA=cu130" in p.stdout

    # A newer packaging in the folder (as an unpinned `pip wheel packaging` put there) must not replace the venv's.
    _wheel(wh, "packaging", "26.4", {"packaging/__init__.py": "__version__ = '26.4'\n"})
    # A fresh node: the real install script, no venv, and an index nothing answers on.
    shutil.copy(ROOT / "scripts" / "install_horovod.sh", proj / "scripts" / "install_horovod.sh")
    shutil.rmtree(proj / ".venv")
    offline = {**base, "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_RETRIES": "0", "PIP_TIMEOUT": "2"}
    venv_py = proj / ".venv" / "bin" / "python"
    p = _make(proj, ["install", "horovod", f"WHEELHOUSE={wh}"], offline)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "--no-index --find-links" in p.stdout
    assert "horovod 0.28.1 gloo built: True nccl built: 2307" in p.stdout  # the operations it has, reported
    got = subprocess.run(
        [venv_py, "-c", "import torch, horovod; print(torch.__version__, horovod.__version__)"],
        capture_output=True,
        text=True,
    )
    assert got.stdout.split() == ["2.14.1", "0.28.1"]
    # Horovod's install kept every pin: DALI's packaging<=26.3 holds, and pip check says so.
    kept = subprocess.run([venv_py, "-c", "import packaging; print(packaging.__version__)"], capture_output=True)
    assert kept.stdout.decode().strip() == "26.3"
    assert subprocess.run([venv_py, "-m", "pip", "check"], capture_output=True).returncode == 0
    # The index really is unreachable: the same venv's pip cannot install from it.
    blocked = subprocess.run(
        [venv_py, "-m", "pip", "install", "-q", "six"], env=offline, capture_output=True, timeout=120
    )
    assert blocked.returncode != 0

    # A requirement the wheelhouse lacks, on a venv that has every other (torch included): pip fails, so make fails
    # and the venv is left unstamped.
    (proj / "requirements-dev.txt").write_text("pytest-standin==1.0\nlint-standin==1.0\n")
    p = _make(proj, ["install", f"WHEELHOUSE={wh}"], offline)
    assert p.returncode != 0
    assert "No matching distribution found for lint-standin" in p.stdout + p.stderr
    assert not (proj / ".venv" / ".installed").exists()
    # Without cuda-variant.txt: the one refusal line, and no raw error from the tools that read it.
    (wh / "cuda-variant.txt").unlink()
    p = _make(proj, ["install", f"WHEELHOUSE={wh}"], offline)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert lines[0] == (
        f"WHEELHOUSE={wh}: no wheels for CUDA=cu130 there (its cuda-variant.txt: missing); "
        "fill it with make wheelhouse CUDA=cu130"
    )
    # make's own last line ("make[1]: ***" when the suite itself runs under make test)
    assert [ln for ln in lines[1:] if not re.match(r"make(\[\d+\])?: \*\*\*", ln)] == []
    (wh / "cuda-variant.txt").write_text("cu130\n")

    # A wheelhouse for the other CUDA variant is refused with one line naming both.
    shutil.rmtree(proj / ".venv")
    p = _make(proj, ["install", f"WHEELHOUSE={wh}", "CUDA=cu126"], offline)
    assert p.returncode == 2
    assert "no wheels for CUDA=cu126 there (its cuda-variant.txt: cu130)" in p.stderr
