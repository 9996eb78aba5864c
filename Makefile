# The two commands: `make demo` and `make test`. Both set everything up from scratch.
#
# PYTHON  the interpreter of .venv (the demo, ruff, mypy, the stubs check, `make pytest`).
# PYTHONS the interpreters `make test` runs the pytest suite on, one after another, each in its
#         own .venv-X.Y (PYTHON's version in .venv): a version (found in pyenv, then as
#         pythonX.Y on PATH) or an interpreter's name or path. One not installed is skipped
#         with a banner naming it (at least one must run), unless REQUIRE_PYTHONS names it.
#         One interpreter only: make test PYTHONS=python3
# REQUIRE_PYTHONS the entries of PYTHONS that must be installed: CI sets all three
#         (.ci/run), so a green CI means every supported Python passed.
# PYTEST_ARGS passed to pytest, e.g. make test PYTEST_ARGS="-x tests/process/test_cli.py"
# PYTEST_IGNORE test directories `make pytest` leaves out; `make test` sets it to ONCE_TIER on
#         every interpreter after the first.
# PYTEST_JOBS pytest-xdist processes for `make pytest` / `make test` / `make test-fast` (each
#         with its own redis-server); PYTEST_JOBS=0 runs the suite in one process.
PYTHON  ?= python3
PYTHONS ?= 3.11 3.12 3.13
REQUIRE_PYTHONS ?=
PYENV_ROOT ?= $(HOME)/.pyenv
PYTEST_ARGS ?=
# Four, on two cores too: most of the suite's time is spent waiting (leases, grace periods,
# worker processes, faults), and four processes overlap more of those waits than two (on a
# 2-core box, tests/redis + tests/process took 129 s with -n 4, 136 s with -n 3, 189 s with
# -n 2: means of 2-3 interleaved runs, all green; issue 25). Each test file stays in one
# process (--dist loadfile), so a file's session set-up runs once (--dist loadgroup, which
# spreads a file's tests, was slower: 150 s with -n 3 or 4), but for the long files whose
# tests are units of their own, handed out longest first (tests/xdist_units.py).
PYTEST_JOBS ?= 4
PYTEST_XDIST = $(if $(filter 0,$(PYTEST_JOBS)),,-n $(PYTEST_JOBS) --dist loadfile)
# The tiers of tests that do not depend on the interpreter running the suite: tests/tooling
# (docs, packaging, typing with mypy and basedpyright, the stubs, the dashboard in a browser,
# the benchmarks' smoke tests) and tests/model (seeded programs holding Redis and Cluster to
# the embedded broker's rules: the brokers' agreement, which the interpreter does not change).
# `make test` runs them on the first interpreter only, the other tiers (tests/unit, contract,
# redis, cluster, process) on each.
ONCE_TIER := tests/tooling tests/model
PYTEST_IGNORE ?=
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test lint typecheck pytest pytest-all check-python stubs-check redis-server chromium bench soak clean

# One line instead of pip's "requires a different Python" (or a bare AssertionError).
CHECK_PYTHON = v=$$($(PYTHON) -V 2>&1) || v="not found"; \
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "typedq needs Python 3.11+; set PYTHON=/path/to/python3.11 or newer (PYTHON=$(PYTHON): $$v)" >&2; \
	  exit 1; }

## Fails with one line when $(PYTHON) is older than 3.11 (or missing).
check-python:
	@$(CHECK_PYTHON)

$(STAMP): pyproject.toml
	@$(CHECK_PYTHON)
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

# The dashboard's browser tests drive Debian's chromium (headless) with Playwright; they fail,
# never skip, without it. Playwright never downloads a browser of its own here.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing chromium (Debian package) for the dashboard's browser tests"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium >/dev/null; }

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

## The whole pytest suite on $(PYTHON), in .venv. The slowest tests are listed at the end
## (--durations): where the suite's time goes, for whoever shortens the loop next.
pytest: $(STAMP) redis-server chromium
	$(BIN)/pytest -q --durations=25 $(PYTEST_XDIST) $(addprefix --ignore=,$(PYTEST_IGNORE)) $(PYTEST_ARGS)

## The pytest suite on every interpreter in PYTHONS, one after another (2 cores: three
## suites at once would only slow each other and stretch their timing margins), each in its own
## .venv-X.Y except PYTHON's version, which reuses .venv: the whole suite on the first
## interpreter found, all but ONCE_TIER on the others. An interpreter that is not installed
## is skipped with a banner naming it, unless it is in REQUIRE_PYTHONS (then it fails the
## target, after the others ran); at least one interpreter must run. Times include set-up.
pytest-all: redis-server chromium
	@ran=; failed=; skipped=; missing=; ignore=; first=; \
	own=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || own=; \
	for want in $(PYTHONS); do \
	  case $$want in \
	    [0-9]*) py=$$(ls -d $(PYENV_ROOT)/versions/$$want.*/bin/python$$want 2>/dev/null \
	                 | grep -E "/$$want\.[0-9]+/bin/" | sort -V | tail -n 1); \
	            [ -n "$$py" ] || py=$$(command -v python$$want 2>/dev/null) || py=;; \
	    *) py=$$(command -v $$want 2>/dev/null) || py=;; \
	  esac; \
	  if [ -z "$$py" ] || ! $$py -c '' 2>/dev/null; then \
	    case " $(REQUIRE_PYTHONS) " in \
	      *" $$want "*) echo "!!!!! MISSING: Python $$want is required (REQUIRE_PYTHONS) but not found" \
	                         "(pyenv, PATH)" >&2; missing="$$missing $$want";; \
	      *) echo "===== skipped: no Python $$want found (pyenv, PATH); pytest does not run on it" >&2; \
	         skipped="$$skipped $$want";; \
	    esac; continue; \
	  fi; \
	  ver=$$($$py -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	  venv=.venv-$$ver; [ "$$ver" != "$$own" ] || venv=$(VENV); \
	  echo "===== pytest on Python $$ver ($$py), in $$venv$${ignore:+, without $$ignore (run on $$first)}"; \
	  start=$$(date +%s); \
	  if $(MAKE) --no-print-directory pytest PYTHON=$$py VENV=$$venv PYTEST_IGNORE="$$ignore"; then \
	    ran="$$ran $$ver:$$(( $$(date +%s) - start ))s"; \
	  else \
	    failed="$$failed $$ver:$$(( $$(date +%s) - start ))s"; \
	  fi; \
	  [ -n "$$ignore" ] || { ignore="$(ONCE_TIER)"; first=$$ver; }; \
	done; \
	echo "===== pytest passed on:$${ran:- (none)}"; \
	[ -z "$$failed" ] || echo "!!!!! pytest FAILED on:$$failed" >&2; \
	[ -z "$$skipped" ] || echo "===== pytest skipped Python$$skipped (not installed; CI requires" \
	     "3.11, 3.12 and 3.13)" >&2; \
	[ -z "$$missing" ] || echo "!!!!! pytest NOT RUN on required Python$$missing (not installed):" \
	     "install it (pyenv install X.Y) or drop it from REQUIRE_PYTHONS" >&2; \
	[ -n "$$ran$$failed" ] || echo "!!!!! no interpreter of PYTHONS ($(PYTHONS)) was found" >&2; \
	[ -z "$$failed" ] && [ -z "$$missing" ] && [ -n "$$ran" ]

## Everything CI checks: lint, mypy --strict and the stubs once (on $(PYTHON)), then the whole
## test suite on every interpreter in PYTHONS (3.11, 3.12, 3.13).
test: lint typecheck stubs-check pytest-all

## While developing: lint, mypy --strict, and the tests not marked slow (process-level fault
## tests, network faults, shutdown with lease waits). `make test` still runs everything.
.PHONY: test-fast
test-fast: lint typecheck redis-server chromium
	$(BIN)/pytest -q $(PYTEST_XDIST) -m "not slow"

## The fast loop: the unit tier alone (in process, on the embedded broker; no redis-server, no
## subprocess). `make test` still runs everything.
.PHONY: test-unit
test-unit: $(STAMP)
	$(BIN)/pytest -q -p no:xdist tests/unit $(PYTEST_ARGS)

## Soak (not part of `make test`): 100,000 jobs over ~10 minutes under mixed faults (SIGKILL,
## Redis restart on AOF, CLIENT KILL, proxy blackholes), then the history checker.
## A short run: make soak SOAK_ARGS="--jobs 5000 --minutes 1 --seed 7"
SOAK_ARGS ?=
soak: $(STAMP) redis-server
	$(BIN)/python -m bench.soak $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .venv-3.* .mypy_cache .ruff_cache
