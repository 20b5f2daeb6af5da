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
