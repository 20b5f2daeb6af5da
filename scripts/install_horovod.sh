#!/usr/bin/env bash
# Build and install Horovod 0.28.1 (the baseline allreduce backend) against the installed torch, and report which
# operations it built (`horovodrun --check-build`).
#
# Horovod's last release asks CMake for C++14, but torch 2.x's ATen headers need C++20, so the sdist does not
# build as released. This script fetches the sdist from the package index, sets CMAKE_CXX_STANDARD to 20 in
# CMakeLists.txt and horovod/torch/CMakeLists.txt, and builds it with Gloo (CPU collectives, `horovodrun --gloo`)
# and, when asked or on a machine with a GPU, NCCL operations. NCCL comes from the nvidia-nccl wheel that torch
# installs; the CUDA compiler and headers from a CUDA toolkit when there is one, else from pip's nvidia-cuda-nvcc,
# -runtime, -cccl (...) wheels, installed for torch's CUDA version (scripts/horovod_toolkit.py decides which). A GPU
# is not needed to build the NCCL operations, only to run them.
# The built wheel is cached (keyed by torch, Python and the GPU choice), so a second install takes seconds.
#
#   PY=.venv/bin/python scripts/install_horovod.sh   # PY defaults to .venv/bin/python
#   scripts/install_horovod.sh --nccl                # NCCL operations on any machine (or HOROVOD_WITH_NCCL=1)
#   scripts/install_horovod.sh --cpu                 # Gloo only, even where a GPU is seen (or HOROVOD_WITH_NCCL=0)
#   scripts/install_horovod.sh --plan [--nccl]       # print the toolkit and NCCL it would use; build nothing
#   scripts/install_horovod.sh --wheel-dir DIR       # also put the wheel and its dependencies in DIR (a wheelhouse)
#   WHEELHOUSE=DIR scripts/install_horovod.sh        # install the wheel found in DIR, with no package index
#   HOROVOD_CACHE_DIR=...                            # where built wheels are kept (~/.cache/dawnbench/horovod)
# Exit codes: 2 bad arguments, 3 no cmake/make/C++ compiler, 4 NCCL asked for but not found, 6 NCCL asked for with a
# torch built without CUDA, 7 no CUDA compiler after installing pip's.
set -euo pipefail

VERSION=0.28.1
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${PY:-.venv/bin/python}
plan_only=0 wheel_dir='' want=${HOROVOD_WITH_NCCL:-}
[[ ${HOROVOD_GPU_OPERATIONS:-} == NCCL ]] && want=1
while [[ $# -gt 0 ]]; do
    case $1 in
        --nccl) want=1 ;;
        --cpu) want=0 ;;
        --plan) plan_only=1 ;;
        --wheel-dir) [[ $# -ge 2 ]] || { echo "install_horovod.sh: --wheel-dir needs a folder" >&2; exit 2; }; wheel_dir=$2; shift ;;
        *) echo "install_horovod.sh: unknown argument '$1' (expected --nccl, --cpu, --plan, --wheel-dir DIR)" >&2; exit 2 ;;
    esac
    shift
done
if [[ -n $want && $want != 0 && $want != 1 ]]; then
    echo "install_horovod.sh: HOROVOD_WITH_NCCL=$want: expected 1 (build NCCL operations) or 0 (Gloo only)" >&2
    exit 2
fi
if [[ ! -x $PY ]]; then
    echo "install_horovod.sh: $PY is not an executable Python (set PY=/path/to/python)" >&2
    exit 2
fi
PIP=("$PY" -m pip --disable-pip-version-check)

report() {
    # Which operations the installed Horovod has (horovodrun --check-build lists frameworks, controllers, tensor
    # operations); the one-line summary is what scripts and the gpu-check read.
    local hvdrun
    hvdrun="$(dirname "$PY")/horovodrun"
    [[ -x $hvdrun ]] && "$hvdrun" --check-build || true
    "$PY" -c "import horovod.torch as hvd; print('install_horovod.sh: horovod', __import__('horovod').__version__, 'gloo built:', hvd.gloo_built(), 'nccl built:', hvd.nccl_built())"
}

# From a wheelhouse (make wheelhouse), on a node with no package index: install, report, done.
if [[ -n ${WHEELHOUSE:-} && $plan_only == 0 ]]; then
    wheel=$(ls "$WHEELHOUSE"/horovod-$VERSION-*.whl 2>/dev/null | head -n1 || true)
    if [[ -z $wheel ]]; then
        echo "install_horovod.sh: WHEELHOUSE=$WHEELHOUSE has no horovod-$VERSION-*.whl (build it with make wheelhouse)" >&2
        exit 2
    fi
    # --no-deps: --force-reinstall would reinstall Horovod's dependencies too, at the newest version the folder has,
    # past the pins of the venv (DALI's packaging<=...). Then only the dependencies missing are added, and pip check
    # proves every pin still holds.
    "${PIP[@]}" install -q --no-index --find-links "$WHEELHOUSE" --no-deps --force-reinstall "$wheel"
    "${PIP[@]}" install -q --no-index --find-links "$WHEELHOUSE" "$wheel"
    "${PIP[@]}" check
    report
    exit 0
fi

read -r torch_cuda torch_tag site < <("$PY" -c "import sys, sysconfig, torch; print(torch.version.cuda, f'torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}', sysconfig.get_paths()['purelib'])")
site=${HOROVOD_PIP_SITE:-$site}  # where pip's nvidia-* wheels live (another --target folder, if not the venv's)
if [[ -z $want ]]; then
    want=0
    command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && want=1
fi
if [[ $want == 1 && $torch_cuda == None ]]; then
    echo "install_horovod.sh: NCCL operations need a CUDA build of torch; this torch ($torch_tag) has none" >&2
    exit 6
fi
cache=${HOROVOD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dawnbench/horovod}
variant=cpu
[[ $want == 1 ]] && variant=nccl
toolkit_dir=$cache/cuda-$torch_cuda-toolkit
plan() {
    [[ $torch_cuda == None ]] && { CUDA_SOURCE=missing CUDA_HOME_FOUND='' NCCL_HOME='' PIP_TOOLKIT=''; return; }
    local out
    out=$("$PY" "$HERE/horovod_toolkit.py" plan --site "$site" --cuda "$torch_cuda" ${1:+--assemble "$1"})
    eval "$out"
    CUDA_HOME_FOUND=$CUDA_HOME
}
plan ""
if [[ $plan_only == 1 ]]; then
    echo "variant=$variant torch=$torch_tag cuda=$torch_cuda"
    echo "cuda_toolkit=$CUDA_SOURCE ${CUDA_HOME_FOUND:+$CUDA_HOME_FOUND (from $CUDA_NAMED_BY)}"
    [[ -n $PIP_TOOLKIT && $variant == nccl ]] && echo "would pip install: $PIP_TOOLKIT"
    echo "nccl=${NCCL_HOME:-missing: $NCCL_MISSING}"
    exit 0
fi

for tool in cmake c++ make; do
    command -v "$tool" >/dev/null || { echo "install_horovod.sh: '$tool' not found; Horovod needs cmake, make and a C++ compiler (apt-get install cmake g++ make)" >&2; exit 3; }
done

if [[ -z $wheel_dir ]] && "$PY" - "$variant" <<'PYEOF' 2>/dev/null; then
import sys
import horovod, horovod.torch as hvd  # noqa: E401  (the compiled extension loads)
assert horovod.__version__ == "0.28.1" and (sys.argv[1] == "cpu" or hvd.nccl_built())
PYEOF
    echo "install_horovod.sh: horovod $VERSION ($variant) already installed for $PY"
    report
    exit 0
fi

# Horovod's own runtime dependencies (setup.py: cloudpickle, psutil, pyyaml, packaging; cffi for its build).
HVD_DEPS=("psutil>=5.9" "cloudpickle>=2.2" "cffi>=1.15" "packaging" "pyyaml")
"${PIP[@]}" install -q "${HVD_DEPS[@]}"

if [[ $variant == nccl ]]; then
    if [[ -z $NCCL_HOME ]]; then
        echo "install_horovod.sh: NCCL operations asked for, but $NCCL_MISSING" >&2
        exit 4
    fi
    # The nvidia-nccl wheel ships libnccl.so.2 only; the build links against the plain name.
    [[ -e $NCCL_HOME/lib/libnccl.so ]] || ln -s libnccl.so.2 "$NCCL_HOME/lib/libnccl.so"
    export HOROVOD_NCCL_HOME=$NCCL_HOME HOROVOD_NCCL_LINK=SHARED HOROVOD_GPU_OPERATIONS=NCCL
    if [[ $CUDA_SOURCE == missing ]]; then
        echo "install_horovod.sh: no CUDA toolkit; installing pip's: $PIP_TOOLKIT"
        # shellcheck disable=SC2086  # a list of requirement strings without spaces
        "${PIP[@]}" install -q $PIP_TOOLKIT
        plan ""
        [[ $CUDA_SOURCE == missing ]] && { echo "install_horovod.sh: pip's CUDA wheels installed, but no nvcc/cuda_runtime.h under $site/nvidia" >&2; exit 7; }
    fi
fi
# A CUDA build of torch makes Horovod compile its CUDA glue, so the CPU variant uses a toolkit too where one is found.
if [[ $CUDA_SOURCE == pip ]]; then
    plan "$toolkit_dir"  # a linked prefix laid out as a toolkit (lib/libcudart.so, include/ in one place)
    # nvcc reads its include path from its own folder; CUDA 12's wheels keep cuda_runtime.h in another one.
    export NVCC_PREPEND_FLAGS="-I$CUDA_HOME_FOUND/include ${NVCC_PREPEND_FLAGS:-}"
    export HOROVOD_CUDA_INCLUDE=$CUDA_HOME_FOUND/include HOROVOD_CUDA_LIB=$CUDA_HOME_FOUND/lib
fi
if [[ $CUDA_SOURCE != missing ]]; then
    # torch's cpp_extension derives its CUDA library folder from CUDA_HOME; without it, an nvcc on PATH outside the
    # toolkit (e.g. /usr/local/bin/nvcc) makes it look for libcudart in the wrong place.
    export HOROVOD_CUDA_HOME=$CUDA_HOME_FOUND CUDA_HOME=$CUDA_HOME_FOUND
    if [[ -z ${HOROVOD_BUILD_CUDA_CC_LIST:-} ]]; then
        # Horovod's few CUDA kernels are compiled for every architecture nvcc knows unless told; build for this
        # machine's GPUs only. Without a GPU: Volta (the record's V100), Ampere and Hopper.
        cc=$("$PY" -c "import torch; print(','.join(sorted({'%d%d' % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})))" 2>/dev/null || true)
        default_cc=70,80,90
        [[ ${torch_cuda%%.*} -ge 13 ]] && default_cc=75,80,90  # CUDA 13 dropped Volta
        export HOROVOD_BUILD_CUDA_CC_LIST=${cc:-$default_cc}
    fi
fi

mkdir -p "$cache/$torch_tag-$variant"
wheel=$(ls "$cache/$torch_tag-$variant"/horovod-$VERSION-*.whl 2>/dev/null | head -n1 || true)

if [[ -z $wheel ]]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "${PIP[@]}" download -q --no-binary :all: --no-deps "horovod==$VERSION" -d "$work"
    tar -xzf "$work/horovod-$VERSION.tar.gz" -C "$work"
    src=$work/horovod-$VERSION
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 20)/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    grep -q 'set(CMAKE_CXX_STANDARD 20)' "$src/horovod/torch/CMakeLists.txt" || { echo "install_horovod.sh: patch did not apply" >&2; exit 5; }
    echo "install_horovod.sh: building horovod $VERSION ($variant, Gloo, C++20, CUDA toolkit: $CUDA_SOURCE) for $torch_tag; this takes several minutes"
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
        HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j${HOROVOD_BUILD_JOBS:-$(nproc)}" \
        "${PIP[@]}" wheel -q --no-build-isolation --no-deps -w "$work/dist" "$src"
    cp "$work"/dist/horovod-$VERSION-*.whl "$cache/$torch_tag-$variant/"
    wheel=$(ls "$cache/$torch_tag-$variant"/horovod-$VERSION-*.whl | head -n1)
fi

"${PIP[@]}" install -q --no-deps --force-reinstall "$wheel"
"${PIP[@]}" check
if [[ -n $wheel_dir ]]; then
    mkdir -p "$wheel_dir"
    cp "$wheel" "$wheel_dir/"
    # shellcheck disable=SC2046  # name==version words without spaces
    "${PIP[@]}" wheel -q -w "$wheel_dir" $("$PY" "$HERE/horovod_toolkit.py" pins "${HVD_DEPS[@]}")
    echo "install_horovod.sh: $(basename "$wheel") ($variant) and its dependencies are in $wheel_dir"
fi
report
