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
from collections.abc import Collection, Mapping
from pathlib import Path
from types import MappingProxyType

from fixtures.workloads import WORKLOADS
from harness import sut
from harness.matrix.model import (
    MODES, Matrix, check_strength, chosen_cells, generate, index_constraints, level_token,
    matrix_error, shown_path,
)
from harness.matrix.boundary import parse_boundary
from harness.matrix.covering.fixedsize import DEFAULT_MOVES
from harness.matrix.declared import DECLARED_TABLES, parse_declared
from harness.matrix.tables import (
    among, check_factor_name, check_keys, describe, levels_text, parse_cell_choices, parse_constraints, parse_cost,
    parse_level_table, parse_stronger, parse_workload_rules, parse_workloads, typed,
)
from harness.sut.base import no_seams
from harness.sut.levels import EngineLevels, LevelError, TableError

DEFAULT_TIMEOUT_S = 600.0
_TABLES = ("matrix", "factors", "golden", "constraints", "cost", "stronger", "workloads", "cells", "boundary",
           *DECLARED_TABLES)
_MATRIX_KEYS = ("name", "description", "engine", "mode", "strength", "search_moves", "workloads", "timeout_s")
#: the most ``[matrix] search_moves`` a file may ask for (at 0.1-0.2 ms a move, under an hour).
MAX_SEARCH_MOVES = 10_000_000


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


def named_matrix(name: str, strength: int | None = None) -> Matrix:
    """The matrix a command line names (``matrices/NAME.toml`` or a path), turned t-wise when ``strength`` is given."""
    matrix = load_matrix(name, known_workloads=WORKLOADS)
    return matrix.with_strength(strength) if strength is not None else matrix


def load_matrix(
    name_or_path: str,
    *,
    matrices_dir: Path | None = None,
    known_workloads: Collection[str] | None = None,
) -> Matrix:
    """Read and validate a matrix file; raise ``MatrixError`` on the first problem found."""
    path = resolve_matrix_path(name_or_path, matrices_dir)
    try:
        with path.open("rb") as handle:
            doc = tomllib.load(handle)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise matrix_error(path, "", f"TOML syntax error: {exc}") from exc
    header = _parse_header(path, _table(path, doc, "matrix", required=True), known_workloads)
    engine = sut.engine(header["engine"])
    check_keys(path, "", doc, (*_TABLES, *engine.tables), engine)
    factor_table = _table(path, doc, "factors", required=True)
    levels = engine.levels
    if levels.factors is None:  # the engine takes the file's factors as they are (a server's own flags)
        levels = dataclasses.replace(levels, factors=tuple(factor_table))
    factors = _parse_factors(path, factor_table, levels)
    golden_table = _table(path, doc, "golden", required=False)
    golden = _parse_golden(path, golden_table, dict(factors), levels)
    constraints = parse_constraints(path, doc.get("constraints", []), dict(factors), levels)
    cost = parse_cost(path, _table(path, doc, "cost", required=False), dict(factors), levels)
    stronger = parse_stronger(path, doc.get("stronger", []), dict(factors), header)
    rules = parse_workload_rules(path, doc.get("workloads", []), dict(factors), known_workloads, levels)
    choices = parse_cell_choices(path, doc.get("cells", []), dict(factors), header, levels)
    declared = parse_declared(path, doc, lambda key, value: parse_level_table(path, key, value, dict(factors), levels))
    boundary = parse_boundary(path, _table(path, doc, "boundary", required=False), dict(factors), levels,
                              engine.seams is not no_seams)
    loaded = {**doc, "matrix": {**doc["matrix"], "timeout_s": header["timeout_s"]}}  # the cell's timeout, default or not
    try:
        engine_args = engine.parse_tables(loaded, dict(factors), golden_table)
    except TableError as exc:
        raise matrix_error(path, exc.key, str(exc)) from exc
    matrix = Matrix(path=path, factors=factors, constraints=constraints, golden=golden, cost=cost,
                      stronger=stronger, workload_rules=rules, engine_args=engine_args, cell_choices=choices,
                      boundary=boundary, **declared, **header)
    if matrix.strength is not None:
        check_strength(matrix, matrix.strength, "[matrix] strength")
    _check_golden_allowed(matrix)
    _check_levels_reachable(matrix)
    _check_cell_choices(matrix)
    _check_workload_rules_reachable(matrix)
    return matrix


def _table(path: Path, doc: Mapping[str, object], name: str, *, required: bool) -> dict[str, object]:
    """The top-level table ``[name]`` (empty when optional and absent)."""
    if name not in doc:
        if required:
            raise matrix_error(path, f"[{name}]", "missing required table")
        return {}
    table = doc[name]
    if not isinstance(table, dict):
        raise matrix_error(path, f"[{name}]", f"expected a table, got {describe(table)}")
    return table


def _parse_header(
    path: Path, table: dict[str, object], known_workloads: Collection[str] | None
) -> dict[str, object]:
    """Validate ``[matrix]``; return the Matrix fields it holds."""
    check_keys(path, "[matrix]", table, _MATRIX_KEYS)
    for key in ("name", "mode"):
        if key not in table:
            raise matrix_error(path, f"[matrix] {key}", "missing required key")
    name, mode = table["name"], table["mode"]
    typed(path, "[matrix] name", name, (str,), "a string")
    if name != path.stem:
        raise matrix_error(path, "[matrix] name", f"{name!r} does not match the file name {path.stem!r}")
    typed(path, "[matrix] mode", mode, (str,), "a string")
    if mode not in MODES:
        raise matrix_error(path, "[matrix] mode", f"unknown mode {mode!r} (modes: {', '.join(MODES)})")
    description = table.get("description", "")
    typed(path, "[matrix] description", description, (str,), "a string")
    strength = table.get("strength")
    if strength is not None and (isinstance(strength, bool) or not isinstance(strength, int)):
        raise matrix_error(path, "[matrix] strength", f"must be an integer, got {describe(strength)}")
    if mode == "t-wise" and strength is None:
        raise matrix_error(path, "[matrix] strength", "missing (required with mode 't-wise')")
    if mode != "t-wise" and strength is not None:
        raise matrix_error(path, "[matrix] strength", f"{strength!r} given with mode {mode!r} (only for 't-wise')")
    search_moves = _parse_search_moves(path, table, mode)
    timeout_s = table.get("timeout_s", DEFAULT_TIMEOUT_S)
    typed(path, "[matrix] timeout_s", timeout_s, (int, float), "a number of seconds")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise matrix_error(path, "[matrix] timeout_s", f"{timeout_s!r} is not a positive number of seconds")
    workloads = parse_workloads(path, table.get("workloads", []), known_workloads)
    engine = table.get("engine", "reference")
    typed(path, "[matrix] engine", engine, (str,), "a string")
    try:
        sut.engine(engine)
    except sut.UnknownEngineError as exc:
        raise matrix_error(path, "[matrix] engine", str(exc)) from exc
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
        raise matrix_error(path, "[matrix] search_moves", f"must be an integer number of moves, got {describe(moves)}")
    if not 0 <= moves <= MAX_SEARCH_MOVES:
        raise matrix_error(path, "[matrix] search_moves", f"{moves} is outside 0..{MAX_SEARCH_MOVES:,} (0 turns the "
                           f"fixed-size search off)")
    return moves


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
        check_factor_name(path, key, factor, engine)
        typed(path, key, levels, (list,), "a list of levels")
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
        check_factor_name(path, f"[golden] {factor}", factor, engine)
        _check_level(path, f"[golden] {factor}", factor, level, engine)
    for factor, level in table.items():
        levels = factors.get(factor)
        if levels is None:
            raise matrix_error(path, f"[golden] {factor}", f"factor {factor!r} is not in [factors] "
                               f"(a golden level only applies to a factor of this matrix)")
        if not among(level, levels):
            raise matrix_error(path, f"[golden] {factor}", f"golden level {level!r} is not one of the "
                               f"levels in [factors] (levels: {levels_text(levels)})")
    return MappingProxyType({**engine.golden, **table})


def _check_cell_choices(matrix: Matrix) -> None:
    """Reject a ``[[cells]]`` entry that leaves a factor of several levels unnamed with no golden level among them,
    chooses a cell a constraint forbids, or chooses no cell the entries before it did not; and a level of
    ``[factors]`` in no chosen cell: a choice is explicit, and nothing it leaves out goes unsaid."""
    chosen: set[tuple[tuple[str, object], ...]] = set()
    for number, choice in enumerate(matrix.cell_choices, start=1):
        where = f"[[cells]] #{number} choose"
        for factor, levels in matrix.factors:
            if factor not in choice.choose and len(levels) > 1 and not among(matrix.golden.get(factor), levels):
                raise matrix_error(matrix.path, where, f"factor {factor!r} is not named and has no golden level among "
                                   f"its levels ({levels_text(levels)}): name the level or levels it runs at")
        cells = chosen_cells(matrix, choice)
        for cell in cells:
            culprit = next(((i, c) for i, c in enumerate(matrix.constraints, start=1) if c.forbids(cell.as_dict())), None)
            if culprit is not None:
                raise matrix_error(matrix.path, where, f"chooses {cell.cell_id}, which [[constraints]] #{culprit[0]} "
                                   f"forbids ({culprit[1].reason})")
        if chosen.issuperset(cell.factors for cell in cells):
            raise matrix_error(matrix.path, where, "chooses no cell that the entries before it do not")
        chosen.update(cell.factors for cell in cells)
    for f, (factor, levels) in enumerate(matrix.factors if matrix.mode == "cells" else ()):
        for level in levels:
            if not any(among(level, [cell[f][1]]) for cell in chosen):
                raise matrix_error(matrix.path, f"[factors] {factor}", f"level {level!r} is in no cell [[cells]] "
                                   f"chooses (name it in an entry, or take it out of [factors])")


def _check_workload_rules_reachable(matrix: Matrix) -> None:
    """Reject a ``[[workloads]]`` entry no allowed row (in mode ``cells``, no chosen cell) can match: it would
    silently never apply."""
    if matrix.mode == "cells":
        cells = generate(matrix)
        for number, rule in enumerate(matrix.workload_rules, start=1):
            if not any(rule.matches(cell.as_dict()) for cell in cells):
                raise matrix_error(matrix.path, f"[[workloads]] #{number} when", "no cell [[cells]] chooses has these "
                                   "levels")
        return
    allowed = index_constraints(matrix)
    names = [factor for factor, _ in matrix.factors]
    for number, rule in enumerate(matrix.workload_rules, start=1):
        choices = [[(names.index(f), levels.index(lv)) for lv in rule.when[f]] if f in rule.when else [None]
                   for f, levels in matrix.factors]
        for combination in itertools.product(*choices):
            partial = [-1] * len(names)
            for picked in filter(None, combination):
                partial[picked[0]] = picked[1]
            if allowed.extendable(partial):
                break
        else:
            raise matrix_error(matrix.path, f"[[workloads]] #{number} when",
                               "no allowed cell has these levels (the constraints forbid them all)")


def _check_golden_allowed(matrix: Matrix) -> None:
    """Reject constraints that forbid every row, or the golden cell every cell is compared with."""
    golden = matrix.golden_cell().as_dict()
    if matrix.allows(golden):
        return
    if not index_constraints(matrix).extendable([-1] * len(matrix.factors)):
        raise matrix_error(matrix.path, "[[constraints]]", "every row is forbidden")
    number, culprit = next((i, c) for i, c in enumerate(matrix.constraints, start=1) if c.forbids(golden))
    raise matrix_error(matrix.path, "[golden]", f"the golden cell {matrix.golden_cell().cell_id} is forbidden "
                       f"by [[constraints]] #{number} ({culprit.reason})")


def _check_levels_reachable(matrix: Matrix) -> None:
    """Reject a level that no allowed row has: the constraints would silently keep it from ever running."""
    allowed = index_constraints(matrix)
    for f, (factor, levels) in enumerate(matrix.factors):
        for i, level in enumerate(levels):
            partial = [-1] * len(matrix.factors)
            partial[f] = i
            if not allowed.extendable(partial):
                culprits = [f"#{n}" for n, c in enumerate(matrix.constraints, start=1) if among(level, c.forbid.get(factor, ()))]
                raise matrix_error(matrix.path, f"[factors] {factor}", f"level {level!r} is in no allowed row: "
                                   f"[[constraints]] {', '.join(culprits) or '(together)'} forbid every row with it")
