"""The tables of a matrix file that name the factors' levels: ``[[constraints]]`` (forbidden combinations), ``[cost]``,
``[[stronger]]`` (factor groups at a higher strength), ``[[workloads]]`` (workloads by level) and ``[[cells]]`` (the
cells chosen to run), and the checks their values share; every problem is one ``MatrixError`` line naming the file, the key and the value at fault."""
from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

from harness.matrix.model import CellChoice, Constraint, WorkloadRule, matrix_error
from harness.sut.base import Engine
from harness.sut.levels import EngineLevels

#: the largest ``[cost]`` of a level: costs are relative, and sums over thousands of cells (and the
#: cost ILP's coefficients) stay far from overflow and from HiGHS's numeric limits.
MAX_COST = 1e6
_CONSTRAINT_KEYS = ("forbid", "reason")
_STRONGER_KEYS = ("factors", "strength")
_WORKLOAD_KEYS = ("when", "run", "reason")
_CELLS_KEYS = ("choose", "reason")


def describe(value: object) -> str:
    """A value with its TOML-visible type, for type errors."""
    return f"{type(value).__name__} {value!r}"


def levels_text(levels: Sequence[object]) -> str:
    """``off, device`` — a level list in messages."""
    return ", ".join(str(level) for level in levels)


def check_keys(path: Path, where: str, table: Mapping[str, object], allowed: Sequence[str],
                engine: Engine | None = None) -> None:
    """Reject keys that ``table`` may not have (at the top level: tables neither the file nor its ``engine`` reads)."""
    for key in table:
        if key not in allowed:
            is_table = not where and isinstance(table[key], (dict, list))
            name = f"{where} {key}" if where else (f"[{key}]" if is_table else key)
            kind = "table" if is_table else "key"
            of = f" of a matrix of engine {engine.name!r}" if engine is not None else ""
            raise matrix_error(path, name, f"unknown {kind}{of} (known: {', '.join(allowed)})")


def typed(path: Path, key: str, value: object, kinds: tuple[type, ...], what: str) -> None:
    """Reject ``value`` unless it is one of ``kinds`` (bools are never numbers here)."""
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise matrix_error(path, key, f"expected {what}, got {describe(value)}")


def parse_workloads(
    path: Path, value: object, known: Collection[str] | None, key: str = "[matrix] workloads"
) -> tuple[str, ...]:
    """Validate a workload list (``[matrix] workloads``, a ``run``): distinct names, known ones when the caller says which."""
    typed(path, key, value, (list,), "a list of workload names")
    assert isinstance(value, list)
    for i, workload in enumerate(value):
        typed(path, key, workload, (str,), "a workload name (string)")
        if workload in value[:i]:
            raise matrix_error(path, key, f"duplicate workload {workload!r}")
        if known is not None and workload not in known:
            raise matrix_error(path, key, f"unknown workload {workload!r} (known: {', '.join(sorted(known))})")
    return tuple(value)


def check_factor_name(path: Path, key: str, factor: str, engine: EngineLevels) -> None:
    """Reject a factor the engine does not take."""
    if factor not in engine.factors:
        raise matrix_error(path, key, f"unknown factor of engine {engine.name!r} (known: {', '.join(engine.factors)})")


def among(level: object, levels: Sequence[object]) -> bool:
    """``level in levels`` without ``True == 1`` or ``1.0 == 1`` surprises."""
    return any(type(level) is type(candidate) and level == candidate for candidate in levels)


def parse_constraints(
    path: Path, value: object, factors: dict[str, tuple[object, ...]], engine: EngineLevels
) -> tuple[Constraint, ...]:
    """Validate every ``[[constraints]]`` entry."""
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise matrix_error(path, "[[constraints]]", f"expected an array of tables, got {describe(value)}")
    return tuple(parse_constraint(path, f"[[constraints]] #{i}", entry, factors, engine)
                 for i, entry in enumerate(value, start=1))


def parse_constraint(
    path: Path, where: str, entry: dict[str, object], factors: dict[str, tuple[object, ...]], engine: EngineLevels
) -> Constraint:
    """Validate one constraint: a non-empty ``forbid`` over the matrix's levels and a reason."""
    check_keys(path, where, entry, _CONSTRAINT_KEYS)
    for key in _CONSTRAINT_KEYS:
        if key not in entry:
            raise matrix_error(path, f"{where} {key}", "missing required key")
    reason, forbid = entry["reason"], entry["forbid"]
    typed(path, f"{where} reason", reason, (str,), "a non-empty string")
    if not reason.strip():
        raise matrix_error(path, f"{where} reason", "empty reason (say why the combination is forbidden)")
    return Constraint(forbid=parse_level_table(path, f"{where} forbid", forbid, factors, engine), reason=reason)


def parse_level_table(
    path: Path, key: str, value: object, factors: dict[str, tuple[object, ...]], engine: EngineLevels
) -> Mapping[str, tuple[object, ...]]:
    """Validate a ``{ factor = level or [levels] }`` table (a constraint's ``forbid``, a workload entry's ``when``)."""
    typed(path, key, value, (dict,), "a table of factor = level(s)")
    assert isinstance(value, dict)
    if not value:
        raise matrix_error(path, key, "empty (it would match every row)")
    parsed: dict[str, tuple[object, ...]] = {}
    for factor, wanted in value.items():
        where = f"{key}.{factor}"
        if factor not in factors:
            check_factor_name(path, where, factor, engine)
            raise matrix_error(path, where, f"factor {factor!r} is not in [factors]")
        levels = factors[factor]
        listed = wanted if isinstance(wanted, list) else [wanted]
        if not listed:
            raise matrix_error(path, where, "empty level list")
        for i, level in enumerate(listed):
            if not among(level, levels):
                raise matrix_error(path, where, f"unknown level {level!r} (levels: {levels_text(levels)})")
            if level in listed[:i]:
                raise matrix_error(path, where, f"duplicate level {level!r}")
        parsed[factor] = tuple(listed)
    return MappingProxyType(parsed)


def parse_cost(
    path: Path, table: dict[str, object], factors: dict[str, tuple[object, ...]], engine: EngineLevels
) -> Mapping[str, Mapping[object, float]]:
    """Validate ``[cost]``: factor = { level = cost }, over the matrix's levels, each cost a positive number."""
    parsed: dict[str, Mapping[object, float]] = {}
    for factor, entry in table.items():
        key = f"[cost] {factor}"
        if factor not in factors:
            check_factor_name(path, key, factor, engine)
            raise matrix_error(path, key, f"factor {factor!r} is not in [factors]")
        typed(path, key, entry, (dict,), "a table of level = cost")
        assert isinstance(entry, dict)
        levels = factors[factor]
        by_name = {str(level): level for level in levels}  # TOML keys are strings: page_size = { 16 = 3 }
        costs: dict[object, float] = {}
        for name, value in entry.items():
            if name not in by_name:
                raise matrix_error(path, f"{key}.{name}", f"unknown level {name!r} (levels: {levels_text(levels)})")
            typed(path, f"{key}.{name}", value, (int, float), "a positive number")
            if not (math.isfinite(value) and value > 0):
                raise matrix_error(path, f"{key}.{name}", f"{value!r} is not a positive finite cost")
            if value > MAX_COST:
                raise matrix_error(path, f"{key}.{name}", f"{value!r} is too large (costs are relative: at most {MAX_COST:g})")
            costs[by_name[name]] = float(value)
        parsed[factor] = MappingProxyType(costs)
    return MappingProxyType(parsed)


def parse_stronger(
    path: Path, value: object, factors: dict[str, tuple[object, ...]], header: Mapping[str, object]
) -> tuple[tuple[tuple[str, ...], int], ...]:
    """Validate ``[[stronger]]``: in a t-wise matrix, distinct factors of [factors] at a strength above the matrix's."""
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise matrix_error(path, "[[stronger]]", f"expected an array of tables, got {describe(value)}")
    groups = []
    for i, entry in enumerate(value, start=1):
        where = f"[[stronger]] #{i}"
        if header["mode"] != "t-wise":
            raise matrix_error(path, where, f"only for mode 't-wise', not {header['mode']!r}")
        check_keys(path, where, entry, _STRONGER_KEYS)
        for key in _STRONGER_KEYS:
            if key not in entry:
                raise matrix_error(path, f"{where} {key}", "missing required key")
        names, strength = entry["factors"], entry["strength"]
        typed(path, f"{where} factors", names, (list,), "a list of factor names")
        for name in names:
            if name not in factors:
                raise matrix_error(path, f"{where} factors", f"{name!r} is not in [factors]")
        if len(set(names)) != len(names):
            raise matrix_error(path, f"{where} factors", "a factor is listed twice")
        if isinstance(strength, bool) or not isinstance(strength, int):
            raise matrix_error(path, f"{where} strength", f"must be an integer, got {describe(strength)}")
        if not header["strength"] < strength <= len(names):
            raise matrix_error(path, f"{where} strength", f"{strength} must be above the matrix strength "
                               f"{header['strength']} and at most the {len(names)} factors listed")
        groups.append((tuple(names), strength))
    return tuple(groups)


def parse_workload_rules(
    path: Path, value: object, factors: dict[str, tuple[object, ...]], known: Collection[str] | None,
    engine: EngineLevels,
) -> tuple[WorkloadRule, ...]:
    """Validate ``[[workloads]]``: each entry a ``when`` level table, a non-empty ``run`` list and a reason."""
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise matrix_error(path, "[[workloads]]", f"expected an array of tables, got {describe(value)}")
    rules = []
    for i, entry in enumerate(value, start=1):
        where = f"[[workloads]] #{i}"
        check_keys(path, where, entry, _WORKLOAD_KEYS)
        for key in _WORKLOAD_KEYS:
            if key not in entry:
                raise matrix_error(path, f"{where} {key}", "missing required key")
        typed(path, f"{where} reason", entry["reason"], (str,), "a non-empty string")
        if not entry["reason"].strip():
            raise matrix_error(path, f"{where} reason", "empty reason (say what these workloads exercise)")
        run = parse_workloads(path, entry["run"], known, f"{where} run")
        if not run:
            raise matrix_error(path, f"{where} run", "empty (a cell needs at least one workload)")
        when = parse_level_table(path, f"{where} when", entry["when"], factors, engine)
        rules.append(WorkloadRule(when, run, entry["reason"]))
    return tuple(rules)


def parse_cell_choices(
    path: Path, value: object, factors: dict[str, tuple[object, ...]], header: Mapping[str, object],
    engine: EngineLevels,
) -> tuple[CellChoice, ...]:
    """Validate ``[[cells]]``: in mode ``cells`` (and only there) one entry or more, each a ``choose`` level table
    and a reason saying why these cells run."""
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise matrix_error(path, "[[cells]]", f"expected an array of tables, got {describe(value)}")
    if header["mode"] == "cells" and not value:
        raise matrix_error(path, "[[cells]]", "missing (mode 'cells' runs the cells its [[cells]] entries choose)")
    choices = []
    for i, entry in enumerate(value, start=1):
        where = f"[[cells]] #{i}"
        if header["mode"] != "cells":
            raise matrix_error(path, where, f"only for mode 'cells', not {header['mode']!r}")
        check_keys(path, where, entry, _CELLS_KEYS)
        for key in _CELLS_KEYS:
            if key not in entry:
                raise matrix_error(path, f"{where} {key}", "missing required key")
        typed(path, f"{where} reason", entry["reason"], (str,), "a non-empty string")
        if not entry["reason"].strip():
            raise matrix_error(path, f"{where} reason", "empty reason (say why these cells run)")
        if entry["choose"] == {}:
            raise matrix_error(path, f"{where} choose", "empty (name the level or levels of a factor or more)")
        choose = parse_level_table(path, f"{where} choose", entry["choose"], factors, engine)
        choices.append(CellChoice(choose, entry["reason"]))
    return tuple(choices)
