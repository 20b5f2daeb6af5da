#!/usr/bin/env bash
# Build and install Horovod 0.28.1 (the baseline allreduce backend) against the installed torch.
#
# Horovod's last release asks CMake for C++14, but torch 2.x's ATen headers need C++20, so the sdist does not
# build as released. This script fetches the sdist from the package index, sets CMAKE_CXX_STANDARD to 20 in
# CMakeLists.txt and horovod/torch/CMakeLists.txt, and builds it with Gloo (CPU collectives, `horovodrun --gloo`)
# and, on a machine with a GPU, NCCL (from the nvidia-nccl wheel that torch already installed).
# The built wheel is cached (keyed by torch, Python and the GPU choice), so a second install takes seconds.
#
#   PY=.venv/bin/python scripts/install_horovod.sh        # PY defaults to .venv/bin/python
#   HOROVOD_GPU_OPERATIONS=NCCL scripts/install_horovod.sh # force the NCCL build (default: only if a GPU is seen)
#   HOROVOD_CACHE_DIR=...                                  # where built wheels are kept (~/.cache/dawnbench)
set -euo pipefail

VERSION=0.28.1
PY=${PY:-.venv/bin/python}
if [[ ! -x $PY ]]; then
    echo "install_horovod.sh: $PY is not an executable Python (set PY=/path/to/python)" >&2
    exit 2
fi
for tool in cmake c++ make; do
    command -v "$tool" >/dev/null || { echo "install_horovod.sh: '$tool' not found; Horovod needs cmake, make and a C++ compiler (apt-get install cmake g++ make)" >&2; exit 3; }
done

if "$PY" - <<'PYEOF' 2>/dev/null; then
import horovod, horovod.torch  # noqa: F401  (the compiled extension loads)
assert horovod.__version__ == "0.28.1"
PYEOF
    echo "install_horovod.sh: horovod $VERSION already installed for $PY"
    exit 0
fi

# Horovod's own runtime dependencies (setup.py: cloudpickle, psutil, pyyaml, packaging; cffi for its build).
"$PY" -m pip install -q --disable-pip-version-check "psutil>=5.9" "cloudpickle>=2.2" "cffi>=1.15" "packaging" "pyyaml"

torch_tag=$("$PY" -c "import sys, torch; print(f'torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}')")
site=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")

if [[ -z ${HOROVOD_GPU_OPERATIONS:-} ]] && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    export HOROVOD_GPU_OPERATIONS=NCCL
fi
variant=cpu
if [[ ${HOROVOD_GPU_OPERATIONS:-} == NCCL ]]; then
    variant=nccl
    # NCCL from the nvidia-nccl-cu* wheel that torch depends on; it ships libnccl.so.2 only, so add the link name.
    nccl_home=${HOROVOD_NCCL_HOME:-$site/nvidia/nccl}
    if [[ ! -f $nccl_home/include/nccl.h ]]; then
        echo "install_horovod.sh: no NCCL at $nccl_home (set HOROVOD_NCCL_HOME to a folder with include/nccl.h)" >&2
        exit 4
    fi
    [[ -e $nccl_home/lib/libnccl.so ]] || ln -s libnccl.so.2 "$nccl_home/lib/libnccl.so"
    export HOROVOD_NCCL_HOME=$nccl_home HOROVOD_NCCL_LINK=SHARED
fi

# A CUDA build of torch makes Horovod compile its CUDA glue, so it needs a CUDA toolkit even on a CPU machine.
if [[ -z ${HOROVOD_CUDA_HOME:-} ]]; then
    for cand in "${CUDA_HOME:-}" /usr/local/cuda; do
        if [[ -n $cand && -x $cand/bin/nvcc ]]; then export HOROVOD_CUDA_HOME=$cand; break; fi
    done
fi
if [[ -n ${HOROVOD_CUDA_HOME:-} ]]; then
    # torch's cpp_extension derives its CUDA library folder from CUDA_HOME; without it, an nvcc on PATH outside the
    # toolkit (e.g. /usr/local/bin/nvcc) makes it look for libcudart in the wrong place.
    export CUDA_HOME=$HOROVOD_CUDA_HOME
    if [[ -z ${HOROVOD_BUILD_CUDA_CC_LIST:-} ]]; then
        # Horovod's few CUDA kernels are compiled for every architecture nvcc knows unless told; build for this
        # machine's GPUs only (on a CPU machine they are never run, so one architecture is enough).
        cc=$("$PY" -c "import torch; print(','.join(sorted({'%d%d' % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})))" 2>/dev/null || true)
        export HOROVOD_BUILD_CUDA_CC_LIST=${cc:-90}
    fi
fi

cache=${HOROVOD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dawnbench/horovod}
mkdir -p "$cache/$torch_tag-$variant"
wheel=$(ls "$cache/$torch_tag-$variant"/horovod-$VERSION-*.whl 2>/dev/null | head -n1 || true)

if [[ -z $wheel ]]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$PY" -m pip download -q --disable-pip-version-check --no-binary :all: --no-deps "horovod==$VERSION" -d "$work"
    tar -xzf "$work/horovod-$VERSION.tar.gz" -C "$work"
    src=$work/horovod-$VERSION
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 20)/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    grep -q 'set(CMAKE_CXX_STANDARD 20)' "$src/horovod/torch/CMakeLists.txt" || { echo "install_horovod.sh: patch did not apply" >&2; exit 5; }
    echo "install_horovod.sh: building horovod $VERSION ($variant, Gloo, C++20) for $torch_tag; this takes several minutes"
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
        HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j${HOROVOD_BUILD_JOBS:-$(nproc)}" \
        "$PY" -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps -w "$work/dist" "$src"
    cp "$work"/dist/horovod-$VERSION-*.whl "$cache/$torch_tag-$variant/"
    wheel=$(ls "$cache/$torch_tag-$variant"/horovod-$VERSION-*.whl | head -n1)
fi

"$PY" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$wheel"
"$PY" -c "import horovod.torch as hvd; print('install_horovod.sh: horovod', __import__('horovod').__version__, 'gloo built:', hvd.gloo_built(), 'nccl built:', hvd.nccl_built())"
