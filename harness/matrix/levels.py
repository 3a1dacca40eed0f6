"""The engines a matrix can put under test, as a matrix sees them: their factors, the one defaults table of
each, the golden levels derived from it, and the levels a device refuses.

A matrix file names its engine in ``[matrix] engine`` (default ``reference``). The golden cell is the
engine's defaults, except for the factors that say *what* is compared rather than *how* it is served
(``kept_from_cell``): a cell of the hybrid model is judged against the hybrid model's golden run, a cell
drafting 5 tokens against golden levels drafting 5. One table per engine, so a golden cell can never
drift from the levels the cells it judges leave out.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from reference_impl import registry


class LevelError(ValueError):
    """A level its engine does not take, or one the cell's device refuses; the message says why in one line."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A level the engine cannot run on a kind of device: refused when the matrix is loaded, never run."""

    device: str                        # "cpu" or "cuda": the device kind it applies to
    factor: str
    refuses: Callable[[object], bool]  # level → refused
    reason: str


@dataclass(frozen=True, slots=True)
class EngineLevels:
    """One engine's factors: their defaults (the golden levels but ``kept_from_cell``), checks and refusals."""

    name: str
    defaults: Mapping[str, object]
    kept_from_cell: frozenset[str]
    factors: tuple[str, ...]
    check: Callable[[str, object], None]  # raises LevelError for a level the factor does not take
    refusals: tuple[Refusal, ...] = ()
    golden: Mapping[str, object] = field(init=False)

    def __post_init__(self) -> None:
        golden = {factor: level for factor, level in self.defaults.items() if factor not in self.kept_from_cell}
        object.__setattr__(self, "golden", MappingProxyType(golden))

    def full(self, levels: Mapping[str, object]) -> dict[str, object]:
        """The full level assignment: defaults overridden by ``levels``."""
        return {**self.defaults, **levels}

    def refused(self, device: str, factor: str, level: object) -> str | None:
        """Why ``device`` (``cpu``, ``cuda:1`` …) cannot run ``factor = level`` on this engine; None when it can."""
        kind = device.split(":", 1)[0]
        return next((r.reason for r in self.refusals if r.device == kind and r.factor == factor and r.refuses(level)),
                    None)


def _check_reference(factor: str, level: object) -> None:
    try:
        registry.check_level(factor, level)
    except registry.UnknownLevelError as exc:
        raise LevelError(str(exc)) from exc


REFERENCE = EngineLevels(
    name="reference",
    defaults=MappingProxyType({
        "model": "dense", "scheduler": "fcfs", "cache": "off", "pool": "static", "backend": "torch",
        "page_size": 1, "prefill_budget": 128, "deterministic": "on", "poison": "off", "spec": "none",
        "num_draft_tokens": 3, "store": "file", "pd": "off", "pd_staging": "off", "decode_tp": 1,
        "pd_fail_rate": 0.0,
    }),
    kept_from_cell=frozenset({"model", "num_draft_tokens", "store"}),
    factors=tuple(registry.known_factors()),
    check=_check_reference,
)

#: vLLM's factors: level names as ours where the meaning is the same (what each maps to: harness.sut.vllm).
VLLM_CHOICES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "cache": ("off", "device"),
    "spec": ("none", "ngram", "draft", "eagle", "self"),
    "scheduler": ("fcfs", "priority"),
    "async_scheduling": ("off", "on"),
    "kv_cache_dtype": ("auto", "fp8"),
    "dtype": ("float32", "bfloat16"),
    "deterministic": ("off", "on"),
})
VLLM_COUNTS = ("page_size", "prefill_budget", "max_num_seqs", "num_draft_tokens")
#: the models made here; any other level is a path to a Hugging Face checkpoint directory.
MADE_MODELS = ("dense", "hybrid")
#: made model → the reference model level that computes the same function (the cross_engine oracle's other side):
#: DENSE at head_dim 32, named by import path (a level of its own would join every fault matrix's model levels).
CROSS_MODELS: Mapping[str, str] = MappingProxyType({"dense": "reference_impl.config:DENSE32"})


def _check_vllm(factor: str, level: object) -> None:
    _check_vllm_like(factor, level, VLLM_CHOICES, VLLM_COUNTS)


def _check_vllm_like(factor: str, level: object, choices: Mapping[str, tuple[str, ...]], counts: tuple[str, ...]) -> None:
    """A real engine's level: one of its choices, a positive count, or a model made here (or a checkpoint path)."""
    if factor in choices:
        if level not in choices[factor]:
            raise LevelError(f"level {level!r} of {factor!r} is not one of {', '.join(choices[factor])}")
    elif factor in counts:
        if not isinstance(level, int) or isinstance(level, bool) or level <= 0:
            raise LevelError(f"level {level!r} of {factor!r} must be a positive int")
    elif factor == "model":
        if not isinstance(level, str) or (level not in MADE_MODELS and not (Path(level) / "config.json").is_file()):
            raise LevelError(f"model {level!r} is neither one made here ({', '.join(MADE_MODELS)}) nor a Hugging Face "
                             f"checkpoint directory (no config.json there)")
    else:
        raise KeyError(factor)


VLLM = EngineLevels(
    name="vllm",
    defaults=MappingProxyType({
        "model": "dense", "cache": "off", "page_size": 32, "prefill_budget": 2048, "max_num_seqs": 8,
        "spec": "none", "num_draft_tokens": 3, "scheduler": "fcfs", "async_scheduling": "off",
        "kv_cache_dtype": "auto", "dtype": "float32", "deterministic": "off",
    }),
    kept_from_cell=frozenset({"model", "num_draft_tokens"}),
    factors=tuple(sorted([*VLLM_CHOICES, *VLLM_COUNTS, "model"])),
    check=_check_vllm,
    refusals=(
        Refusal("cpu", "page_size", lambda level: isinstance(level, int) and level % 32 != 0,
                "vLLM's CPU attention backend takes block sizes that are multiples of 32 (16 is refused)"),
        Refusal("cpu", "deterministic", lambda level: level == "on",
                "batch invariance (VLLM_BATCH_INVARIANT) needs a CUDA device"),
    ),
)

#: an OpenAI-compatible (or llama.cpp, SGLang) server's factors the oracles read; the file may add its own,
#: which mean nothing to the harness but what ``[server.levels]`` makes of them (harness.matrix.server).
OPENAI_CHOICES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "cache": ("off", "device", "host"),
    "spec": ("none", "ngram", "draft", "eagle", "self", "mtp"),
    "dtype": ("float32", "bfloat16", "float16"),
    "deterministic": ("off", "on"),
})
OPENAI_COUNTS = ("page_size", "num_draft_tokens")
_FACTOR_NAME = re.compile(r"[a-z][a-z0-9_]*")


def _check_openai(factor: str, level: object) -> None:
    if factor in OPENAI_CHOICES or factor in OPENAI_COUNTS or factor == "model":
        _check_vllm_like(factor, level, OPENAI_CHOICES, OPENAI_COUNTS)
    elif not _FACTOR_NAME.fullmatch(factor):
        raise LevelError(f"factor name {factor!r} must be lower-case letters, digits and '_' (it shows in cell ids)")
    elif not isinstance(level, (str, int, float, bool)):
        raise LevelError(f"level {level!r} of {factor!r} must be a string, number or boolean")


OPENAI = EngineLevels(
    name="openai",
    defaults=MappingProxyType({
        "model": "dense", "cache": "off", "page_size": 1, "spec": "none", "num_draft_tokens": 3,
        "dtype": "float32", "deterministic": "off",
    }),
    kept_from_cell=frozenset({"model", "num_draft_tokens"}),
    factors=(),  # any: a matrix file names the server's own (harness.matrix.file)
    check=_check_openai,
)

ENGINES: Mapping[str, EngineLevels] = MappingProxyType({engine.name: engine for engine in (REFERENCE, VLLM, OPENAI)})

#: the reference engine's table, which most of the harness reads (its runner, its fault checks).
DEFAULT_LEVELS = REFERENCE.defaults
DEFAULT_GOLDEN = REFERENCE.golden


def engine_levels(levels: Mapping[str, object], engine: str = "reference") -> dict[str, object]:
    """The full level assignment of ``engine``: its defaults overridden by ``levels``."""
    return ENGINES[engine].full(levels)
