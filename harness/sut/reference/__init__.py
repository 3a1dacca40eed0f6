"""The reference data plane under test (``engine = "reference"``, the default): every factor of its registry.

It runs in the cell's own process (its PD children aside), so cells fill the cores side by side and faults
can be planted in it (``reference_impl.faults``).
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from harness.sut.base import CellEngine, Engine
from harness.sut.levels import EngineLevels, LevelError
from reference_impl import registry

if TYPE_CHECKING:
    from fixtures.workloads.boundary import Seams


def _check(factor: str, level: object) -> None:
    try:
        registry.check_level(factor, level)
    except registry.UnknownLevelError as exc:
        raise LevelError(str(exc)) from exc


def _describe(factor: str) -> str:
    if factor in registry.COMPONENTS:
        names = ", ".join(f"`{level}`" for level in registry.COMPONENTS[factor])
        interface = registry.INTERFACES[factor].rpartition(":")[2]
        return f"{names}, or {'an' if interface[0] in 'AEIOU' else 'a'} `{interface}` by import path"
    if factor in registry.VALUE_FACTORS:
        return f"a positive {registry.VALUE_FACTORS[factor].__name__}"
    if factor in registry.SWITCH_FACTORS:
        return ", ".join(f"`{level}`" for level in registry.SWITCH_FACTORS[factor])
    return "a probability in [0, 1)"


LEVELS = EngineLevels(
    name="reference",
    defaults=MappingProxyType({
        "model": "dense", "scheduler": "fcfs", "cache": "off", "pool": "static", "backend": "torch",
        "page_size": 1, "prefill_budget": 128, "deterministic": "on", "poison": "off", "spec": "none",
        "num_draft_tokens": 3, "store": "file", "pd": "off", "pd_staging": "off", "decode_tp": 1,
        "pd_fail_rate": 0.0,
    }),
    kept_from_cell=frozenset({"model", "num_draft_tokens", "store"}),
    factors=tuple(registry.known_factors()),
    check=_check,
    describe=_describe,
)


#: a model made here for the real engines (harness.models.checkpoints) → the reference model level that computes the same
#: function: DENSE at head_dim 32, named by import path (a level of its own would join every fault matrix's models);
#: a trained model's checkpoint read into the reference (``harness.sut.reference.trained``).
MADE_MODEL_LEVELS: Mapping[str, str] = MappingProxyType({"dense": "reference_impl.config:DENSE32",
                                                         "smollm2": "harness.sut.reference.trained:SMOLLM2"})
#: golden levels a made model's cross golden changes: SmolLM2 (30 layers, vocab 49,152) takes a minute or more a pass
#: with the batch-invariant kernels, seconds without (BENCHMARKS.md, "SmolLM2"); cross_engine is tie-aware either way
MADE_MODEL_GOLDEN: Mapping[str, Mapping[str, object]] = MappingProxyType({"smollm2": {"deterministic": "off"}})


def _computes(made_model: str) -> dict[str, object] | None:
    """The reference's golden levels computing a model made here for the real engines (the cross_engine oracle's
    reference for their cells); None for one it does not compute."""
    model = MADE_MODEL_LEVELS.get(made_model)
    return {**LEVELS.golden, "model": model, **MADE_MODEL_GOLDEN.get(made_model, {})} if model else None


def _seams(levels: Mapping[str, object], engine_args: Mapping[str, object]) -> Seams:
    """A reference cell's seams: its page size and prefill budget, its proposer's draft tokens, its model's vocabulary;
    the reference's models (RoPE, no learned positions) take any length, so the family's cap alone bounds a draw."""
    from fixtures.workloads.boundary import Seams

    full = LEVELS.full(levels)
    k = int(full["num_draft_tokens"]) if full["spec"] != "none" else 0
    vocab = registry.resolve("model", full["model"]).vocab_size
    return Seams(page=int(full["page_size"]), budget=int(full["prefill_budget"]), k=k, context=None, vocab=vocab)


def _open(levels: Mapping[str, object], faults: frozenset[str], device: str,
          engine_args: Mapping[str, object]) -> CellEngine:
    from harness.sut.reference.engine import ReferenceEngine

    return ReferenceEngine(levels, faults, device)


ENGINE = Engine(levels=LEVELS, open=_open, in_process=True, seams=_seams, computes=_computes,
                writers=MappingProxyType({"reference": "harness.sut.reference.script:WRITER"}))
