"""Factor levels → implementations: the one place that maps a matrix level to code.

A level is either a registered name (``"fcfs"``) or an import path
(``"mypkg.sched:MyQueue"``), so an engine team can plug its own component into a
matrix file without editing this package. An import-path level is checked, when it is
named, against its factor's interface (``INTERFACES``): a class lacking a member fails
then, in one line, not in the middle of a run.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Protocol


class UnknownLevelError(ValueError):
    """A factor level that is neither registered nor an importable ``module:attr`` path."""


class InterfaceMismatchError(UnknownLevelError):
    """An import-path level whose class lacks a member of its factor's interface (or a value of the wrong type)."""


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
        "host": "reference_impl.cache.host_cache:HostCache",
        "storage": "reference_impl.cache.storage_cache:StorageCache",
    },
    "store": {
        "file": "reference_impl.cache.store.backends:FileStore",
        "redis": "reference_impl.cache.store.backends:RedisStore",
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
        "off": "reference_impl.pd.base:NO_DISAGGREGATION",
        "inproc": "reference_impl.pd.inproc.conn:InprocTransport",
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

#: factor → "module:attribute" of what its implementation must be: a Protocol a class offers, or a type.
INTERFACES: dict[str, str] = {
    "model": "reference_impl.config:ModelConfig",
    "scheduler": "reference_impl.engine.queue:SchedulerQueue",
    "cache": "reference_impl.cache.prefix_cache:PrefixCache",
    "store": "reference_impl.cache.store.base:Store",
    "pool": "reference_impl.memory.pool:Pool",
    "backend": "reference_impl.attention.backend:AttentionBackend",
    "pd": "reference_impl.pd.base:Transport",
    "spec": "reference_impl.spec.proposer:Proposer",
}
#: dunder methods an interface may require (every other underscore name is the Protocol machinery's).
_DUNDER_MEMBERS = frozenset({"__len__"})

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


def protocol_members(protocol: type) -> list[str]:
    """What a class must define to offer ``protocol``: its ClassVars, methods and properties (instance data is unchecked)."""
    own = vars(protocol)
    class_vars = [name for name, hint in own.get("__annotations__", {}).items() if "ClassVar" in str(hint)]
    methods = [
        name for name, value in own.items()
        if (inspect.isfunction(value) or isinstance(value, property)) and (not name.startswith("_") or name in _DUNDER_MEMBERS)
    ]
    return class_vars + methods


def check_interface(factor: str, level: str, impl: object) -> None:
    """Raise ``InterfaceMismatchError`` unless ``impl`` (what ``level`` names) offers ``factor``'s interface."""
    interface = import_path(INTERFACES[factor])
    name = getattr(impl, "__name__", type(impl).__name__)
    if Protocol not in interface.__mro__:  # a value of a type (model: a ModelConfig)
        if not isinstance(impl, interface):
            raise InterfaceMismatchError(f"{factor} level {level!r}: {name} is not a {interface.__name__}")
        return
    if not inspect.isclass(impl):
        raise InterfaceMismatchError(f"{factor} level {level!r}: {name} is not a class (it must offer {interface.__name__})")
    missing = [member for member in protocol_members(interface) if not hasattr(impl, member)]
    if missing:
        what = "member" if len(missing) == 1 else "members"
        raise InterfaceMismatchError(f"{factor} level {level!r}: class {name} lacks {what} "
                                     f"{', '.join(repr(m) for m in missing)} of {interface.__name__}")


def check_level(factor: str, level: object) -> None:
    """Raise ``UnknownLevelError`` (or ``KeyError`` for the factor) unless ``level`` is valid.

    An import-path level is imported and checked against its factor's interface here.
    """
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
    if level not in COMPONENTS[factor]:
        check_interface(factor, level, import_path(level))


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
