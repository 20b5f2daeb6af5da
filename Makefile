# Entry points. Every target installs what it needs into .venv first (Python 3.11).
PYTHON_SYS ?= $(shell command -v python3.11 || command -v python3)
VENV       ?= .venv
PY         := $(VENV)/bin/python
NPROC      ?= 2
SAMPLE     ?= data/sample
RUN_DIR    ?= runs/quickstart-$(shell date +%Y%m%d-%H%M%S)
PYTEST_ARGS ?=

.PHONY: install horovod sample quickstart test test-fast bench lint format clean

$(VENV)/.installed: requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON_SYS) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt -r requirements-dev.txt 2>&1 | grep -v "is ignored: it is neither" || true
	$(PY) -c "import torch, torchvision, timm, yaml, tensorboard"
	touch $@

install: $(VENV)/.installed

# Horovod 0.28.1 (the baseline allreduce backend), built once per venv with the C++20 patch; exit code 3 from the
# script means the machine cannot build it at all (no cmake/compiler): the horovod tests then skip, saying why.
$(VENV)/.horovod: scripts/install_horovod.sh $(VENV)/.installed
	PY=$(PY) bash scripts/install_horovod.sh || [ $$? -eq 3 ]
	touch $@

horovod: $(VENV)/.horovod

$(SAMPLE)/sample.json: data/make_sample.py
	$(PY) data/make_sample.py --out $(SAMPLE) --odd

sample: install $(SAMPLE)/sample.json

# Train on the sample data with 2 CPU processes (torchrun, gloo, DDP), then evaluate the checkpoint.
quickstart: sample
	$(VENV)/bin/torchrun --standalone --nproc-per-node $(NPROC) train.py -c configs/quickstart.yaml --run-dir $(RUN_DIR) data.root=$(SAMPLE)
	$(PY) evaluate.py $(RUN_DIR)/checkpoint.pt --data $(SAMPLE) --out $(RUN_DIR)/eval.json

test: install horovod
	$(PY) -m pytest -q $(PYTEST_ARGS) tests

test-fast: install horovod
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS) tests

bench: install
	$(PY) scripts/bench.py --out bench_report.md

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

clean:
	rm -rf runs $(SAMPLE) .pytest_cache

# --- Reproduce the record on a cluster (scripts/launch.py; docs/reproduce.md) -------------------
# HOSTS=hostfile ("host [slots=N] [addr=IP]" per line; omit inside a SLURM allocation), DATA=ImageNet root,
# GPUS=processes per host (default: hostfile slots, else the config's 8), PORT=rendezvous port, RUN_DIR=run directory
# (a rerun into the same one resumes from its checkpoint), OVERRIDES='key=value ...', TRANSPORT=ssh|slurm|local,
# IFACE=network interface, LAUNCH_ARGS=any other scripts/launch.py option (e.g. --dry-run).
HOSTS       ?=
DATA        ?=
GPUS        ?=
PORT        ?= 29400
TRANSPORT   ?=
IFACE       ?=
OVERRIDES   ?=
LAUNCH_ARGS ?=
LAUNCH = $(PY) scripts/launch.py --python $(PY) --port $(PORT) $(if $(GPUS),--gpus-per-host $(GPUS)) \
	$(if $(TRANSPORT),--transport $(TRANSPORT)) $(if $(IFACE),--iface $(IFACE)) $(LAUNCH_ARGS)
DATA_ARG = $(if $(DATA),data.root=$(DATA))

.PHONY: reproduce-158s reproduce-8gpu baseline-horovod compare

# 16 machines x 8 GPUs: one torchrun agent per host, c10d rendezvous on the first, NCCL, multistream + auto-tuning.
reproduce-158s: RUN_DIR = runs/dawnbench_158s-multistream
reproduce-158s: install
	$(LAUNCH) $(if $(HOSTS),--hostfile $(HOSTS)) --run-dir $(RUN_DIR) -c configs/dawnbench_158s.yaml $(DATA_ARG) \
		comm.backend=multistream comm.autotune=true $(OVERRIDES)

# One machine with 8 GPUs, with the allreduce backend the config chooses (HOSTS may name one remote machine).
reproduce-8gpu: RUN_DIR = runs/dawnbench_8gpu
reproduce-8gpu: install
	$(LAUNCH) $(if $(HOSTS),--hostfile $(HOSTS),--hosts localhost $(if $(TRANSPORT),,--transport local)) \
		--run-dir $(RUN_DIR) -c configs/dawnbench_8gpu.yaml $(DATA_ARG) $(OVERRIDES)

# The same 158 s recipe with Horovod's allreduce under horovodrun --gloo, into its own run directory.
baseline-horovod: RUN_DIR = runs/dawnbench_158s-horovod
baseline-horovod: install
	PY=$(PY) bash scripts/install_horovod.sh
	$(LAUNCH) --engine horovod $(if $(HOSTS),--hostfile $(HOSTS)) --run-dir $(RUN_DIR) -c configs/dawnbench_158s.yaml \
		$(DATA_ARG) comm.backend=horovod $(OVERRIDES)

# Side-by-side table and plot of the two runs above (RUNS= to compare others).
RUNS ?= runs/dawnbench_158s-multistream runs/dawnbench_158s-horovod
compare: install
	$(PY) scripts/compare_runs.py $(RUNS) --plot runs/compare.png --markdown runs/compare.md
