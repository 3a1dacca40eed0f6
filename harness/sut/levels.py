"""An engine's levels as a matrix sees them: its factors, its one defaults table, the golden levels derived from
it, the checks of a level, and the levels a device refuses.

The golden cell is the engine's defaults, except for the factors that say *what* is compared rather than
*how* it is served (``kept_from_cell``): a cell of the hybrid model is judged against the hybrid model's
golden run, a cell drafting 5 tokens against golden levels drafting 5. One table per engine (in its package),
so a golden cell can never drift from the levels the cells it judges leave out.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType


class LevelError(ValueError):
    """A level its engine does not take, or one the cell's device refuses; the message says why in one line."""


class TableError(ValueError):
    """An engine's own table in a matrix file (``[engine_args]``, ``[server]``) is invalid at ``key``; the matrix
    file's reader adds the file's name."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True, slots=True)
class Refusal:
    """A level the engine cannot run on a kind of device: refused when the matrix is loaded, never run."""

    device: str                        # "cpu" or "cuda": the device kind it applies to
    factor: str
    refuses: Callable[[object], bool]  # level → refused
    reason: str


@dataclass(frozen=True, slots=True)
class EngineLevels:
    """One engine's factors: their defaults (the golden levels but ``kept_from_cell``), checks and refusals.

    ``factors`` None: any name the matrix file gives is a factor (a server's own flags), checked by ``check``.
    """

    name: str
    defaults: Mapping[str, object]
    kept_from_cell: frozenset[str]
    factors: tuple[str, ...] | None
    check: Callable[[str, object], None]  # raises LevelError for a level the factor does not take
    describe: Callable[[str], str]         # a factor's levels as the docs read them (Markdown)
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


#: the models made here (harness.models.checkpoints); any other model level of a real engine is a checkpoint path.
MADE_MODELS = ("dense", "hybrid", "smollm2")


def served_made_model(levels: Mapping[str, object], engine_args: Mapping[str, object]) -> str | None:
    """The model made here that a real engine's cell serves (its ``model`` level), None for a checkpoint path: an
    ``Engine.made_model`` for engines that serve the checkpoints as they were made."""
    model = str(levels["model"])
    return model if model in MADE_MODELS else None


def check_served_level(factor: str, level: object, choices: Mapping[str, tuple[str, ...]], counts: tuple[str, ...]) -> None:
    """A real engine's level: one of its choices, a positive count, or a model made here (or a checkpoint path);
    ``KeyError`` for a factor it does not know."""
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


def describe_served(factor: str, choices: Mapping[str, tuple[str, ...]], counts: tuple[str, ...]) -> str:
    """A real engine's factor's levels as the docs read them (the counterpart of ``check_served_level``)."""
    if factor in choices:
        return ", ".join(f"`{level}`" for level in choices[factor])
    if factor in counts:
        return "a positive int"
    if factor == "model":
        return f"{', '.join(f'`{m}`' for m in MADE_MODELS)}, or a Hugging Face checkpoint directory"
    return "the server's own: a string, number or boolean"
