# Entry points. Every target installs what it needs into .venv first (Python 3.11).

# Values are text, never make code. make expands '$' in a variable given on its command line (and in one it takes
# from the environment under its own name, such as SAMPLE) whenever it reads or exports it, even under `make -n`:
# '$(shell CMD)' would run CMD and '$x' would vanish. Nothing in a Makefile can quote that, so such values are
# refused here, before anything is expanded. A value that needs '$' goes in the environment as DAWNBENCH_<NAME>
# (read with $(value), passed as text). `make 'VAR:=...'` and `make 'VAR!=...'` are expanded or run by make itself
# while it reads its command line, before this file: never use them with a value from elsewhere (docs/security.md).
# The plain names make takes from the environment: every `NAME ?=` of this file (read from it, so a new one is
# guarded without a list to keep), and PY.
USER_VARS := $(shell sed -n 's/^\([A-Z][A-Z0-9_]*\) *?=.*/\1/p' $(firstword $(MAKEFILE_LIST))) PY
ENV_ROUTE := HOSTS DATA GPUS PORT TRANSPORT IFACE OVERRIDES LAUNCH_ARGS CUDA CONFIG
dollar_fix = $(if $(filter $(1),$(ENV_ROUTE)),export DAWNBENCH_$(1)=... instead,$(if $(filter DAWNBENCH_%,$(1)),export $(1)=... instead of giving it on the command line,give it without '$$'))
$(foreach v,$(.VARIABLES),$(if $(and $(filter command line,$(origin $(v))),$(findstring $$,$(value $(v)))),\
  $(error $(v): a value with '$$' on the make command line is expanded by make (a $$(shell ...) in it would run); \
  $(call dollar_fix,$(v)))))
$(foreach v,$(USER_VARS),$(if $(and $(filter environment%,$(origin $(v))),$(findstring $$,$(value $(v)))),\
  $(error $(v): a value with '$$' in the environment is expanded by make; unset $(v), or set it without '$$')))
# The names pasted into a command as they are (a path in front of /bin/python, the interpreter that makes the venv,
# and the $(shell cat $(VENV)/.installed) below, which runs even under `make -n`): a given value must be a path of
# safe characters (letters, digits, / . _ - +), so that ';', '&', '|', a backtick, a quote, a blank or a newline
# never reaches a shell. Checked on $(value) before anything expands; the defaults are the Makefile's own.
PATH_VARS := VENV PY PYTHON_SYS
SAFE_CHARS := a b c d e f g h i j k l m n o p q r s t u v w x y z A B C D E F G H I J K L M N O P Q R S T U V W X Y Z \
  0 1 2 3 4 5 6 7 8 9 / . _ - +
unsafe = $(if $(2),$(call unsafe,$(subst $(firstword $(2)),,$(1)),$(wordlist 2,99,$(2))),$(1))
empty :=
blank := $(empty) $(empty)
tab := $(empty)	$(empty)
define newline


endef
not_a_path = $(or $(call unsafe,$(1),$(SAFE_CHARS)),$(findstring $(blank),$(1)),$(findstring $(tab),$(1)),\
  $(findstring $(newline),$(1)),$(if $(1),,empty))
$(foreach v,$(PATH_VARS),$(if $(filter command line environment%,$(origin $(v))),$(if $(call not_a_path,$(value $(v))),\
  $(error $(v)='$(subst $(newline),\n,$(value $(v)))': expected a path of letters, digits and / . _ - + (it is pasted \
  into shell commands as it is); use a path without blanks or shell characters))))
PYTHON_SYS ?= $(shell command -v python3.11 || command -v python3)
VENV       ?= .venv
PY         := $(VENV)/bin/python
NPROC      ?= 2
SAMPLE     ?= data/sample
RUN_DIR    ?= runs/quickstart-$(shell date +%Y%m%d-%H%M%S)
PYTEST_ARGS ?=
TEST_WORKERS ?= 2
# $(call q,TEXT): TEXT as one single-quoted shell word, so that a value with spaces, ';', '$' or quotes is passed
# as it is and never run (make DATA='x;touch y' reads a folder named "x;touch y").
q = '$(subst ','\'',$(1))'
# $(call qw,WORDS): each whitespace-separated word quoted on its own (a list of paths such as RUNS).
qw = $(foreach w,$(1),$(call q,$(w)))

.PHONY: install horovod wheelhouse sample quickstart test test-fast bench lint format clean

# CUDA=cu130 (default): torch's CUDA 13 builds from the package index, for Turing (T4) and newer GPUs with a CUDA 13
# driver; on a machine without a GPU they run on the CPU. CUDA=cu126: the CUDA 12.6 builds of the same versions
# (requirements-cu126.txt), for Volta (V100) and older drivers. From the command line or DAWNBENCH_CUDA.
CUDA = $(or $(value DAWNBENCH_CUDA),cu130)
# Blanks around the name are dropped (' cu130 ', a tab, a trailing newline from a file: unstripped, it named no REQS_
# list and pip installed no torch), then the name is compared exactly with the list: 'cu130 ;touch x' or
# 'cu126 cu130' holds a valid word, and is refused all the same.
CUDA_GIVEN := $(CUDA)
override CUDA := $(strip $(CUDA_GIVEN))
ifneq (x$(words $(CUDA))x$(CUDA)x,x1x$(filter cu130 cu126,$(CUDA))x)
$(error CUDA=$(subst $(newline),\n,$(CUDA_GIVEN)): expected cu130 (the default: CUDA 13, Turing and newer) or cu126 (CUDA 12.6: Volta/V100 and older drivers), exactly one word)
endif
# WHEELHOUSE=folder (or DAWNBENCH_WHEELHOUSE): install from a folder that `make wheelhouse` filled, with no package
# index at all (HPC nodes, GPU machines lent for checks). The folder is made for one CUDA variant (its cuda-variant.txt).
WHEELHOUSE = $(value DAWNBENCH_WHEELHOUSE)
PIP_OFFLINE = $(if $(WHEELHOUSE),--no-index --find-links $(call q,$(WHEELHOUSE)))
PIP_INSTALL = $(PY) -m pip install -q --disable-pip-version-check $(PIP_OFFLINE)
REQS_cu130 = -r requirements.txt
REQS_cu126 = -r requirements-cu126.txt -r $(VENV)/requirements-common.txt
# The installed variant is written in the stamp: asking for the other one makes a new venv from nothing (pip
# would leave the other variant's DALI and nvidia-* wheels beside the new ones; Horovod is rebuilt too).
INSTALLED_CUDA := $(shell cat $(VENV)/.installed 2>/dev/null)
SWITCHING := $(filter-out $(CUDA),$(or $(INSTALLED_CUDA),$(CUDA)))
.PHONY: FORCE

$(VENV)/.installed: requirements.txt requirements-dev.txt requirements-cu126.txt $(if $(SWITCHING),FORCE)
	$(if $(PIP_OFFLINE),@grep -sqx $(call q,$(CUDA)) $(call q,$(WHEELHOUSE)/cuda-variant.txt) || { echo WHEELHOUSE=$(call q,$(WHEELHOUSE))": \
		no wheels for CUDA=$(CUDA) there (its cuda-variant.txt: $$(cat $(call q,$(WHEELHOUSE)/cuda-variant.txt) 2>/dev/null || echo missing)); \
		fill it with make wheelhouse CUDA=$(CUDA)" >&2; exit 2; })
	$(if $(SWITCHING),rm -rf $(call q,$(VENV)))
	rm -f $@
	test -x $(PY) || $(PYTHON_SYS) -m venv $(VENV)
	grep -v -E '^(torch|torchvision|nvidia-dali-cuda130)==' requirements.txt > $(VENV)/requirements-common.txt
	$(PIP_INSTALL) $(REQS_$(CUDA)) -r requirements-dev.txt > $(VENV)/pip-install.log 2>&1; rc=$$?; \
		grep -v "is ignored: it is neither" $(VENV)/pip-install.log; exit $$rc
	$(PY) -m pip check --disable-pip-version-check
	$(PY) scripts/check_install.py $(REQS_$(CUDA)) -r requirements-dev.txt
	echo $(call q,$(CUDA)) > $@

install: $(VENV)/.installed

# Horovod 0.28.1 (the baseline allreduce backend), built once per venv with the C++20 patch; exit code 3 from the
# script means the machine cannot build it at all (no cmake/compiler): the horovod tests then skip, saying why.
# With WHEELHOUSE, the wheel `make wheelhouse` built is installed instead (no compiler needed).
$(VENV)/.horovod: scripts/install_horovod.sh $(VENV)/.installed
	PY=$(PY) $(if $(PIP_OFFLINE),WHEELHOUSE=$(call q,$(WHEELHOUSE))) bash scripts/install_horovod.sh || [ $$? -eq 3 ]
	touch $@

horovod: $(VENV)/.horovod

# Every wheel `make install` and `make horovod` install, for CUDA=$(CUDA) and this machine's Python, into
# WHEELHOUSE=folder: torch, torchvision, DALI and the rest as pip resolves them (sdists built into wheels), the test
# tools, and Horovod built once with NCCL operations (HOROVOD_NCCL=0: Gloo only), from pip's CUDA wheels where no
# toolkit is installed. Copy the folder to the nodes, then `make install horovod WHEELHOUSE=folder` there.
HOROVOD_NCCL ?= 1
wheelhouse: PIP_OFFLINE =
wheelhouse: install
	@test -n $(call q,$(WHEELHOUSE)) || { echo "make wheelhouse: give WHEELHOUSE=folder (where the wheels go)" >&2; exit 2; }
	mkdir -p $(call q,$(WHEELHOUSE))
	$(PY) -m pip wheel -q --disable-pip-version-check -w $(call q,$(WHEELHOUSE)) $(REQS_$(CUDA)) -r requirements-dev.txt
	PY=$(PY) bash scripts/install_horovod.sh --wheel-dir $(call q,$(WHEELHOUSE)) $(if $(filter 0,$(HOROVOD_NCCL)),--cpu,--nccl)
	echo $(call q,$(CUDA)) > $(call q,$(WHEELHOUSE)/cuda-variant.txt)
	@echo "make wheelhouse: $$(ls $(call q,$(WHEELHOUSE)) | grep -c '\.whl$$') wheels for CUDA=$(CUDA) in "$(call q,$(WHEELHOUSE))

# (Not a file target: a make target cannot hold a path with spaces.)
sample: install
	@test $(call q,$(SAMPLE)/sample.json) -nt data/make_sample.py || \
		$(PY) data/make_sample.py --out $(call q,$(SAMPLE)) --odd

# Train on the sample data with 2 CPU processes (torchrun, gloo, DDP), then evaluate the checkpoint.
quickstart: sample
	$(VENV)/bin/torchrun --standalone --nproc-per-node $(call q,$(NPROC)) train.py -c configs/quickstart.yaml \
		--run-dir $(call q,$(RUN_DIR)) $(call q,data.root=$(SAMPLE))
	$(PY) evaluate.py $(call q,$(RUN_DIR)/checkpoint.pt) --data $(call q,$(SAMPLE)) --out $(call q,$(RUN_DIR)/eval.json)

# Lint first (a lint failure fails CI before the long run), then the suite in TEST_WORKERS processes (pytest-xdist;
# each test file goes whole to the next free worker, in the suite's order, so the files of runs that take minutes
# start first and a module's runs made once for its tests are made once), with the 25 slowest
# tests listed at the end of the log, so a test that grows is seen where CI's time goes. A hung test fails by name
# after pyproject.toml's per-test timeout instead of running into CI's limit. TEST_WORKERS=0: one process.
PYTEST_RUN = PYTEST_ADDOPTS=$(call q,$(PYTEST_ARGS)) $(PY) -m pytest -q -n $(call q,$(TEST_WORKERS)) --dist loadfile \
  --no-loadscope-reorder --durations=25
test: install horovod lint
	$(PYTEST_RUN) tests

test-fast: install horovod lint
	$(PYTEST_RUN) -m "not slow" tests

bench: install
	$(PY) -m scripts.bench.bench --out bench_report.md

# Every GPU path in one command on one machine (docs/gpu.md): exit 0 with one line where there is no GPU, exit 1
# with one line where torch cannot use the GPU there is; else the table, gpu_check.json and gpu_profile.json. It builds
# Horovod with NCCL first where the machine can (scripts/install_horovod.sh, as `make horovod` does).
# GPU_CHECK_WORK=folder keeps the sample, run directories and logs (each run in a new folder inside it).
GPU_CHECK_OUT ?= gpu_check.json
GPU_CHECK_WORK ?=
.PHONY: gpu-check
gpu-check: install
	$(PY) -m scripts.gpu_check.gpu_check --out $(call q,$(GPU_CHECK_OUT)) $(if $(GPU_CHECK_WORK),--work $(call q,$(GPU_CHECK_WORK)))

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

# Only what the Makefile makes with its defaults: the run folders, the default sample, pytest's cache. A SAMPLE given
# elsewhere is the user's to remove (an inherited SAMPLE=/data/mine once made `make clean` delete that folder).
clean:
	rm -rf runs data/sample .pytest_cache

# --- Reproduce the record on a cluster (scripts/launch.py; docs/reproduce.md) -------------------
# HOSTS=hostfile ("host [slots=N] [addr=IP]" per line; omit inside a SLURM allocation), DATA=ImageNet root,
# GPUS=processes per host (default: hostfile slots, else the config's 8), PORT=rendezvous port, RUN_DIR=run directory
# (a rerun into the same one resumes from its checkpoint), OVERRIDES='key=value ...' (split before each key=, so a
# value may hold spaces: 'data.roots={160: /data/imagenet-160} phases.0.root=160'), TRANSPORT=ssh|slurm|local,
# IFACE=network interface, LAUNCH_ARGS=any other scripts/launch.py options (e.g. --dry-run; split by launch.py as a
# shell would split them, quotes included, but never run by a shell), CONFIG=another config than the target's record
# config (a preset: CONFIG=configs/presets/a100_4x8.yaml; the run directory is then runs/<its name>-<backend>).
# LAUNCH_ARGS=--dry-run prints the per-host commands and builds nothing (no Horovod build).
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
CONFIG      = $(value DAWNBENCH_CONFIG)
# $(call cfg,RECORD): CONFIG when given, else the target's record config; $(call cfg_name,RECORD): its file name
# without .yaml, which names the run directory (a preset never trains into, nor resumes, the record's directory).
cfg = $(or $(CONFIG),$(1))
cfg_name = $(basename $(notdir $(call cfg,$(1))))
DRY_RUN = $(filter --dry-run --plan,$(LAUNCH_ARGS))
# The make command that resumes a run (the launcher's "next:" line and the workers' preemption line name it).
RERUN_MAKE = $(strip make $@$(foreach v,HOSTS DATA CONFIG RUN_DIR GPUS OVERRIDES,$(if $(filter command line,$(origin $(v))), $(v)=$(call q,$(value $(v))))))
LAUNCH = DAWNBENCH_RERUN=$(call q,$(RERUN_MAKE)) $(PY) scripts/launch.py --python $(PY) --port $(call q,$(PORT)) $(if $(GPUS),--gpus-per-host $(call q,$(GPUS))) \
	$(if $(TRANSPORT),--transport $(call q,$(TRANSPORT))) $(if $(IFACE),--iface $(call q,$(IFACE))) \
	$(if $(LAUNCH_ARGS),--args-text $(call q,$(LAUNCH_ARGS))) $(if $(OVERRIDES),--overrides-text $(call q,$(OVERRIDES)))
DATA_ARG = $(if $(DATA),$(call q,data.root=$(DATA)))
HOSTFILE_ARG = $(if $(HOSTS),--hostfile $(call q,$(HOSTS)))

.PHONY: reproduce-158s reproduce-8gpu baseline-horovod baseline-ddp-flows compare probe-network

# 16 machines x 8 GPUs: one torchrun agent per host, c10d rendezvous on the first, NCCL, multistream + auto-tuning.
reproduce-158s: RUN_DIR = runs/$(call cfg_name,configs/dawnbench_158s.yaml)-multistream
reproduce-158s: install
	$(LAUNCH) $(HOSTFILE_ARG) --run-dir $(call q,$(RUN_DIR)) -c $(call q,$(call cfg,configs/dawnbench_158s.yaml)) $(DATA_ARG) \
		comm.backend=multistream comm.autotune=true

# One machine with 8 GPUs, with the allreduce backend the config chooses (HOSTS may name one remote machine).
reproduce-8gpu: RUN_DIR = runs/$(call cfg_name,configs/dawnbench_8gpu.yaml)
reproduce-8gpu: install
	$(LAUNCH) $(if $(HOSTS),$(HOSTFILE_ARG),--hosts localhost $(if $(TRANSPORT),,--transport local)) \
		--run-dir $(call q,$(RUN_DIR)) -c $(call q,$(call cfg,configs/dawnbench_8gpu.yaml)) $(DATA_ARG)

# The same 158 s recipe with Horovod's allreduce under horovodrun --gloo, into its own run directory.
baseline-horovod: RUN_DIR = runs/$(call cfg_name,configs/dawnbench_158s.yaml)-horovod
baseline-horovod: install
	$(if $(DRY_RUN),@echo "dry run: Horovod is not built",PY=$(PY) bash scripts/install_horovod.sh)
	$(LAUNCH) --engine horovod $(HOSTFILE_ARG) --run-dir $(call q,$(RUN_DIR)) -c $(call q,$(call cfg,configs/dawnbench_158s.yaml)) \
		$(DATA_ARG) comm.backend=horovod

# The strongest plain-DDP baseline: the same recipe on DDP with NCCL's multi-flow sockets (NCCL_PRESET=aws-ena
# is NCCL's own choice on AWS; base/registry.py NCCL_PRESETS lists the others).
NCCL_PRESET ?= flows-16-ch4
baseline-ddp-flows: RUN_DIR = runs/$(call cfg_name,configs/dawnbench_158s.yaml)-ddp-flows
baseline-ddp-flows: install
	$(LAUNCH) $(HOSTFILE_ARG) --run-dir $(call q,$(RUN_DIR)) -c $(call q,$(call cfg,configs/dawnbench_158s.yaml)) $(DATA_ARG) \
		comm.backend=ddp $(call q,comm.nccl_preset=$(NCCL_PRESET))

# Every host pair's bandwidth (1 and N flows) and latency through gloo, into <RUN_DIR>/network.json; no training.
probe-network: RUN_DIR = runs/$(call cfg_name,configs/dawnbench_158s.yaml)-multistream
probe-network: install
	$(LAUNCH) $(HOSTFILE_ARG) --run-dir $(call q,$(RUN_DIR)) -c $(call q,$(call cfg,configs/dawnbench_158s.yaml)) --probe-network

# Side-by-side table and plot of the runs above (the multi-flow DDP run as a third column when it exists; RUNS= to
# compare others), written to COMPARE_OUT.png and COMPARE_OUT.md.
RUN_BASE = runs/$(call cfg_name,configs/dawnbench_158s.yaml)
RUNS ?= $(RUN_BASE)-multistream $(wildcard $(RUN_BASE)-ddp-flows) $(RUN_BASE)-horovod
COMPARE_OUT ?= runs/compare
compare: install
	$(PY) scripts/compare_runs.py $(call qw,$(RUNS)) --plot $(call q,$(COMPARE_OUT).png) \
		--markdown $(call q,$(COMPARE_OUT).md)
