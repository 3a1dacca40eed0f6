"""Matrix files: load and validate a TOML matrix, then generate its cells (full, t-wise, ofat).

A matrix names factors and their levels, forbidden combinations (each with a reason), the
golden level of some factors, and the relative cost of some levels (t-wise mode puts dear
levels in as few cells as coverage allows). Every problem in a file is reported as one
``MatrixError`` line naming the file, the key and the value at fault, before any cell runs.
Generation is deterministic: the same file gives the same cells, in the same order, with
the same ids.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import re
import tomllib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from harness import covering
from reference_impl.registry import UnknownLevelError, check_level, known_factors

#: golden level of each factor unless the file's ``[golden]`` table says otherwise.
DEFAULT_GOLDEN: Mapping[str, object] = MappingProxyType(
    {"pool": "static", "backend": "torch", "cache": "off", "scheduler": "fcfs", "page_size": 1,
     "prefill_budget": 128, "deterministic": "on", "poison": "off",
     "spec": "none"}
)
MODES = ("full", "t-wise", "ofat")
DEFAULT_TIMEOUT_S = 600.0
_TABLES = ("matrix", "factors", "golden", "constraints", "cost")
_MATRIX_KEYS = ("name", "description", "mode", "strength", "workloads", "timeout_s")
_CONSTRAINT_KEYS = ("forbid", "reason")


_ABSENT = object()


class MatrixError(ValueError):
    """A matrix file (or a request made of it) is invalid; the message is one line naming the input."""


@dataclass(frozen=True, slots=True)
class Constraint:
    """A forbidden combination: a row is forbidden when every named factor is at a listed level."""

    forbid: Mapping[str, tuple[object, ...]]
    reason: str

    def forbids(self, row: Mapping[str, object]) -> bool:
        """Whether ``row`` (factor → level, all named factors present) matches this constraint."""
        return all(row[factor] in levels for factor, levels in self.forbid.items())


@dataclass(frozen=True, slots=True)
class Cell:
    """One configuration: a level for every factor of the matrix, in file order."""

    factors: tuple[tuple[str, object], ...]

    @property
    def cell_id(self) -> str:
        """Stable id usable in ``pytest -k``: ``model:dense-cache:device-page_size:16``."""
        return "-".join(f"{factor}:{level_token(level)}" for factor, level in self.factors)

    def level(self, factor: str) -> object:
        """This cell's level of ``factor``."""
        for name, level in self.factors:
            if name == factor:
                return level
        raise KeyError(f"cell {self.cell_id} has no factor {factor!r}")

    def as_dict(self) -> dict[str, object]:
        """Factor → level, in file order."""
        return dict(self.factors)


@dataclass(frozen=True, slots=True)
class MatrixSpec:
    """A validated matrix file."""

    name: str
    path: Path
    description: str
    mode: str
    strength: int | None
    factors: tuple[tuple[str, tuple[object, ...]], ...]
    constraints: tuple[Constraint, ...]
    golden: Mapping[str, object]
    workloads: tuple[str, ...]
    timeout_s: float
    #: factor → level → relative cost of a cell at that level (``[cost]``; unlisted levels cost 1).
    cost: Mapping[str, Mapping[object, float]]

    def allows(self, row: Mapping[str, object]) -> bool:
        """Whether no constraint forbids ``row``."""
        return not any(constraint.forbids(row) for constraint in self.constraints)

    def cost_of(self, cell: Cell) -> float:
        """A cell's cost: the sum over its factors of its level's ``[cost]`` (1 when unlisted)."""
        return math.fsum(self.cost.get(factor, {}).get(level, 1.0) for factor, level in cell.factors)

    def golden_cell(self) -> Cell:
        """The matrix cell closest to golden: golden levels where they are levels of the matrix, else the first."""
        return Cell(tuple(
            (factor, self.golden[factor] if self.golden.get(factor, _ABSENT) in levels else levels[0])
            for factor, levels in self.factors
        ))

    def golden_of(self, cell: Cell) -> Cell:
        """The cell ``cell`` is compared with: every factor that has a golden level set to it."""
        return Cell(tuple((factor, self.golden.get(factor, level)) for factor, level in cell.factors))

    def with_strength(self, t: int) -> MatrixSpec:
        """This matrix as a t-wise matrix of strength ``t`` (the CLI's ``--strength``)."""
        _check_strength(self, t, "--strength")
        return dataclasses.replace(self, mode="t-wise", strength=t)


@dataclass(frozen=True, slots=True)
class CoverageReport:
    """How many allowed t-tuples a list of cells covers, and which it misses."""

    strength: int
    required: int
    covered: int
    missing: tuple[tuple[tuple[str, object], ...], ...]

    @property
    def ok(self) -> bool:
        """Whether every allowed t-tuple is covered."""
        return not self.missing


def level_token(level: object) -> str:
    """A level as it appears in a cell id: an import path ``pkg.mod:Cls`` shows as ``Cls``."""
    return re.sub(r"[^\w.+]", "_", str(level).rpartition(":")[2])


def resolve_matrix_path(name_or_path: str, matrices_dir: Path | None = None) -> Path:
    """``smoke`` → ``<matrices_dir>/smoke.toml``; a ``.toml`` path is used as is; it must exist."""
    if name_or_path.endswith(".toml"):
        path = Path(name_or_path)
    else:
        path = (matrices_dir or Path.cwd() / "matrices") / f"{name_or_path}.toml"
    if not path.is_file():
        available = sorted(p.stem for p in path.parent.glob("*.toml")) if path.parent.is_dir() else []
        raise _error(path, "", f"no such matrix (available in {_shown(path.parent)}: "
                                   f"{', '.join(available) or 'none'})")
    return path


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
        raise _error(path, "", f"TOML syntax error: {exc}") from exc
    _check_keys(path, "", doc, _TABLES)
    header = _parse_header(path, _table(path, doc, "matrix", required=True), known_workloads)
    factors = _parse_factors(path, _table(path, doc, "factors", required=True))
    golden = _parse_golden(path, _table(path, doc, "golden", required=False), dict(factors))
    constraints = _parse_constraints(path, doc.get("constraints", []), dict(factors))
    cost = _parse_cost(path, _table(path, doc, "cost", required=False), dict(factors))
    spec = MatrixSpec(path=path, factors=factors, constraints=constraints, golden=golden, cost=cost, **header)
    if spec.strength is not None:
        _check_strength(spec, spec.strength, "[matrix] strength")
    _check_golden_allowed(spec)
    return spec


def generate(spec: MatrixSpec) -> list[Cell]:
    """The cells of ``spec`` in its mode, never a forbidden or duplicate one, in a stable order."""
    if spec.mode == "full":
        rows = itertools.product(*(levels for _, levels in spec.factors))
        cells = [_cell(spec, row) for row in rows]
        return [cell for cell in cells if spec.allows(cell.as_dict())]
    if spec.mode == "t-wise":
        assert spec.strength is not None  # load_matrix requires it for t-wise
        try:
            rows = covering.covering_array(_domains(spec), spec.strength, _index_predicate(spec),
                                           cost=_index_cost(spec))
        except ValueError as exc:
            raise _error(spec.path, "[factors]", str(exc)) from exc
        return [_cell_of_indices(spec, row) for row in rows]
    if spec.mode == "ofat":
        return _one_factor_at_a_time(spec)
    raise _error(spec.path, "[matrix] mode", f"unknown mode {spec.mode!r} (modes: {', '.join(MODES)})")


def coverage(spec: MatrixSpec, cells: Sequence[Cell], t: int) -> CoverageReport:
    """Count the allowed t-tuples and which of them the allowed ``cells`` cover."""
    _check_strength(spec, t, "t")
    domains, allowed = _domains(spec), _index_predicate(spec)
    rows = [_indices_of(spec, cell) for cell in cells]
    required = len(covering.allowed_tuples(domains, t, allowed))
    missing = tuple(
        tuple((spec.factors[f][0], spec.factors[f][1][level]) for f, level in ttuple)
        for ttuple in covering.missing_tuples(rows, domains, t, allowed)
    )
    return CoverageReport(strength=t, required=required, covered=required - len(missing), missing=missing)


def lower_bound(spec: MatrixSpec, t: int) -> int:
    """Product of the t largest level counts: the fewest cells any unconstrained t-wise matrix needs."""
    _check_strength(spec, t, "t")
    return covering.lower_bound(_domains(spec), t)


# --- generation helpers -------------------------------------------------------------------


def _cell(spec: MatrixSpec, levels: Sequence[object]) -> Cell:
    """The cell with ``levels`` in the matrix's factor order."""
    return Cell(tuple(zip((factor for factor, _ in spec.factors), levels)))


def _domains(spec: MatrixSpec) -> list[int]:
    """Number of levels of each factor, in file order."""
    return [len(levels) for _, levels in spec.factors]


def _cell_of_indices(spec: MatrixSpec, row: Sequence[int]) -> Cell:
    """The cell whose levels are the given level indices."""
    return _cell(spec, [levels[i] for (_, levels), i in zip(spec.factors, row)])


def _indices_of(spec: MatrixSpec, cell: Cell) -> tuple[int, ...]:
    """Level indices of ``cell``, which must have exactly this matrix's factors and levels."""
    names = tuple(factor for factor, _ in cell.factors)
    if names != tuple(factor for factor, _ in spec.factors):
        raise _error(spec.path, "cell", f"{cell.cell_id} has factors {names}, not the matrix's")
    try:
        return tuple(levels.index(level) for (_, levels), (_, level) in zip(spec.factors, cell.factors))
    except ValueError as exc:
        raise _error(spec.path, "cell", f"{cell.cell_id} has a level outside the matrix") from exc


def _index_predicate(spec: MatrixSpec) -> Callable[[tuple[int, ...]], bool]:
    """``spec.allows`` on level indices: each constraint as (factor position, forbidden indices)."""
    positions = {factor: i for i, (factor, _) in enumerate(spec.factors)}
    rules = [
        [(positions[f], frozenset(spec.factors[positions[f]][1].index(lv) for lv in levels))
         for f, levels in constraint.forbid.items()]
        for constraint in spec.constraints
    ]
    return lambda row: not any(all(row[p] in hit for p, hit in rule) for rule in rules)


def _index_cost(spec: MatrixSpec) -> Callable[[tuple[int, ...]], float] | None:
    """``spec.cost_of`` on level indices, or None without a ``[cost]`` table (rows as before)."""
    if not spec.cost:
        return None
    weights = [[spec.cost.get(factor, {}).get(level, 1.0) for level in levels] for factor, levels in spec.factors]
    return lambda row: math.fsum(w[i] for w, i in zip(weights, row))


def _one_factor_at_a_time(spec: MatrixSpec) -> list[Cell]:
    """The golden cell, then each other level of each factor with the rest at golden."""
    base = spec.golden_cell()
    cells = [base]
    for i, (factor, levels) in enumerate(spec.factors):
        for level in levels:
            if level == base.factors[i][1]:
                continue
            cell = Cell((*base.factors[:i], (factor, level), *base.factors[i + 1:]))
            if spec.allows(cell.as_dict()):
                cells.append(cell)
    return cells


# --- validation helpers ---------------------------------------------------------------------


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is under it (shorter messages)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _error(path: Path, key: str, message: str) -> MatrixError:
    """A one-line ``MatrixError``: ``<file>: <key>: <message>`` (no key for whole-file problems)."""
    text = f"{_shown(path)}: {key}: {message}" if key else f"{_shown(path)}: {message}"
    return MatrixError(" ".join(text.splitlines()))


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
            raise _error(path, name, f"unknown {kind} (known: {', '.join(allowed)})")


def _table(path: Path, doc: Mapping[str, object], name: str, *, required: bool) -> dict[str, object]:
    """The top-level table ``[name]`` (empty when optional and absent)."""
    if name not in doc:
        if required:
            raise _error(path, f"[{name}]", "missing required table")
        return {}
    table = doc[name]
    if not isinstance(table, dict):
        raise _error(path, f"[{name}]", f"expected a table, got {_describe(table)}")
    return table


def _typed(path: Path, key: str, value: object, kinds: tuple[type, ...], what: str) -> None:
    """Reject ``value`` unless it is one of ``kinds`` (bools are never numbers here)."""
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise _error(path, key, f"expected {what}, got {_describe(value)}")


def _parse_header(
    path: Path, table: dict[str, object], known_workloads: Collection[str] | None
) -> dict[str, object]:
    """Validate ``[matrix]``; return the MatrixSpec fields it holds."""
    _check_keys(path, "[matrix]", table, _MATRIX_KEYS)
    for key in ("name", "mode"):
        if key not in table:
            raise _error(path, f"[matrix] {key}", "missing required key")
    name, mode = table["name"], table["mode"]
    _typed(path, "[matrix] name", name, (str,), "a string")
    if name != path.stem:
        raise _error(path, "[matrix] name", f"{name!r} does not match the file name {path.stem!r}")
    _typed(path, "[matrix] mode", mode, (str,), "a string")
    if mode not in MODES:
        raise _error(path, "[matrix] mode", f"unknown mode {mode!r} (modes: {', '.join(MODES)})")
    description = table.get("description", "")
    _typed(path, "[matrix] description", description, (str,), "a string")
    strength = table.get("strength")
    if mode == "t-wise" and strength is None:
        raise _error(path, "[matrix] strength", "missing (required with mode 't-wise')")
    if mode != "t-wise" and strength is not None:
        raise _error(path, "[matrix] strength", f"{strength!r} given with mode {mode!r} (only for 't-wise')")
    timeout_s = table.get("timeout_s", DEFAULT_TIMEOUT_S)
    _typed(path, "[matrix] timeout_s", timeout_s, (int, float), "a number of seconds")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise _error(path, "[matrix] timeout_s", f"{timeout_s!r} is not a positive number of seconds")
    workloads = _parse_workloads(path, table.get("workloads", []), known_workloads)
    return {"name": name, "description": description, "mode": mode, "strength": strength,
            "workloads": workloads, "timeout_s": float(timeout_s)}


def _parse_workloads(path: Path, value: object, known: Collection[str] | None) -> tuple[str, ...]:
    """Validate ``[matrix] workloads``: distinct names, known ones when the caller says which."""
    key = "[matrix] workloads"
    _typed(path, key, value, (list,), "a list of workload names")
    assert isinstance(value, list)
    for i, workload in enumerate(value):
        _typed(path, key, workload, (str,), "a workload name (string)")
        if workload in value[:i]:
            raise _error(path, key, f"duplicate workload {workload!r}")
        if known is not None and workload not in known:
            raise _error(path, key, f"unknown workload {workload!r} (known: {', '.join(sorted(known))})")
    return tuple(value)


def _check_factor_name(path: Path, key: str, factor: str) -> None:
    """Reject a factor the registry does not know."""
    if factor not in known_factors():
        raise _error(path, key, f"unknown factor (known: {', '.join(known_factors())})")


def _check_registry_level(path: Path, key: str, factor: str, level: object) -> None:
    """Reject a level the registry rejects, with its message."""
    try:
        check_level(factor, level)
    except UnknownLevelError as exc:
        raise _error(path, key, str(exc)) from exc
    except KeyError as exc:
        raise _error(path, key, f"unknown factor (known: {', '.join(known_factors())})") from exc


def _parse_factors(path: Path, table: dict[str, object]) -> tuple[tuple[str, tuple[object, ...]], ...]:
    """Validate ``[factors]``: known factors, each with distinct valid levels and distinct id tokens."""
    if not table:
        raise _error(path, "[factors]", "no factors (a matrix needs at least one)")
    factors = []
    for factor, levels in table.items():
        key = f"[factors] {factor}"
        _check_factor_name(path, key, factor)
        _typed(path, key, levels, (list,), "a list of levels")
        assert isinstance(levels, list)
        if not levels:
            raise _error(path, key, "empty level list")
        tokens: dict[str, object] = {}
        for i, level in enumerate(levels):
            _check_registry_level(path, key, factor, level)
            if level in levels[:i]:
                raise _error(path, key, f"duplicate level {level!r}")
            token = level_token(level)
            if not token:
                raise _error(path, key, f"level {level!r} has no name after ':' to show in cell ids")
            if token in tokens:
                raise _error(path, key, f"level {level!r} has the same cell-id name {token!r} "
                                        f"as {tokens[token]!r}")
            tokens[token] = level
        factors.append((factor, tuple(levels)))
    return tuple(factors)


def _parse_golden(
    path: Path, table: dict[str, object], factors: dict[str, tuple[object, ...]]
) -> Mapping[str, object]:
    """Validate ``[golden]`` over ``DEFAULT_GOLDEN``: a matrix factor's golden level is one of its levels."""
    for factor, level in table.items():
        _check_factor_name(path, f"[golden] {factor}", factor)
        _check_registry_level(path, f"[golden] {factor}", factor, level)
    for factor, level in table.items():
        levels = factors.get(factor)
        if levels is not None and not _among(level, levels):
            raise _error(path, f"[golden] {factor}", f"golden level {level!r} is not one of the "
                                                    f"levels in [factors] (levels: {_levels_text(levels)})")
    return MappingProxyType({**DEFAULT_GOLDEN, **table})


def _among(level: object, levels: Sequence[object]) -> bool:
    """``level in levels`` without ``True == 1`` or ``1.0 == 1`` surprises."""
    return any(type(level) is type(candidate) and level == candidate for candidate in levels)


def _parse_constraints(
    path: Path, value: object, factors: dict[str, tuple[object, ...]]
) -> tuple[Constraint, ...]:
    """Validate every ``[[constraints]]`` entry."""
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise _error(path, "[[constraints]]", f"expected an array of tables, got {_describe(value)}")
    return tuple(_parse_constraint(path, f"[[constraints]] #{i}", entry, factors)
                 for i, entry in enumerate(value, start=1))


def _parse_constraint(
    path: Path, where: str, entry: dict[str, object], factors: dict[str, tuple[object, ...]]
) -> Constraint:
    """Validate one constraint: a non-empty ``forbid`` over the matrix's levels and a reason."""
    _check_keys(path, where, entry, _CONSTRAINT_KEYS)
    for key in _CONSTRAINT_KEYS:
        if key not in entry:
            raise _error(path, f"{where} {key}", "missing required key")
    reason, forbid = entry["reason"], entry["forbid"]
    _typed(path, f"{where} reason", reason, (str,), "a non-empty string")
    if not reason.strip():
        raise _error(path, f"{where} reason", "empty reason (say why the combination is forbidden)")
    _typed(path, f"{where} forbid", forbid, (dict,), "a table of factor = level(s)")
    assert isinstance(forbid, dict)
    if not forbid:
        raise _error(path, f"{where} forbid", "empty (it would forbid every row)")
    parsed: dict[str, tuple[object, ...]] = {}
    for factor, wanted in forbid.items():
        key = f"{where} forbid.{factor}"
        if factor not in factors:
            _check_factor_name(path, key, factor)
            raise _error(path, key, f"factor {factor!r} is not in [factors]")
        levels = factors[factor]
        listed = wanted if isinstance(wanted, list) else [wanted]
        if not listed:
            raise _error(path, key, "empty level list")
        for i, level in enumerate(listed):
            if not _among(level, levels):
                raise _error(path, key, f"unknown level {level!r} (levels: {_levels_text(levels)})")
            if level in listed[:i]:
                raise _error(path, key, f"duplicate level {level!r}")
        parsed[factor] = tuple(listed)
    return Constraint(forbid=MappingProxyType(parsed), reason=reason)


def _parse_cost(
    path: Path, table: dict[str, object], factors: dict[str, tuple[object, ...]]
) -> Mapping[str, Mapping[object, float]]:
    """Validate ``[cost]``: factor = { level = cost }, over the matrix's levels, each cost a positive number."""
    parsed: dict[str, Mapping[object, float]] = {}
    for factor, entry in table.items():
        key = f"[cost] {factor}"
        if factor not in factors:
            _check_factor_name(path, key, factor)
            raise _error(path, key, f"factor {factor!r} is not in [factors]")
        _typed(path, key, entry, (dict,), "a table of level = cost")
        assert isinstance(entry, dict)
        levels = factors[factor]
        by_name = {str(level): level for level in levels}  # TOML keys are strings: page_size = { 16 = 3 }
        costs: dict[object, float] = {}
        for name, value in entry.items():
            if name not in by_name:
                raise _error(path, f"{key}.{name}", f"unknown level {name!r} (levels: {_levels_text(levels)})")
            _typed(path, f"{key}.{name}", value, (int, float), "a positive number")
            if not (math.isfinite(value) and value > 0):
                raise _error(path, f"{key}.{name}", f"{value!r} is not a positive finite cost")
            costs[by_name[name]] = float(value)
        parsed[factor] = MappingProxyType(costs)
    return MappingProxyType(parsed)


def _check_strength(spec: MatrixSpec, t: object, key: str) -> None:
    """Reject a strength that is not an int in 1..number of factors."""
    k = len(spec.factors)
    if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= k:
        raise _error(spec.path, key, f"{t!r} is out of range 1..{k} (the number of factors)")


def _check_golden_allowed(spec: MatrixSpec) -> None:
    """Reject constraints that forbid every row, or the golden cell every cell is compared with."""
    golden = spec.golden_cell().as_dict()
    if spec.allows(golden):
        return
    if not _some_row_allowed(spec, {}):
        raise _error(spec.path, "[[constraints]]", "every row is forbidden")
    number, culprit = next((i, c) for i, c in enumerate(spec.constraints, start=1) if c.forbids(golden))
    raise _error(spec.path, "[golden]", f"the golden cell {spec.golden_cell().cell_id} is forbidden "
                                        f"by [[constraints]] #{number} ({culprit.reason})")


def _some_row_allowed(spec: MatrixSpec, prefix: dict[str, object]) -> bool:
    """Depth-first search for an allowed row extending ``prefix``, pruned where a constraint bites."""
    if len(prefix) == len(spec.factors):
        return True
    factor, levels = spec.factors[len(prefix)]
    for level in levels:
        row = {**prefix, factor: level}
        if not any(set(c.forbid) <= row.keys() and c.forbids(row) for c in spec.constraints):
            if _some_row_allowed(spec, row):
                return True
    return False
