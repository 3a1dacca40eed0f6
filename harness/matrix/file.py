"""Matrix files: read a TOML matrix and validate every key before any cell runs.

Every problem is one ``MatrixError`` line naming the file, the key and the value at fault
(``matrices/smoke.toml: [cost] backend.cuda: unknown level 'cuda' (levels: torch, triton)``);
nothing is generated or written for a file that fails.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import tomllib
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

from fixtures.workloads import WORKLOADS
from harness.matrix.levels import ENGINES, OPENAI, EngineLevels, LevelError
from harness.matrix.model import (
    MODES, Constraint, MatrixSpec, WorkloadRule, check_strength, index_constraints, level_token,
    matrix_error, shown_path,
)
from harness.matrix.covering.fixedsize import DEFAULT_MOVES
from harness.matrix.declared import DECLARED_TABLES, parse_declared
from harness.matrix.server import parse_server

DEFAULT_TIMEOUT_S = 600.0
#: the largest ``[cost]`` of a level: costs are relative, and sums over thousands of cells (and the
#: cost ILP's coefficients) stay far from overflow and from HiGHS's numeric limits.
MAX_COST = 1e6
_TABLES = ("matrix", "factors", "golden", "constraints", "cost", "stronger", "workloads", "server", *DECLARED_TABLES)
_MATRIX_KEYS = ("name", "description", "engine", "mode", "strength", "search_moves", "workloads", "timeout_s")
#: the most ``[matrix] search_moves`` a file may ask for (at 0.1-0.2 ms a move, under an hour).
MAX_SEARCH_MOVES = 10_000_000
_CONSTRAINT_KEYS = ("forbid", "reason")
_STRONGER_KEYS = ("factors", "strength")
_WORKLOAD_KEYS = ("when", "run", "reason")


def resolve_matrix_path(name_or_path: str, matrices_dir: Path | None = None) -> Path:
    """``smoke`` → ``<matrices_dir>/smoke.toml``; a ``.toml`` path is used as is; it must exist."""
    if name_or_path.endswith(".toml"):
        path = Path(name_or_path)
    else:
        path = (matrices_dir or Path.cwd() / "matrices") / f"{name_or_path}.toml"
    if not path.is_file():
        available = sorted(p.stem for p in path.parent.glob("*.toml")) if path.parent.is_dir() else []
        raise matrix_error(path, "", f"no such matrix (available in {shown_path(path.parent)}: "
                           f"{', '.join(available) or 'none'})")
    return path


def load_spec(name: str, strength: int | None = None) -> MatrixSpec:
    """The matrix a command line names (``matrices/NAME.toml`` or a path), turned t-wise when ``strength`` is given."""
    spec = load_matrix(name, known_workloads=WORKLOADS)
    return spec.with_strength(strength) if strength is not None else spec


def load_matrix(
    name_or_path: str,
    *,
    matrices_dir: Path | None = None,
    known_workloads: Collection[str] | None = None,
) -> MatrixSpec:
    """Read and validate a matrix file; raise ``MatrixError`` on the first problem found."""
    path = resolve_matrix_path(name_or_path, matrices_dir)
    try:
        with path.open("rb") as handle:
            doc = tomllib.load(handle)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise matrix_error(path, "", f"TOML syntax error: {exc}") from exc
    _check_keys(path, "", doc, _TABLES)
    header = _parse_header(path, _table(path, doc, "matrix", required=True), known_workloads)
    engine = ENGINES[header["engine"]]
    factor_table = _table(path, doc, "factors", required=True)
    if engine is OPENAI:  # a server's factors are the file's: those the oracles read and its own
        engine = dataclasses.replace(engine, factors=tuple(factor_table))
    factors = _parse_factors(path, factor_table, engine)
    golden_table = _table(path, doc, "golden", required=False)
    golden = _parse_golden(path, golden_table, dict(factors), engine)
    constraints = _parse_constraints(path, doc.get("constraints", []), dict(factors), engine)
    cost = _parse_cost(path, _table(path, doc, "cost", required=False), dict(factors), engine)
    stronger = _parse_stronger(path, doc.get("stronger", []), dict(factors), header)
    rules = _parse_workload_rules(path, doc.get("workloads", []), dict(factors), known_workloads, engine)
    declared = parse_declared(path, doc, dict(factors), lambda key, value: _parse_level_table(
        path, key, value, dict(factors), engine))
    if engine.name == OPENAI.name:
        declared["engine_args"] = _parse_openai(path, doc, dict(factors), golden_table)
    elif "server" in doc:
        raise matrix_error(path, "[server]", f"only an openai matrix launches a server (this one's engine is "
                           f"{engine.name!r})")
    spec = MatrixSpec(path=path, factors=factors, constraints=constraints, golden=golden, cost=cost,
                      stronger=stronger, workload_rules=rules, **declared, **header)
    if spec.strength is not None:
        check_strength(spec, spec.strength, "[matrix] strength")
    _check_golden_allowed(spec)
    _check_levels_reachable(spec)
    _check_workload_rules_reachable(spec)
    return spec


def _parse_openai(path: Path, doc: Mapping[str, object], factors: dict[str, tuple[object, ...]],
                  golden: Mapping[str, object]) -> Mapping[str, object]:
    """An openai matrix's engine arguments: its ``[server]`` table. Each of the server's own factors needs a
    ``[golden]`` level, since no defaults table knows it."""
    if doc.get("engine_args"):
        raise matrix_error(path, "[engine_args]", "an openai matrix passes its flags in [server] command and "
                           "[server.levels]")
    for factor, levels in factors.items():
        if factor in golden or factor in OPENAI.kept_from_cell:
            continue
        if factor not in OPENAI.defaults:
            raise matrix_error(path, f"[golden] {factor}", "missing: name the golden level of each of the server's "
                               "own factors (no defaults table knows them)")
        if not _among(OPENAI.defaults[factor], levels):
            raise matrix_error(path, f"[golden] {factor}", f"missing: the default golden level "
                               f"{OPENAI.defaults[factor]!r} is not one of [factors] {factor} ({_levels_text(levels)}); "
                               f"name the one the golden cell runs")
    return MappingProxyType(parse_server(path, doc.get("server"), factors, tuple(OPENAI.defaults)))


def _describe(value: object) -> str:
    """A value with its TOML-visible type, for type errors."""
    return f"{type(value).__name__} {value!r}"


def _levels_text(levels: Sequence[object]) -> str:
    """``off, device`` — a level list in messages."""
    return ", ".join(str(level) for level in levels)


def _check_keys(path: Path, where: str, table: Mapping[str, object], allowed: Sequence[str]) -> None:
    """Reject keys that ``table`` may not have."""
    for key in table:
        if key not in allowed:
            is_table = not where and isinstance(table[key], dict)
            name = f"{where} {key}" if where else (f"[{key}]" if is_table else key)
            kind = "table" if is_table else "key"
            raise matrix_error(path, name, f"unknown {kind} (known: {', '.join(allowed)})")


def _table(path: Path, doc: Mapping[str, object], name: str, *, required: bool) -> dict[str, object]:
    """The top-level table ``[name]`` (empty when optional and absent)."""
    if name not in doc:
        if required:
            raise matrix_error(path, f"[{name}]", "missing required table")
        return {}
    table = doc[name]
    if not isinstance(table, dict):
        raise matrix_error(path, f"[{name}]", f"expected a table, got {_describe(table)}")
    return table


def _typed(path: Path, key: str, value: object, kinds: tuple[type, ...], what: str) -> None:
    """Reject ``value`` unless it is one of ``kinds`` (bools are never numbers here)."""
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise matrix_error(path, key, f"expected {what}, got {_describe(value)}")


def _parse_header(
    path: Path, table: dict[str, object], known_workloads: Collection[str] | None
) -> dict[str, object]:
    """Validate ``[matrix]``; return the MatrixSpec fields it holds."""
    _check_keys(path, "[matrix]", table, _MATRIX_KEYS)
    for key in ("name", "mode"):
        if key not in table:
            raise matrix_error(path, f"[matrix] {key}", "missing required key")
    name, mode = table["name"], table["mode"]
    _typed(path, "[matrix] name", name, (str,), "a string")
    if name != path.stem:
        raise matrix_error(path, "[matrix] name", f"{name!r} does not match the file name {path.stem!r}")
    _typed(path, "[matrix] mode", mode, (str,), "a string")
    if mode not in MODES:
        raise matrix_error(path, "[matrix] mode", f"unknown mode {mode!r} (modes: {', '.join(MODES)})")
    description = table.get("description", "")
    _typed(path, "[matrix] description", description, (str,), "a string")
    strength = table.get("strength")
    if strength is not None and (isinstance(strength, bool) or not isinstance(strength, int)):
        raise matrix_error(path, "[matrix] strength", f"must be an integer, got {_describe(strength)}")
    if mode == "t-wise" and strength is None:
        raise matrix_error(path, "[matrix] strength", "missing (required with mode 't-wise')")
    if mode != "t-wise" and strength is not None:
        raise matrix_error(path, "[matrix] strength", f"{strength!r} given with mode {mode!r} (only for 't-wise')")
    search_moves = _parse_search_moves(path, table, mode)
    timeout_s = table.get("timeout_s", DEFAULT_TIMEOUT_S)
    _typed(path, "[matrix] timeout_s", timeout_s, (int, float), "a number of seconds")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise matrix_error(path, "[matrix] timeout_s", f"{timeout_s!r} is not a positive number of seconds")
    workloads = _parse_workloads(path, table.get("workloads", []), known_workloads)
    engine = table.get("engine", "reference")
    _typed(path, "[matrix] engine", engine, (str,), "a string")
    if engine not in ENGINES:
        raise matrix_error(path, "[matrix] engine", f"unknown engine {engine!r} (engines: {', '.join(ENGINES)})")
    return {"name": name, "description": description, "engine": engine, "mode": mode, "strength": strength,
            "search_moves": search_moves, "workloads": workloads, "timeout_s": float(timeout_s)}


def _parse_search_moves(path: Path, table: Mapping[str, object], mode: object) -> int:
    """``[matrix] search_moves``: the fixed-size search's move budget, an integer 0..MAX_SEARCH_MOVES (t-wise only)."""
    if "search_moves" not in table:
        return DEFAULT_MOVES
    moves = table["search_moves"]
    if mode != "t-wise":
        raise matrix_error(path, "[matrix] search_moves", f"given with mode {mode!r} (only for 't-wise')")
    if isinstance(moves, bool) or not isinstance(moves, int):
        raise matrix_error(path, "[matrix] search_moves", f"must be an integer number of moves, got {_describe(moves)}")
    if not 0 <= moves <= MAX_SEARCH_MOVES:
        raise matrix_error(path, "[matrix] search_moves", f"{moves} is outside 0..{MAX_SEARCH_MOVES:,} (0 turns the "
                           f"fixed-size search off)")
    return moves


def _parse_workloads(
    path: Path, value: object, known: Collection[str] | None, key: str = "[matrix] workloads"
) -> tuple[str, ...]:
    """Validate a workload list (``[matrix] workloads``, a ``run``): distinct names, known ones when the caller says which."""
    _typed(path, key, value, (list,), "a list of workload names")
    assert isinstance(value, list)
    for i, workload in enumerate(value):
        _typed(path, key, workload, (str,), "a workload name (string)")
        if workload in value[:i]:
            raise matrix_error(path, key, f"duplicate workload {workload!r}")
        if known is not None and workload not in known:
            raise matrix_error(path, key, f"unknown workload {workload!r} (known: {', '.join(sorted(known))})")
    return tuple(value)


def _check_factor_name(path: Path, key: str, factor: str, engine: EngineLevels) -> None:
    """Reject a factor the engine does not take."""
    if factor not in engine.factors:
        raise matrix_error(path, key, f"unknown factor of engine {engine.name!r} (known: {', '.join(engine.factors)})")


def _check_level(path: Path, key: str, factor: str, level: object, engine: EngineLevels) -> None:
    """Reject a level the engine rejects, with its message (the reference imports an import-path level now)."""
    try:
        engine.check(factor, level)
    except LevelError as exc:
        raise matrix_error(path, key, str(exc)) from exc
    except KeyError as exc:
        raise matrix_error(path, key, f"unknown factor of engine {engine.name!r} "
                           f"(known: {', '.join(engine.factors)})") from exc


def _parse_factors(path: Path, table: dict[str, object], engine: EngineLevels) -> tuple[tuple[str, tuple[object, ...]], ...]:
    """Validate ``[factors]``: known factors, each with distinct valid levels and distinct id tokens."""
    if not table:
        raise matrix_error(path, "[factors]", "no factors (a matrix needs at least one)")
    factors = []
    for factor, levels in table.items():
        key = f"[factors] {factor}"
        _check_factor_name(path, key, factor, engine)
        _typed(path, key, levels, (list,), "a list of levels")
        assert isinstance(levels, list)
        if not levels:
            raise matrix_error(path, key, "empty level list")
        tokens: dict[str, object] = {}
        for i, level in enumerate(levels):
            _check_level(path, key, factor, level, engine)
            if level in levels[:i]:
                raise matrix_error(path, key, f"duplicate level {level!r}")
            token = level_token(level)
            if not token:
                raise matrix_error(path, key, f"level {level!r} has no name after ':' to show in cell ids")
            if token in tokens:
                raise matrix_error(path, key, f"level {level!r} has the same cell-id name {token!r} "
                                   f"as {tokens[token]!r}")
            tokens[token] = level
        factors.append((factor, tuple(levels)))
    return tuple(factors)


def _parse_golden(
    path: Path, table: dict[str, object], factors: dict[str, tuple[object, ...]], engine: EngineLevels
) -> Mapping[str, object]:
    """Validate ``[golden]`` over the engine's golden levels: a matrix factor's golden level is one of its levels."""
    for factor, level in table.items():
        _check_factor_name(path, f"[golden] {factor}", factor, engine)
        _check_level(path, f"[golden] {factor}", factor, level, engine)
    for factor, level in table.items():
        levels = factors.get(factor)
        if levels is None:
            raise matrix_error(path, f"[golden] {factor}", f"factor {factor!r} is not in [factors] "
                               f"(a golden level only applies to a factor of this matrix)")
        if not _among(level, levels):
            raise matrix_error(path, f"[golden] {factor}", f"golden level {level!r} is not one of the "
                               f"levels in [factors] (levels: {_levels_text(levels)})")
    return MappingProxyType({**engine.golden, **table})


def _among(level: object, levels: Sequence[object]) -> bool:
    """``level in levels`` without ``True == 1`` or ``1.0 == 1`` surprises."""
    return any(type(level) is type(candidate) and level == candidate for candidate in levels)


def _parse_constraints(
    path: Path, value: object, factors: dict[str, tuple[object, ...]], engine: EngineLevels
) -> tuple[Constraint, ...]:
    """Validate every ``[[constraints]]`` entry."""
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise matrix_error(path, "[[constraints]]", f"expected an array of tables, got {_describe(value)}")
    return tuple(_parse_constraint(path, f"[[constraints]] #{i}", entry, factors, engine)
                 for i, entry in enumerate(value, start=1))


def _parse_constraint(
    path: Path, where: str, entry: dict[str, object], factors: dict[str, tuple[object, ...]], engine: EngineLevels
) -> Constraint:
    """Validate one constraint: a non-empty ``forbid`` over the matrix's levels and a reason."""
    _check_keys(path, where, entry, _CONSTRAINT_KEYS)
    for key in _CONSTRAINT_KEYS:
        if key not in entry:
            raise matrix_error(path, f"{where} {key}", "missing required key")
    reason, forbid = entry["reason"], entry["forbid"]
    _typed(path, f"{where} reason", reason, (str,), "a non-empty string")
    if not reason.strip():
        raise matrix_error(path, f"{where} reason", "empty reason (say why the combination is forbidden)")
    return Constraint(forbid=_parse_level_table(path, f"{where} forbid", forbid, factors, engine), reason=reason)


def _parse_level_table(
    path: Path, key: str, value: object, factors: dict[str, tuple[object, ...]], engine: EngineLevels
) -> Mapping[str, tuple[object, ...]]:
    """Validate a ``{ factor = level or [levels] }`` table (a constraint's ``forbid``, a workload entry's ``when``)."""
    _typed(path, key, value, (dict,), "a table of factor = level(s)")
    assert isinstance(value, dict)
    if not value:
        raise matrix_error(path, key, "empty (it would match every row)")
    parsed: dict[str, tuple[object, ...]] = {}
    for factor, wanted in value.items():
        where = f"{key}.{factor}"
        if factor not in factors:
            _check_factor_name(path, where, factor, engine)
            raise matrix_error(path, where, f"factor {factor!r} is not in [factors]")
        levels = factors[factor]
        listed = wanted if isinstance(wanted, list) else [wanted]
        if not listed:
            raise matrix_error(path, where, "empty level list")
        for i, level in enumerate(listed):
            if not _among(level, levels):
                raise matrix_error(path, where, f"unknown level {level!r} (levels: {_levels_text(levels)})")
            if level in listed[:i]:
                raise matrix_error(path, where, f"duplicate level {level!r}")
        parsed[factor] = tuple(listed)
    return MappingProxyType(parsed)


def _parse_cost(
    path: Path, table: dict[str, object], factors: dict[str, tuple[object, ...]], engine: EngineLevels
) -> Mapping[str, Mapping[object, float]]:
    """Validate ``[cost]``: factor = { level = cost }, over the matrix's levels, each cost a positive number."""
    parsed: dict[str, Mapping[object, float]] = {}
    for factor, entry in table.items():
        key = f"[cost] {factor}"
        if factor not in factors:
            _check_factor_name(path, key, factor, engine)
            raise matrix_error(path, key, f"factor {factor!r} is not in [factors]")
        _typed(path, key, entry, (dict,), "a table of level = cost")
        assert isinstance(entry, dict)
        levels = factors[factor]
        by_name = {str(level): level for level in levels}  # TOML keys are strings: page_size = { 16 = 3 }
        costs: dict[object, float] = {}
        for name, value in entry.items():
            if name not in by_name:
                raise matrix_error(path, f"{key}.{name}", f"unknown level {name!r} (levels: {_levels_text(levels)})")
            _typed(path, f"{key}.{name}", value, (int, float), "a positive number")
            if not (math.isfinite(value) and value > 0):
                raise matrix_error(path, f"{key}.{name}", f"{value!r} is not a positive finite cost")
            if value > MAX_COST:
                raise matrix_error(path, f"{key}.{name}", f"{value!r} is too large (costs are relative: at most {MAX_COST:g})")
            costs[by_name[name]] = float(value)
        parsed[factor] = MappingProxyType(costs)
    return MappingProxyType(parsed)


def _parse_stronger(
    path: Path, value: object, factors: dict[str, tuple[object, ...]], header: Mapping[str, object]
) -> tuple[tuple[tuple[str, ...], int], ...]:
    """Validate ``[[stronger]]``: in a t-wise matrix, distinct factors of [factors] at a strength above the matrix's."""
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise matrix_error(path, "[[stronger]]", f"expected an array of tables, got {_describe(value)}")
    groups = []
    for i, entry in enumerate(value, start=1):
        where = f"[[stronger]] #{i}"
        if header["mode"] != "t-wise":
            raise matrix_error(path, where, f"only for mode 't-wise', not {header['mode']!r}")
        _check_keys(path, where, entry, _STRONGER_KEYS)
        for key in _STRONGER_KEYS:
            if key not in entry:
                raise matrix_error(path, f"{where} {key}", "missing required key")
        names, strength = entry["factors"], entry["strength"]
        _typed(path, f"{where} factors", names, (list,), "a list of factor names")
        for name in names:
            if name not in factors:
                raise matrix_error(path, f"{where} factors", f"{name!r} is not in [factors]")
        if len(set(names)) != len(names):
            raise matrix_error(path, f"{where} factors", "a factor is listed twice")
        if isinstance(strength, bool) or not isinstance(strength, int):
            raise matrix_error(path, f"{where} strength", f"must be an integer, got {_describe(strength)}")
        if not header["strength"] < strength <= len(names):
            raise matrix_error(path, f"{where} strength", f"{strength} must be above the matrix strength "
                               f"{header['strength']} and at most the {len(names)} factors listed")
        groups.append((tuple(names), strength))
    return tuple(groups)


def _parse_workload_rules(
    path: Path, value: object, factors: dict[str, tuple[object, ...]], known: Collection[str] | None,
    engine: EngineLevels,
) -> tuple[WorkloadRule, ...]:
    """Validate ``[[workloads]]``: each entry a ``when`` level table, a non-empty ``run`` list and a reason."""
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise matrix_error(path, "[[workloads]]", f"expected an array of tables, got {_describe(value)}")
    rules = []
    for i, entry in enumerate(value, start=1):
        where = f"[[workloads]] #{i}"
        _check_keys(path, where, entry, _WORKLOAD_KEYS)
        for key in _WORKLOAD_KEYS:
            if key not in entry:
                raise matrix_error(path, f"{where} {key}", "missing required key")
        _typed(path, f"{where} reason", entry["reason"], (str,), "a non-empty string")
        if not entry["reason"].strip():
            raise matrix_error(path, f"{where} reason", "empty reason (say what these workloads exercise)")
        run = _parse_workloads(path, entry["run"], known, f"{where} run")
        if not run:
            raise matrix_error(path, f"{where} run", "empty (a cell needs at least one workload)")
        when = _parse_level_table(path, f"{where} when", entry["when"], factors, engine)
        rules.append(WorkloadRule(when, run, entry["reason"]))
    return tuple(rules)


def _check_workload_rules_reachable(spec: MatrixSpec) -> None:
    """Reject a ``[[workloads]]`` entry no allowed row can match: it would silently never apply."""
    allowed = index_constraints(spec)
    names = [factor for factor, _ in spec.factors]
    for number, rule in enumerate(spec.workload_rules, start=1):
        choices = [[(names.index(f), levels.index(lv)) for lv in rule.when[f]] if f in rule.when else [None]
                   for f, levels in spec.factors]
        for combination in itertools.product(*choices):
            partial = [-1] * len(names)
            for picked in filter(None, combination):
                partial[picked[0]] = picked[1]
            if allowed.extendable(partial):
                break
        else:
            raise matrix_error(spec.path, f"[[workloads]] #{number} when",
                               "no allowed cell has these levels (the constraints forbid them all)")


def _check_golden_allowed(spec: MatrixSpec) -> None:
    """Reject constraints that forbid every row, or the golden cell every cell is compared with."""
    golden = spec.golden_cell().as_dict()
    if spec.allows(golden):
        return
    if not index_constraints(spec).extendable([-1] * len(spec.factors)):
        raise matrix_error(spec.path, "[[constraints]]", "every row is forbidden")
    number, culprit = next((i, c) for i, c in enumerate(spec.constraints, start=1) if c.forbids(golden))
    raise matrix_error(spec.path, "[golden]", f"the golden cell {spec.golden_cell().cell_id} is forbidden "
                       f"by [[constraints]] #{number} ({culprit.reason})")


def _check_levels_reachable(spec: MatrixSpec) -> None:
    """Reject a level that no allowed row has: the constraints would silently keep it from ever running."""
    allowed = index_constraints(spec)
    for f, (factor, levels) in enumerate(spec.factors):
        for i, level in enumerate(levels):
            partial = [-1] * len(spec.factors)
            partial[f] = i
            if not allowed.extendable(partial):
                culprits = [f"#{n}" for n, c in enumerate(spec.constraints, start=1) if _among(level, c.forbid.get(factor, ()))]
                raise matrix_error(spec.path, f"[factors] {factor}", f"level {level!r} is in no allowed row: "
                                   f"[[constraints]] {', '.join(culprits) or '(together)'} forbid every row with it")
