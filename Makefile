# Self-documenting Makefile: `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
REQ_HASH := $(shell cat requirements.txt | sha1sum | cut -c1-12)
STAMP := $(VENV)/.installed-$(REQ_HASH)
DEV_STAMP := $(VENV)/.dev-installed-$(REQ_HASH)
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help venv jars native run test test-fast lint fmt bench clean system-deps

help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}'

$(STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	@rm -f $(VENV)/.installed-*
	@touch $@

venv: $(STAMP) ## Create .venv and install pinned requirements (idempotent)

system-deps: ## Install the Debian packages the integration tests use, when missing
	@bash scripts/system-deps.sh

jars: ## Fetch Apache Kafka (the embedded broker) and Spark's Kafka connector from Maven; compile Spark's local file system (idempotent)
	@bash scripts/fetch-jars.sh kafka spark-kafka
	@if [ -x $(PY) ]; then $(PY) -m jobs.local_fs; fi

native: $(DEV_STAMP) ## Compile the evaluator's hot path with mypyc (idempotent; plain Python without a C compiler)
	$(PY) -m app native build

run: venv jars native ## Start the whole system on this machine (Ctrl-C stops it; a second run resumes)
	$(PY) -m app run $(RUN_ARGS)

# pytest's exit code 5 is "no test selected": PYTEST_ARGS may name tests of one kind only
test: venv system-deps jars ## Lint and type-check, then the whole suite (slow tests included) on the compiled hot path, then the rule tests on plain Python
	@$(MAKE) --no-print-directory -j2 lint native  # side by side: mypy and mypyc have caches of their own
	$(PY) -m app native status
	$(PY) -m pytest -n 2 -q -m "not slow" $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(PY) -m pytest -n 2 -q -m slow --durations=40 $(PYTEST_ARGS) || [ $$? -eq 5 ]
	APP_NATIVE=0 $(PY) -m pytest -n 2 -q -m "not slow" tests/rules tests/conformance

test-fast: $(DEV_STAMP) jars ## Run only the fast unit tests (two processes)
	$(PY) -m pytest -n 2 -m "not slow" $(PYTEST_ARGS)

$(DEV_STAMP): requirements-dev.txt $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	@rm -f $(VENV)/.dev-installed-*
	@touch $@

lint: $(DEV_STAMP) ## Ruff lint and format check, mypy, and the import contracts (the core is import-pure)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

fmt: $(DEV_STAMP) ## Apply ruff format and safe fixes
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: venv jars native ## Run the benchmarks in bench/ (the evaluator compiled) and print their figures
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean: ## Remove local state (.data: broker log, alert store, dispatcher, progress) and caches; keep .venv and .cache/jars
	@if [ -e .data/run.lock ] && command -v flock >/dev/null && ! flock -n .data/run.lock true; then \
		echo "make clean: a make run is using .data (its lock, .data/run.lock, is held): stop it first" >&2; exit 1; fi
	rm -rf .data .pytest_cache .ruff_cache .mypy_cache build
