"""Root conftest: shared fixtures. The kvmatrix plugin itself loads through its pytest11 entry point."""
from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

from fixtures.workloads import Workload, load_workload
from harness.sut.reference.engine import build_engine_config
from reference_impl.engine.llm_engine import Engine

# `harness run` in tests runs its cells one after another: pytest -n already fills the cores. The tests
# of `-j` pass it explicitly.
os.environ.setdefault("KVMATRIX_JOBS", "1")
# A llama-server a test starts runs one thread (LLAMA_ARG_THREADS is its -t): make test runs its llama.cpp group beside
# the vLLM group and the reference tests on 2 cores, where a 2-thread server waits at every op's barrier for a thread
# that has no core (SmolLM2 Q4_1, measured beside a vLLM run: 330-560 ms a decoded token on 2 threads, 22 on one).
# ggml-cpu splits a matmul between threads by output rows, never a row's sum, so the tokens do not depend on it.
os.environ.setdefault("LLAMA_ARG_THREADS", "1")


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> None:
    """Tiny tensors: one intra-op thread is faster and keeps xdist workers off each other's cores."""
    torch.set_num_threads(1)


@pytest.fixture
def make_engine():
    """Build an Engine from factor levels (defaults for the rest), sized for a workload."""

    def make(
        workload: Workload | str = "system_prompt",
        faults: frozenset[str] = frozenset(),
        overrides: dict[str, object] | None = None,
        **levels: object,
    ) -> Engine:
        wl = load_workload(workload) if isinstance(workload, str) else workload
        return Engine(replace(build_engine_config(levels, wl, faults), **(overrides or {})))

    return make
