# kvmatrix: every target sets up .venv on first use (torch's CPU build first, then the project).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvmatrix-installed
REPORT_DIR ?= reports/out
PYTEST_WORKERS ?= auto

.PHONY: matrix test bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e .
	touch $(STAMP)

matrix: $(STAMP)
	$(PY) -m harness run --matrix smoke --report-dir $(REPORT_DIR)

test: $(STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS)

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(REPORT_DIR) .pytest_cache .hypothesis
