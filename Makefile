# One entry point: `make demo`, `make test`, `make bench`, `make lint`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# pip's `stashpoint` wrapper starts Python with `site`; this puts the site-less launcher in its
# place (a served command starts ~3 ms sooner; see src/stashpoint/watchd/launcher.py).
# A script it does not recognise is left as it is (pip's wrapper works, only starts slower).
LAUNCHER := $(PY) -I -m stashpoint.watchd.launcher $(VENV)/bin/stashpoint \
	|| echo "note: $(VENV)/bin/stashpoint kept as pip wrote it"

.PHONY: demo test test-slow lint bench setup clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m compileall -q src/stashpoint  # editable installs ship no bytecode: CLI start-up
	$(LAUNCHER)
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/stashpoint demo

# Tests run on every core (pytest-xdist): most of their time is spent waiting on
# subprocesses, fsync and the database servers, not on one CPU.
test: $(STAMP)
	@missing=""; command -v chromium >/dev/null || missing="$$missing chromium"; \
	  command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || missing="$$missing pgbouncer"; \
	  [ -z "$$missing" ] || echo "note: the browser and PgBouncer tests are skipped without:$$missing (apt-get install$$missing; .ci/run does this)"
	$(PY) -m pytest -n auto -m "not slow"

# The kill -9 and chaos harnesses (tests marked slow): CI runs them after `make test`.
test-slow: $(STAMP)
	$(PY) -m pytest -n auto -m slow

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples tools
	$(VENV)/bin/ruff format --check src tests bench examples tools
	$(VENV)/bin/mypy --strict src/stashpoint
	$(VENV)/bin/lint-imports

$(VENV)/.bench-installed: $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(LAUNCHER)
	touch $@

bench: $(VENV)/.bench-installed
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
