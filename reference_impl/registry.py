"""Factor levels → implementations: the one place that maps a matrix level to code.

A level is either a registered name (``"fcfs"``) or an import path
(``"mypkg.sched:MyQueue"``), so an engine team can plug its own component into a
matrix file without editing this package.
"""
from __future__ import annotations

import importlib
from typing import Any


class UnknownLevelError(ValueError):
    """A factor level that is neither registered nor an importable ``module:attr`` path."""


#: factor → level → "module:attribute" of the implementation.
COMPONENTS: dict[str, dict[str, str]] = {
    "model": {
        "dense": "reference_impl.config:DENSE",
        "hybrid": "reference_impl.config:HYBRID",
    },
    "scheduler": {
        "fcfs": "reference_impl.engine.scheduler:FcfsQueue",
        "priority": "reference_impl.engine.scheduler:PriorityQueue",
    },
    "cache": {
        "off": "reference_impl.cache.radix:NoCache",
        "device": "reference_impl.cache.radix:RadixCache",
        "host": "reference_impl.cache.tiered:HostCache",
        "storage": "reference_impl.cache.storage:StorageCache",
    },
    "store": {
        "file": "reference_impl.cache.stores:FileStore",
        "redis": "reference_impl.cache.stores:RedisStore",
    },
    "pool": {
        "static": "reference_impl.memory.static:StaticPools",
        "unified": "reference_impl.memory.unified:UnifiedPool",
    },
    "backend": {
        "torch": "reference_impl.attention.torch_backend:TorchBackend",
        "triton": "reference_impl.attention.triton_backend:TritonBackend",
    },
    "pd": {
        "off": "reference_impl.pd.transport:NO_DISAGGREGATION",
        "inproc": "reference_impl.pd.transport:InprocTransport",
        "nixl": "reference_impl.pd.nixl.conn:NixlTransport",
        "mooncake": "reference_impl.pd.mooncake.conn:MooncakeTransport",
    },
    "spec": {
        "none": "reference_impl.spec.ngram:NoProposer",
        "ngram": "reference_impl.spec.ngram:NgramProposer",
        "draft": "reference_impl.spec.draft:DraftProposer",
        "mtp": "reference_impl.spec.mtp:MtpProposer",
    },
}

#: factors that switch an engine behaviour on or off.
SWITCH_FACTORS: dict[str, dict[str, bool]] = {
    "deterministic": {"off": False, "on": True},
    "poison": {"off": False, "on": True},
    "pd_staging": {"off": False, "on": True},
}

#: factors whose levels are plain values, with the type each level must have.
VALUE_FACTORS: dict[str, type] = {
    "page_size": int,       # tokens per KV page (vLLM block_size)
    "prefill_budget": int,  # tokens per chunked-prefill step (vLLM max_num_batched_tokens)
    "num_draft_tokens": int,  # draft tokens per speculative verify step (vLLM num_speculative_tokens)
    "decode_tp": int,       # PD: attention-TP shards of the decode side (KV heads split over them)
}

#: factors whose levels are probabilities: a number in [0, 1).
PROBABILITY_FACTORS: frozenset[str] = frozenset({"pd_fail_rate"})  # PD: chance a chunk is lost in transport


def known_factors() -> list[str]:
    """Every factor a matrix file may name, in a stable order."""
    return sorted([*COMPONENTS, *VALUE_FACTORS, *SWITCH_FACTORS, *PROBABILITY_FACTORS])


def import_path(path: str) -> Any:
    """Import ``"pkg.module:attr"`` and return the attribute."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise UnknownLevelError(f"{path!r} is not of the form 'pkg.module:attr'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownLevelError(f"cannot import module {module_name!r} for {path!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise UnknownLevelError(f"module {module_name!r} has no attribute {attr!r}") from exc


def check_level(factor: str, level: object) -> None:
    """Raise ``UnknownLevelError`` (or ``KeyError`` for the factor) unless ``level`` is valid."""
    if factor in VALUE_FACTORS:
        kind = VALUE_FACTORS[factor]
        if not isinstance(level, kind) or isinstance(level, bool) or (kind is int and level <= 0):
            raise UnknownLevelError(f"level {level!r} of {factor!r} must be a positive {kind.__name__}")
        return
    if factor in PROBABILITY_FACTORS:
        if not isinstance(level, (int, float)) or isinstance(level, bool) or not 0 <= level < 1:
            raise UnknownLevelError(f"level {level!r} of {factor!r} must be a probability in [0, 1)")
        return
    if factor in SWITCH_FACTORS:
        if level not in SWITCH_FACTORS[factor]:
            raise UnknownLevelError(f"level {level!r} of {factor!r} must be one of: off, on")
        return
    if factor not in COMPONENTS:
        raise KeyError(factor)
    if not isinstance(level, str):
        raise UnknownLevelError(f"level {level!r} of {factor!r} must be a string")
    if level not in COMPONENTS[factor] and ":" not in level:
        known = ", ".join(sorted(COMPONENTS[factor]))
        raise UnknownLevelError(f"unknown level {level!r} of {factor!r} (known: {known}, or 'pkg.module:Class')")


def resolve(factor: str, level: object) -> Any:
    """The implementation behind ``factor=level`` (a value factor's level as is, a switch as a bool)."""
    check_level(factor, level)
    if factor in VALUE_FACTORS:
        return level
    if factor in PROBABILITY_FACTORS:
        return float(level)
    if factor in SWITCH_FACTORS:
        return SWITCH_FACTORS[factor][level]
    assert isinstance(level, str)
    return import_path(COMPONENTS[factor].get(level, level))
