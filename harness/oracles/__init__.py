"""The oracles: one module each, registered here once; every row, summary, report and docs table takes the list
from ``oracles()``.

An oracle is an ``Oracle`` (``view.py``): a name, one line on what fails it, and a function from a cell's
``PassView``s to a ``Verdict``. A new oracle is one module and one line in ``BUILTIN``, or, from your own
code, ``register(Oracle(...))`` (``harness run`` then judges every cell by it too).
"""
from __future__ import annotations

from collections.abc import Sequence

from harness.oracles import (
    accept_length, applied, batch_invariance, cached_tokens, completeness, cross_engine, inputs, logprobs, nan,
    pd_audit, pool_audit, pressure, tokens,
)
from harness.oracles.view import Oracle, PassView
from harness.results.rows import Verdict

#: the built-in oracles, in the order every row lists them.
BUILTIN: tuple[Oracle, ...] = (
    tokens.ORACLE,
    logprobs.ORACLE,
    nan.ORACLE,
    cached_tokens.ORACLE,
    batch_invariance.ORACLE,
    completeness.ORACLE,
    pool_audit.ORACLE,
    accept_length.ORACLE,
    cross_engine.ORACLE,
    pd_audit.ORACLE,
    applied.ORACLE,
    pressure.ORACLE,
    inputs.ORACLE,
)
_ORACLES: dict[str, Oracle] = {oracle.name: oracle for oracle in BUILTIN}


def register(oracle: Oracle) -> Oracle:
    """Judge every cell by ``oracle`` too (in this process), after the ones known so far; return it."""
    _ORACLES[oracle.name] = oracle
    return oracle


def unregister(name: str) -> None:
    """Forget a registered oracle (a test's own); a built-in stays."""
    if name not in {oracle.name for oracle in BUILTIN}:
        _ORACLES.pop(name, None)


def plugin_modules() -> list[str]:
    """The modules that registered oracles in this process: a worker process imports them to know them too."""
    builtin = {oracle.name for oracle in BUILTIN}
    return sorted({oracle.judge.__module__ for name, oracle in _ORACLES.items() if name not in builtin})


def oracles() -> dict[str, Oracle]:
    """Every oracle by name, in the order rows list them."""
    return dict(_ORACLES)


def names() -> tuple[str, ...]:
    return tuple(_ORACLES)


def evidence_kinds() -> dict[str, str]:
    """Oracle name → the kind of report view its findings show as, for those that declare one (``Oracle.evidence``):
    what the entry points hand ``reports/``, which reads no oracle."""
    return {name: oracle.evidence for name, oracle in _ORACLES.items() if oracle.evidence is not None}


def judge(views: Sequence[PassView]) -> dict[str, Verdict]:
    """Every oracle's verdict on one cell, in a stable order."""
    return {name: oracle(views) for name, oracle in _ORACLES.items()}
