"""Systems under test: the protocol the runner drives (``base``) and the engines behind it, one package each.

An engine is declared once, as ``ENGINE`` (a ``base.Engine``) in its package, and named here in ``BUILTIN``;
a matrix file names it in ``[matrix] engine``. A user's own engine is named there by import path
(``mypkg.engine:ENGINE``) or handed to ``register``; nothing else in the harness names an engine. Its declaration
names its reproducer script writers too (``Engine.writers``), found by ``script_writer``.
"""
from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from harness.sut.base import CellEngine, Engine
from harness.sut.watched import WatchedEngine

if TYPE_CHECKING:
    from harness.sut.script.writer import ScriptWriter

#: the engines a matrix names by name: name → the package that declares it (its ``ENGINE``).
BUILTIN: Mapping[str, str] = {
    "reference": "harness.sut.reference",
    "vllm": "harness.sut.vllm",
    "openai": "harness.sut.openai",
}
_REGISTERED: dict[str, Engine] = {}


class UnknownEngineError(LookupError):
    """A name that is neither a built-in or registered engine nor an import path to an ``Engine``."""


def register(engine: Engine) -> Engine:
    """Make ``engine`` known by its name (in this process) and return it."""
    _REGISTERED[engine.name] = engine
    return engine


def unregister(name: str) -> None:
    """Forget an engine ``register`` made known (a test's own)."""
    _REGISTERED.pop(name, None)


def plugin_modules() -> list[str]:
    """The modules that registered engines in this process: a worker process imports them to know them too."""
    return sorted({engine.open.__module__ for engine in _REGISTERED.values()})


def known() -> list[str]:
    """The engines known by name, built-in first."""
    return list(dict.fromkeys([*BUILTIN, *_REGISTERED]))


def engine(name: str) -> Engine:
    """The engine ``name`` names: registered, built-in, or an import path ``module:ATTRIBUTE``."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in BUILTIN:
        return importlib.import_module(BUILTIN[name]).ENGINE
    module, colon, attribute = name.partition(":")
    if not colon:
        raise UnknownEngineError(f"unknown engine {name!r} (engines: {', '.join(known())}; or an import path "
                                 f"module:ENGINE)")
    try:
        found = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise UnknownEngineError(f"engine {name!r}: cannot import it ({exc})") from None
    if not isinstance(found, Engine):
        raise UnknownEngineError(f"engine {name!r} is a {type(found).__name__}, not a harness.sut.base.Engine")
    return found


def cross_golden(name: str, levels: Mapping[str, object],
                 engine_args: Mapping[str, object]) -> tuple[str, dict[str, object]] | None:
    """The cross_engine oracle's reference for a cell of engine ``name`` (full levels, engine arguments): the first
    other known engine that computes the made model the cell serves, with its golden levels; None where none does.
    The engines never name each other: each declares what it serves (``made_model``) and computes (``computes``)."""
    made = engine(name).made_model(levels, engine_args)
    if made is None:
        return None
    goldens = ((other, engine(other).computes(made)) for other in known() if other != name)
    return next(((other, golden) for other, golden in goldens if golden is not None), None)


def script_writers() -> dict[str, str]:
    """Every program with a reproducer script writer (``Engine.program_name``) → its import path, as the known engines
    declare them (``Engine.writers``), built-in first."""
    return {program: path for name in known() for program, path in engine(name).writers.items()}


def script_writer(program: str) -> ScriptWriter:
    """The reproducer script writer of ``program``, imported from the path its engine declares; ``NoScript`` naming
    the programs that have one."""
    from harness.sut.script.writer import NoScript

    writers = script_writers()
    if program not in writers:
        raise NoScript(f"{program}: no reproducer script writer yet (writers: {', '.join(writers)})")
    module, _, attribute = writers[program].partition(":")
    return getattr(importlib.import_module(module), attribute)


@contextmanager
def opened(name: str, levels: Mapping[str, object], faults: frozenset[str], device: str,
           engine_args: Mapping[str, object]) -> Iterator[CellEngine]:
    """The engine ``name`` brought up for one cell, closed when the block ends; every ``serve`` of its systems watched
    for what it does to the runner's requests (``watched.WatchedEngine``: the ``inputs`` oracle judges it)."""
    cell_engine = WatchedEngine(engine(name).open(levels, faults, device, engine_args))
    try:
        yield cell_engine
    finally:
        cell_engine.close()
