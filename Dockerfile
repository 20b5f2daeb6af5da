# The image every host of a cluster run uses: CUDA 13 (or 12.6), Python 3.11, this repository installed by the
# same `make install` that CI runs, Horovod (NCCL + Gloo) built by scripts/install_horovod.sh, and sshd for the
# launcher.
#
#   docker build -t dawnbench .                        # CUDA 13: Turing (T4) and newer GPUs, a CUDA 13 driver
#   docker build -t dawnbench --build-arg CUDA=cu126 . # CUDA 12.6: Volta (V100, the record's GPUs), older drivers
#   docs/reproduce.md says how to start it on each host and launch from one of them.
#
# The devel image brings nvcc, which Horovod's CUDA glue needs at build time; torch ships its own CUDA libraries.
# The hosts need an NVIDIA driver for the chosen CUDA and the NVIDIA container toolkit (docker run --gpus all).
# Each base sets the GPU architectures Horovod is built for: only ones its nvcc accepts (CUDA 13 dropped sm_70).
ARG CUDA=cu130

FROM nvidia/cuda:13.0.0-devel-ubuntu22.04 AS base-cu130
ENV HOROVOD_BUILD_CUDA_CC_LIST=75,80,86,89,90,100,120

FROM nvidia/cuda:12.6.3-devel-ubuntu22.04 AS base-cu126
ENV HOROVOD_BUILD_CUDA_CC_LIST=70,75,80,86,89,90

FROM base-${CUDA}
ARG CUDA
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3.11 python3.11-venv python3.11-dev make git cmake g++ \
        openssh-server openssh-client iproute2 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /run/sshd /root/.ssh \
    && printf 'Port 2222\nPermitRootLogin prohibit-password\nPasswordAuthentication no\nStrictModes no\n' \
        > /etc/ssh/sshd_config.d/dawnbench.conf

WORKDIR /workspace
# The Python environment: exactly the Makefile's install step (.venv with requirements.txt + requirements-dev.txt).
COPY Makefile requirements.txt requirements-dev.txt requirements-cu126.txt ./
COPY scripts/check_install.py scripts/
RUN make install PYTHON_SYS=python3.11 CUDA=${CUDA}

# Horovod for the baseline, built with NCCL for the base's architecture list.
COPY scripts/install_horovod.sh scripts/horovod_toolkit.py scripts/
RUN HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME=/usr/local/cuda PY=.venv/bin/python bash scripts/install_horovod.sh

COPY . .
ENV PATH=/workspace/.venv/bin:${PATH}
# Default: an interactive shell. On every host of a multi-node run: `... dawnbench /usr/sbin/sshd -D` (port 2222).
CMD ["bash"]
