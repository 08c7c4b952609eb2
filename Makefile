# Kiln: `make demo` and `make test` work from a clean clone with only Python 3.11 installed.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

# An empty KILN_HOME= or KILN_CONFIG= counts as unset (`?=` would keep it, and DAGSTER_HOME would be /dagster).
export KILN_HOME := $(or $(KILN_HOME),$(CURDIR)/.kiln)
# The demo's config: configs/default.yaml plus its toy decontamination set (set KILN_CONFIG for your own project).
export KILN_CONFIG := $(or $(KILN_CONFIG),$(CURDIR)/configs/demo.yaml)
export DAGSTER_HOME := $(KILN_HOME)/dagster
export MLFLOW_DISABLE_TELEMETRY := true
export TORCH_EXTENSIONS_DIR := $(KILN_HOME)/torch_extensions
# DeepSpeed on CPU where no NVIDIA GPU is visible; with one, training uses the GPUs (docs/training.md#on-gpus).
ifeq ($(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu),)
export DS_ACCELERATOR ?= cpu
endif
export PYTHONUNBUFFERED := 1

.PHONY: install bytecode demo test test-slow ui mlflow bench clean homes

install: $(VENV)/.installed

# One pip command with torch==2.13.0 pinned alongside everything else, or pip pulls another torch. TORCH_INDEX: where
# that torch comes from, e.g. https://download.pytorch.org/whl/cu128 for a CUDA 12.8 build on a GPU machine.
# Bytecode is compiled after pip, on every core: pip compiles its ~30,000 files on one (97 s of a 167 s install on
# 2 cores, 63 s this way). Like pip, it skips the few files that only parse on a newer Python (torch's py312 tests).
TORCH_INDEX ?=
$(VENV)/.installed: pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-compile -c constraints.txt $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) \
	  torch==2.13.0 -e ".[test,production]"
	-@$(BIN)/python -m compileall -q -j 0 $(VENV)/lib >/dev/null 2>&1
	@touch $@

# Kiln's own modules compiled once, in under a second: where PYTHONDONTWRITEBYTECODE is set (as on the VMs here)
# each of the suite's few hundred processes compiled them again, ~25 CPU-seconds in all. Stale files only cost time.
bytecode: install
	-@$(BIN)/python -m compileall -q -j 0 kiln training_jobs assets resources orchestration tests >/dev/null 2>&1

$(DAGSTER_HOME)/dagster.yaml:
	@mkdir -p $(DAGSTER_HOME)
	@printf 'telemetry:\n  enabled: false\nnux:\n  enabled: false\nconcurrency:\n  runs:\n    max_concurrent_runs: 4\n  pools:\n    default_limit: 1\n' > $@

demo: install bytecode $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/python -m orchestration.demo

# Tests run in parallel processes, whole modules each (module fixtures are built once), the longest modules first
# (tests/conftest.py); TEST_WORKERS=0: in-process. More workers than cores is slower: the tests are CPU-bound.
# `make test` is every test but the end-to-end ones marked slow (two demos, training through Dagster, multi-process
# DeepSpeed runs, Ray clusters losing a node, the UI in Chromium): those take twice the rest's time and run in
# `make test-slow`. CI (.ci/run) runs both.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: install bytecode $(DAGSTER_HOME)/dagster.yaml
	$(PYTEST) -m "not slow"

test-slow: install bytecode $(DAGSTER_HOME)/dagster.yaml
	$(PYTEST) -m slow

UI_PORT ?= 3000

ui: install $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/python -m orchestration.ui -w workspace.yaml -h 127.0.0.1 -p $(UI_PORT)

# MLflow's job runner (nine processes for its GenAI jobs, each importing mlflow: ~45 CPU-seconds at start) serves
# nothing Kiln logs: off.
mlflow: install
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false \
	  $(BIN)/mlflow ui --backend-store-uri sqlite:///$(KILN_HOME)/mlflow.db -h 127.0.0.1 -p 5000

bench: install
	$(BIN)/python bench/curation_bench.py
	$(BIN)/python bench/engine_bench.py --corpus demo
	$(BIN)/python bench/dedup_bench.py
	$(BIN)/python bench/quality_bench.py
	$(BIN)/python bench/storage_s3_bench.py
	$(BIN)/python bench/tokenize_bench.py
	$(BIN)/python bench/train_bench.py

clean:
	rm -rf $(KILN_HOME)

homes:  # where this Makefile keeps Kiln's and Dagster's state, for a look before `make clean`
	@echo "KILN_HOME=$(KILN_HOME) DAGSTER_HOME=$(DAGSTER_HOME) KILN_CONFIG=$(KILN_CONFIG)"
