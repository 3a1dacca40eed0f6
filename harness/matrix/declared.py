"""What a matrix file declares about its engine beyond the factors: known failures and lossy levels' tolerances
(an engine's own tables, ``[engine_args]`` or ``[server]``, are its package's to read: ``Engine.parse_tables``).

``[[expected]]`` names a real engine's real bug: a cell pattern (``when``), what fails (an oracle, or
``error: ExceptionType``) and why (an upstream issue or a sentence). A matching cell that fails that way
is ``xfail``; one that passes is ``xpass`` and fails the run (strict, as pytest's ``xfail(strict=True)``);
one that fails another way fails. A failing combination stays in the matrix and in the report:
declaring it is how a run goes green, never constraining it out.

``[[tolerances]]`` gives a lossy level (fp8 KV, bf16) the logprob and tie tolerances it is judged with,
with the reason; the report shows them. A tolerance is never set in code.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from pathlib import Path

from harness import oracles
from harness.matrix.known import Bound, Expected, SignatureValues, Tolerance
from harness.matrix.model import matrix_error
from harness.sut.host import KERNEL_FLAGS

DECLARED_TABLES = ("expected", "tolerances")
_ERROR = re.compile(r"error: [A-Za-z_][A-Za-z0-9_]*")
_EXPECTED_KEYS = ("when", "fails", "reason", "signature", "class", "upstream", "seen_on", "cpu")
_EXPECTED_REQUIRED = ("when", "fails", "reason")
#: what a declaration can be. A difference an engine documents is not one of them: it is an expectation the
#: engine's package states (its rules), never a declared failure.
KINDS = ("engine bug", "harness limitation")
_TOLERANCE_KEYS = ("when", "logprobs", "tie", "reason")

LevelTable = Callable[[str, object], Mapping[str, tuple[object, ...]]]


def parse_declared(path: Path, doc: Mapping[str, object], level_table: LevelTable) -> dict[str, object]:
    """The Matrix fields of ``[[expected]]`` and ``[[tolerances]]``."""
    return {"expected": tuple(_expected(path, f"[[expected]] #{i}", i, entry, level_table)
                              for i, entry in enumerate(_entries(path, doc, "expected"), start=1)),
            "tolerances": tuple(_tolerance(path, f"[[tolerances]] #{i}", entry, level_table)
                                for i, entry in enumerate(_entries(path, doc, "tolerances"), start=1))}


def _entries(path: Path, doc: Mapping[str, object], table: str) -> list[dict]:
    value = doc.get(table, [])
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise matrix_error(path, f"[[{table}]]", f"expected an array of tables, got {type(value).__name__} {value!r}")
    return value


def _keys(path: Path, where: str, entry: Mapping[str, object], allowed: tuple[str, ...], required: tuple[str, ...]) -> None:
    for key in entry:
        if key not in allowed:
            raise matrix_error(path, f"{where} {key}", f"unknown key (known: {', '.join(allowed)})")
    for key in required:
        if key not in entry:
            raise matrix_error(path, f"{where} {key}", "missing required key")


def _reason(path: Path, where: str, reason: object, what: str) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise matrix_error(path, f"{where} reason", f"needs a non-empty string ({what})")
    return reason


def _expected(path: Path, where: str, number: int, entry: dict, level_table: LevelTable) -> Expected:
    _keys(path, where, entry, _EXPECTED_KEYS, _EXPECTED_REQUIRED)
    fails = entry["fails"] if isinstance(entry["fails"], list) else [entry["fails"]]
    if not fails:
        raise matrix_error(path, f"{where} fails", "empty (name the oracle or the error type that fails)")
    for name in fails:
        if not isinstance(name, str) or not (name in oracles.names() or _ERROR.fullmatch(name)):
            raise matrix_error(path, f"{where} fails", f"{name!r} is neither an oracle ({', '.join(oracles.names())}) "
                               f"nor 'error: ExceptionType'")
    reason = _reason(path, where, entry["reason"], "the upstream issue, or a sentence saying why")
    kind, upstream, seen_on = (_text(path, f"{where} {key}", entry.get(key)) for key in ("class", "upstream", "seen_on"))
    if kind is not None and kind not in KINDS:
        raise matrix_error(path, f"{where} class", f"{kind!r} is not one of {', '.join(KINDS)} (a difference the engine "
                           f"documents is an expectation of its package, not a declared failure)")
    signature = _signature(path, f"{where} signature", entry.get("signature", {}), fails)
    return Expected(level_table(f"{where} when", entry["when"]), tuple(fails), reason, signature, kind, upstream,
                    seen_on, _cpu(path, f"{where} cpu", entry.get("cpu", [])), number)


def _cpu(path: Path, key: str, flags: object) -> frozenset[str]:
    """``cpu``: the CPU flags a declaration needs, among those an engine's kernels choose their path by."""
    if not isinstance(flags, list) or not all(isinstance(flag, str) for flag in flags):
        raise matrix_error(path, key, f"expected a list of CPU flags, got {flags!r}")
    unknown = [flag for flag in flags if flag not in KERNEL_FLAGS]
    if unknown:
        raise matrix_error(path, key, f"{', '.join(map(repr, unknown))} is not a CPU flag kernels choose their path "
                                      f"by ({', '.join(KERNEL_FLAGS)})")
    return frozenset(flags)


def _text(path: Path, key: str, value: object) -> str | None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise matrix_error(path, key, f"needs a non-empty string, got {value!r}")
    return value


def _signature(path: Path, key: str, table: object, fails: list[str]) -> Mapping[str, SignatureValues]:
    """``signature``: finding field → the value (or list of values) a finding it excuses has there, or the range
    (``{ min = A, max = B }``) its number lies in."""
    if not isinstance(table, dict):
        raise matrix_error(path, key, f"expected a table of finding field = value(s), got {type(table).__name__}")
    if table and all(_ERROR.fullmatch(name) for name in fails):
        raise matrix_error(path, key, "an error declaration's signature is its exception type; name an oracle in fails")
    parsed: dict[str, SignatureValues] = {}
    for field, value in table.items():
        if isinstance(value, dict):
            parsed[field] = _bound(path, f"{key}.{field}", value)
            continue
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, (str, int, float, bool)) for v in values):
            raise matrix_error(path, f"{key}.{field}", f"expected a value or a non-empty list of values, got {value!r}")
        parsed[field] = tuple(values)
    return MappingProxyType(parsed)


def _bound(path: Path, key: str, table: dict) -> Bound:
    """A signature's range: ``min`` and/or ``max``, finite numbers, ``min`` not above ``max``."""
    unknown = sorted(set(table) - {"min", "max"})
    if unknown or not table:
        raise matrix_error(path, key, f"a range is {{ min = A, max = B }} (either end may be left out), "
                                      f"got {'keys ' + ', '.join(unknown) if unknown else 'an empty table'}")
    ends = {}
    for end, value in table.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise matrix_error(path, f"{key}.{end}", f"must be a finite number, got {value!r}")
        ends[end] = float(value)
    bound = Bound(ends.get("min"), ends.get("max"))
    if bound.min is not None and bound.max is not None and bound.min > bound.max:
        raise matrix_error(path, key, f"min {bound.min} is above max {bound.max}")
    return bound


def _tolerance(path: Path, where: str, entry: dict, level_table: LevelTable) -> Tolerance:
    _keys(path, where, entry, _TOLERANCE_KEYS, ("when", "reason"))
    values = {}
    for key in ("logprobs", "tie"):
        value = entry.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value <= 0):
            raise matrix_error(path, f"{where} {key}", f"must be a positive number, got {value!r}")
        values[key] = None if value is None else float(value)
    if values["logprobs"] is None and values["tie"] is None:
        raise matrix_error(path, where, "declares neither logprobs nor tie")
    reason = _reason(path, where, entry["reason"], "why this level is lossy")
    return Tolerance(level_table(f"{where} when", entry["when"]), values["logprobs"], values["tie"], reason)
