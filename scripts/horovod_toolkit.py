"""Where scripts/install_horovod.sh finds the CUDA compiler, CUDA headers and NCCL for Horovod's NCCL operations.

Horovod's NCCL build needs nvcc, the CUDA runtime headers and library, and NCCL's header and library. GPU nodes
often have a driver but no CUDA toolkit; pip's `nvidia-*` wheels carry all of it. This module decides, in order:

1. a toolkit named by HOROVOD_CUDA_HOME or CUDA_HOME, or /usr/local/cuda, when its bin/nvcc exists;
2. the toolkit from pip's wheels in the Python's site-packages, when they are installed there:
   CUDA 13 wheels share one prefix, `nvidia/cu13` (nvidia-cuda-nvcc, -crt, -cccl, nvidia-nvvm, nvidia-cuda-runtime);
   CUDA 12 wheels each have their own (`nvidia/cuda_nvcc`, `nvidia/cuda_runtime`, `nvidia/cuda_cccl`);
3. else the pip packages to install (matching torch's CUDA major.minor), after which step 2 is asked again.

Pip's folders are not laid out as a toolkit (no `libcudart.so` link name; CUDA 12's headers sit beside nvcc, not in
its folder), so `assemble` builds one prefix of symbolic links, as conda's CUDA packages are laid out, which
HOROVOD_CUDA_HOME, HOROVOD_CUDA_INCLUDE and HOROVOD_CUDA_LIB point at. NCCL comes from `HOROVOD_NCCL_HOME` or the
nvidia-nccl wheel that torch installs (`nvidia/nccl`).

    python scripts/horovod_toolkit.py plan --site DIR --cuda 13.0 [--assemble DIR]   # shell assignments
    python scripts/horovod_toolkit.py pins 'psutil>=5.9' packaging ...              # name==installed version

The plan's lines are `KEY='value'` assignments for the shell script to eval. `pins` prints each requirement pinned
to the version this Python has installed: the wheelhouse gets Horovod's dependencies at the versions the venv
resolved with every other pin (DALI's `packaging<=...`), not the newest ones.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

# pip's CUDA 13 wheels install into one prefix; the compiler needs crt (host headers), nvvm (cicc) and cccl (cub,
# libcu++, which cuda_fp16.h pulls in) beside nvcc.
PIP_CU13 = ["nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-cccl", "nvidia-cuda-runtime"]
PIP_CU12 = ["nvidia-cuda-nvcc-cu12", "nvidia-cuda-cccl-cu12", "nvidia-cuda-runtime-cu12"]
CU12_PARTS = ["cuda_nvcc", "cuda_runtime", "cuda_cccl"]


def system_toolkit(env: dict[str, str]) -> tuple[Path, str] | None:
    """(prefix, where it was named) of a toolkit whose bin/nvcc exists, in the order the module docstring gives."""
    for name, cand in (("HOROVOD_CUDA_HOME", env.get("HOROVOD_CUDA_HOME")), ("CUDA_HOME", env.get("CUDA_HOME"))):
        if cand:
            if not (Path(cand) / "bin" / "nvcc").is_file():
                raise SystemExit(f"horovod_toolkit: {name}={cand} has no bin/nvcc (expected a CUDA toolkit folder)")
            return Path(cand), name
    default = Path(env.get("HOROVOD_DEFAULT_CUDA", "/usr/local/cuda"))
    if (default / "bin" / "nvcc").is_file():
        return default, str(default)
    return None


def pip_parts(site: Path, cuda: str) -> list[Path] | None:
    """The pip folders that together make a toolkit for CUDA `cuda` ('13.0'), or None when one is missing."""
    if cuda.split(".")[0] == "12":
        parts = [site / "nvidia" / p for p in CU12_PARTS]
        need = [parts[0] / "bin" / "nvcc", parts[1] / "include" / "cuda_runtime.h"]
    else:
        parts = [site / "nvidia" / f"cu{cuda.split('.')[0]}"]
        need = [parts[0] / "bin" / "nvcc", parts[0] / "include" / "cuda_runtime.h"]
    return parts if all(p.is_file() for p in need) else None


def pip_packages(cuda: str) -> list[str]:
    """The requirement strings that install the toolkit for torch's CUDA `cuda` ('13.0' -> '==13.0.*')."""
    names = PIP_CU12 if cuda.split(".")[0] == "12" else PIP_CU13
    return [f"{n}=={cuda}.*" for n in names]


def _link_tree(sources: list[Path], dest: Path) -> None:
    """Every entry of every source folder as a symbolic link in `dest` (first source wins on a clash)."""
    dest.mkdir(parents=True, exist_ok=True)
    for src in sources:
        if not src.is_dir():
            continue
        for entry in sorted(src.iterdir()):
            link = dest / entry.name
            if not link.exists() and not link.is_symlink():
                link.symlink_to(entry)


def assemble(parts: list[Path], dest: Path) -> Path:
    """A toolkit prefix of links (bin, include, lib, lib64, nvvm) over pip's folders; returns `dest`."""
    if dest.exists():
        # Rebuilt every time: the links must follow the wheels installed now, not those of an earlier build.
        shutil.rmtree(dest)  # removes the links, never what they point at
    for sub in ("bin", "include", "nvvm"):
        _link_tree([p / sub for p in parts], dest / sub)
    _link_tree([p / "lib" for p in parts] + [p / "lib64" for p in parts], dest / "lib")
    lib = dest / "lib"
    # The wheels ship libcudart.so.N only; a build links against the plain name.
    for versioned in sorted(lib.glob("libcudart.so.*")):
        plain = lib / "libcudart.so"
        if not plain.exists():
            plain.symlink_to(versioned.name)
    (dest / "lib64").symlink_to("lib")
    return dest


def nccl_home(site: Path, env: dict[str, str]) -> tuple[Path | None, str]:
    """(folder with include/nccl.h and lib/libnccl.so*, why not) for HOROVOD_NCCL_HOME or pip's nvidia-nccl."""
    cand = Path(env["HOROVOD_NCCL_HOME"]) if env.get("HOROVOD_NCCL_HOME") else site / "nvidia" / "nccl"
    if not (cand / "include" / "nccl.h").is_file():
        return None, f"no include/nccl.h in {cand} (set HOROVOD_NCCL_HOME, or pip install nvidia-nccl-cu<N>)"
    if not list((cand / "lib").glob("libnccl.so*")):
        return None, f"no lib/libnccl.so* in {cand}"
    return cand, ""


def plan(*, site: Path, cuda: str, env: dict[str, str], assemble_dir: Path | None) -> dict[str, str]:
    """What the build uses: CUDA_SOURCE (system/pip/missing), CUDA_HOME, NCCL_HOME, PIP_TOOLKIT (what to install)."""
    out = {"CUDA_SOURCE": "missing", "CUDA_HOME": "", "CUDA_NAMED_BY": "", "NCCL_HOME": "", "NCCL_MISSING": ""}
    found = system_toolkit(env)
    if found:
        out.update(CUDA_SOURCE="system", CUDA_HOME=str(found[0]), CUDA_NAMED_BY=found[1])
    else:
        parts = pip_parts(site, cuda)
        if parts:
            home = assemble(parts, assemble_dir) if assemble_dir else parts[0]
            out.update(CUDA_SOURCE="pip", CUDA_HOME=str(home), CUDA_NAMED_BY=" ".join(str(p) for p in parts))
    out["PIP_TOOLKIT"] = " ".join(pip_packages(cuda)) if out["CUDA_SOURCE"] == "missing" else ""
    home, why = nccl_home(site, env)
    out["NCCL_HOME"], out["NCCL_MISSING"] = (str(home) if home else ""), why
    return out


def pins(requirements: list[str]) -> list[str]:
    """Each requirement ('psutil>=5.9') as name==the installed version; a requirement not installed is an error."""
    out = []
    for req in requirements:
        name = re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0]
        try:
            out.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            raise SystemExit(f"horovod_toolkit: {name} is not installed; install it before pinning it") from None
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["pins"]:
        print(" ".join(pins(argv[1:])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["plan", "pins"])
    ap.add_argument("--site", type=Path, required=True, help="site-packages of the Python Horovod is built for")
    ap.add_argument("--cuda", required=True, help="torch.version.cuda, e.g. 13.0")
    ap.add_argument("--assemble", type=Path, help="build a linked toolkit prefix here when pip's wheels are used")
    a = ap.parse_args(argv)
    if not a.cuda or a.cuda == "None" or "." not in a.cuda:
        print(f"horovod_toolkit: --cuda {a.cuda!r}: expected torch's CUDA version such as 13.0", file=sys.stderr)
        return 2
    for key, value in plan(site=a.site, cuda=a.cuda, env=dict(os.environ), assemble_dir=a.assemble).items():
        print(f"{key}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
