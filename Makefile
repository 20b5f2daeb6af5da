# Entry points. Every target installs what it needs into .venv first (Python 3.11).
PYTHON_SYS ?= $(shell command -v python3.11 || command -v python3)
VENV       ?= .venv
PY         := $(VENV)/bin/python
NPROC      ?= 2
SAMPLE     ?= data/sample
RUN_DIR    ?= runs/quickstart-$(shell date +%Y%m%d-%H%M%S)
PYTEST_ARGS ?=
# $(call q,TEXT): TEXT as one single-quoted shell word, so that a value with spaces, ';', '$' or quotes is passed
# as it is and never run (make DATA='x;touch y' reads a folder named "x;touch y").
q = '$(subst ','\'',$(1))'
# $(call qw,WORDS): each whitespace-separated word quoted on its own (a list of paths such as RUNS).
qw = $(foreach w,$(1),$(call q,$(w)))

.PHONY: install horovod sample quickstart test test-fast bench lint format clean

# CUDA=cu130 (default): torch's CUDA 13 builds from the package index, for Turing (T4) and newer GPUs with a CUDA 13
# driver; on a machine without a GPU they run on the CPU. CUDA=cu126: the CUDA 12.6 builds of the same versions
# (requirements-cu126.txt), for Volta (V100) and older drivers. From the command line or DAWNBENCH_CUDA.
CUDA = $(or $(value DAWNBENCH_CUDA),cu130)
ifeq ($(filter $(CUDA),cu130 cu126),)
$(error CUDA=$(CUDA): expected cu130 (the default: CUDA 13, Turing and newer) or cu126 (CUDA 12.6: Volta/V100 and older drivers))
endif
PIP_INSTALL = $(PY) -m pip install -q --disable-pip-version-check
REQS_cu130 = -r requirements.txt
REQS_cu126 = -r requirements-cu126.txt -r $(VENV)/requirements-common.txt
# The installed variant is written in the stamp: asking for the other one reinstalls.
INSTALLED_CUDA := $(shell cat $(VENV)/.installed 2>/dev/null)
.PHONY: FORCE

$(VENV)/.installed: requirements.txt requirements-dev.txt requirements-cu126.txt $(if $(filter-out $(CUDA),$(or $(INSTALLED_CUDA),cu130)),FORCE)
	test -x $(PY) || $(PYTHON_SYS) -m venv $(VENV)
	grep -v -E '^(torch|torchvision|nvidia-dali-cuda130)==' requirements.txt > $(VENV)/requirements-common.txt
	$(PIP_INSTALL) $(REQS_$(CUDA)) -r requirements-dev.txt 2>&1 | grep -v "is ignored: it is neither" || true
	$(PY) -c "import torch, torchvision, timm, yaml, tensorboard"
	echo $(CUDA) > $@

install: $(VENV)/.installed

# Horovod 0.28.1 (the baseline allreduce backend), built once per venv with the C++20 patch; exit code 3 from the
# script means the machine cannot build it at all (no cmake/compiler): the horovod tests then skip, saying why.
$(VENV)/.horovod: scripts/install_horovod.sh $(VENV)/.installed
	PY=$(PY) bash scripts/install_horovod.sh || [ $$? -eq 3 ]
	touch $@

horovod: $(VENV)/.horovod

# (Not a file target: a make target cannot hold a path with spaces.)
sample: install
	@test $(call q,$(SAMPLE)/sample.json) -nt data/make_sample.py || \
		$(PY) data/make_sample.py --out $(call q,$(SAMPLE)) --odd

# Train on the sample data with 2 CPU processes (torchrun, gloo, DDP), then evaluate the checkpoint.
quickstart: sample
	$(VENV)/bin/torchrun --standalone --nproc-per-node $(call q,$(NPROC)) train.py -c configs/quickstart.yaml \
		--run-dir $(call q,$(RUN_DIR)) $(call q,data.root=$(SAMPLE))
	$(PY) evaluate.py $(call q,$(RUN_DIR)/checkpoint.pt) --data $(call q,$(SAMPLE)) --out $(call q,$(RUN_DIR)/eval.json)

test: install horovod
	PYTEST_ADDOPTS=$(call q,$(PYTEST_ARGS)) $(PY) -m pytest -q tests

test-fast: install horovod
	PYTEST_ADDOPTS=$(call q,$(PYTEST_ARGS)) $(PY) -m pytest -q -m "not slow" tests

bench: install
	$(PY) scripts/bench.py --out bench_report.md

# Every GPU path in one command on one machine (docs/gpu.md); without CUDA it says so and runs nothing.
GPU_CHECK_OUT ?= gpu_check.json
.PHONY: gpu-check
gpu-check: install
	$(PY) scripts/gpu_check.py --out $(call q,$(GPU_CHECK_OUT))

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

clean:
	rm -rf runs $(call q,$(SAMPLE)) .pytest_cache

# --- Reproduce the record on a cluster (scripts/launch.py; docs/reproduce.md) -------------------
# HOSTS=hostfile ("host [slots=N] [addr=IP]" per line; omit inside a SLURM allocation), DATA=ImageNet root,
# GPUS=processes per host (default: hostfile slots, else the config's 8), PORT=rendezvous port, RUN_DIR=run directory
# (a rerun into the same one resumes from its checkpoint), OVERRIDES='key=value ...' (split before each key=, so a
# value may hold spaces: 'data.roots={160: /data/imagenet-160} phases.0.root=160'), TRANSPORT=ssh|slurm|local,
# IFACE=network interface, LAUNCH_ARGS=any other scripts/launch.py options (e.g. --dry-run; split by launch.py as a
# shell would split them, quotes included, but never run by a shell).
# Each is taken from the make command line, or from the environment as DAWNBENCH_<NAME> (DAWNBENCH_DATA=...):
# a PORT or DATA that happens to be set in the shell does not apply. Every value is passed quoted.
HOSTS       = $(value DAWNBENCH_HOSTS)
DATA        = $(value DAWNBENCH_DATA)
GPUS        = $(value DAWNBENCH_GPUS)
PORT        = $(or $(value DAWNBENCH_PORT),29400)
TRANSPORT   = $(value DAWNBENCH_TRANSPORT)
IFACE       = $(value DAWNBENCH_IFACE)
OVERRIDES   = $(value DAWNBENCH_OVERRIDES)
LAUNCH_ARGS = $(value DAWNBENCH_LAUNCH_ARGS)
LAUNCH = $(PY) scripts/launch.py --python $(PY) --port $(call q,$(PORT)) $(if $(GPUS),--gpus-per-host $(call q,$(GPUS))) \
	$(if $(TRANSPORT),--transport $(call q,$(TRANSPORT))) $(if $(IFACE),--iface $(call q,$(IFACE))) \
	$(if $(LAUNCH_ARGS),--args-text $(call q,$(LAUNCH_ARGS))) $(if $(OVERRIDES),--overrides-text $(call q,$(OVERRIDES)))
DATA_ARG = $(if $(DATA),$(call q,data.root=$(DATA)))
HOSTFILE_ARG = $(if $(HOSTS),--hostfile $(call q,$(HOSTS)))

.PHONY: reproduce-158s reproduce-8gpu baseline-horovod compare probe-network

# 16 machines x 8 GPUs: one torchrun agent per host, c10d rendezvous on the first, NCCL, multistream + auto-tuning.
reproduce-158s: RUN_DIR = runs/dawnbench_158s-multistream
reproduce-158s: install
	$(LAUNCH) $(HOSTFILE_ARG) --run-dir $(call q,$(RUN_DIR)) -c configs/dawnbench_158s.yaml $(DATA_ARG) \
		comm.backend=multistream comm.autotune=true

# One machine with 8 GPUs, with the allreduce backend the config chooses (HOSTS may name one remote machine).
reproduce-8gpu: RUN_DIR = runs/dawnbench_8gpu
reproduce-8gpu: install
	$(LAUNCH) $(if $(HOSTS),$(HOSTFILE_ARG),--hosts localhost $(if $(TRANSPORT),,--transport local)) \
		--run-dir $(call q,$(RUN_DIR)) -c configs/dawnbench_8gpu.yaml $(DATA_ARG)

# The same 158 s recipe with Horovod's allreduce under horovodrun --gloo, into its own run directory.
baseline-horovod: RUN_DIR = runs/dawnbench_158s-horovod
baseline-horovod: install
	PY=$(PY) bash scripts/install_horovod.sh
	$(LAUNCH) --engine horovod $(HOSTFILE_ARG) --run-dir $(call q,$(RUN_DIR)) -c configs/dawnbench_158s.yaml \
		$(DATA_ARG) comm.backend=horovod

# Every host pair's bandwidth (1 and N flows) and latency through gloo, into <RUN_DIR>/network.json; no training.
probe-network: RUN_DIR = runs/dawnbench_158s-multistream
probe-network: install
	$(LAUNCH) $(HOSTFILE_ARG) --run-dir $(call q,$(RUN_DIR)) -c configs/dawnbench_158s.yaml --probe-network

# Side-by-side table and plot of the two runs above (RUNS= to compare others).
RUNS ?= runs/dawnbench_158s-multistream runs/dawnbench_158s-horovod
compare: install
	$(PY) scripts/compare_runs.py $(call qw,$(RUNS)) --plot runs/compare.png --markdown runs/compare.md
