# kvmatrix: every target sets up .venv on first use (torch's CPU build first, then the project).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvmatrix-installed
REPORT_DIR ?= reports/out
PYTEST_WORKERS ?= auto

.PHONY: matrix test bench mutation gpu-wheels clean

# NIXL (pd = nixl) goes in without its dependencies: its plain requirement pulls a CUDA torch and
# seventeen CUDA wheels; UCX ships inside nixl-cu12, which also runs on CPU memory. Mooncake's
# non-CUDA wheel (pd = mooncake) needs Debian's libibverbs1 at run time (.ci/run installs it).
NIXL := nixl==1.5.1 nixl-cu12==1.5.1
MOONCAKE := mooncake-transfer-engine-non-cuda==0.3.13.post1

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e .
	$(PY) -m pip install --quiet --no-deps $(NIXL)
	$(PY) -m pip install --quiet $(MOONCAKE)
	touch $(STAMP)

matrix: $(STAMP)
	$(PY) -m harness run --matrix smoke --report-dir $(REPORT_DIR)

# the whole suite, every test (`-m "not slow"` by hand skips the whole-matrix runs while iterating)
test: $(STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS)

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

# mutation score of reference_impl's pd, cache, memory, spec and engine (not CI: ~40 min on 2 cores at 12 a group; BENCHMARKS.md)
MUTANTS_PER_GROUP ?= 12
mutation: $(STAMP)
	$(PY) -m pip install --quiet cosmic-ray==8.7.0
	$(PY) benchmarks/mutation.py run --per-group $(MUTANTS_PER_GROUP) --out $(REPORT_DIR)/mutation

# wheels scripts/gpu-check installs on a GPU machine that lacks them (Python 3.12, x86-64)
gpu-wheels:
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl jinja2==3.1.6 markupsafe==3.0.3

clean:
	rm -rf $(REPORT_DIR) .pytest_cache .hypothesis
