# The two commands: `make demo` and `make test`. Both set everything up from scratch.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test lint typecheck pytest stubs-check redis-server bench soak clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "typedq needs Python 3.11+"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

# Tests spawn their own redis-server on a free port (and make TLS certificates with openssl);
# this only makes sure the binaries exist.
redis-server:
	@command -v redis-server >/dev/null 2>&1 && command -v openssl >/dev/null 2>&1 || { \
	  echo "installing redis-server and openssl (Debian packages)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq redis-server openssl >/dev/null; }

## Run the quickstart end to end on the embedded broker (no server needed).
demo: $(STAMP)
	TYPEDQ_BROKER= $(BIN)/python examples/quickstart.py

lint: $(STAMP)
	$(BIN)/ruff check typedq examples stubs tests bench
	$(BIN)/ruff format --check typedq examples stubs tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

## Generated producer stubs match their apps (each file's header names its app).
stubs-check: $(STAMP)
	$(BIN)/python -m typedq stubs --check $(filter-out stubs/__init__.py,$(wildcard stubs/*.py))

pytest: $(STAMP) redis-server
	$(BIN)/pytest -q

## Everything CI checks: lint, mypy --strict, the whole test suite.
test: lint typecheck stubs-check pytest

## While developing: lint, mypy --strict, and the tests not marked slow (process-level fault
## tests, network faults, shutdown with lease waits). `make test` still runs everything.
.PHONY: test-fast
test-fast: lint typecheck redis-server
	$(BIN)/pytest -q -m "not slow"

## Soak (not part of `make test`): 100,000 jobs over ~10 minutes under mixed faults (SIGKILL,
## Redis restart on AOF, CLIENT KILL, proxy blackholes), then the history checker.
## A short run: make soak SOAK_ARGS="--jobs 5000 --minutes 1 --seed 7"
SOAK_ARGS ?=
soak: $(STAMP) redis-server
	$(BIN)/python -m bench.soak $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache
