"""Matrices: the validated model of a matrix file, and its cells (full, t-wise, ofat, cells).

A matrix names factors and their levels, forbidden combinations (each with a reason), the
golden level of some factors, the relative cost of some levels (t-wise mode puts dear
levels in as few cells as coverage allows), and in mode ``cells`` the level combinations chosen to run.
``harness.matrix.file`` reads and validates the TOML; this module generates the cells. Generation is deterministic: the same file gives the
same cells, in the same order, with the same ids.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from harness import oracles
from harness.matrix import covering
from harness.matrix.covering import net
from harness.matrix.errors import MatrixError as MatrixError, matrix_error, shown_path as shown_path  # re-exported
from harness.matrix.known import Expected, Mask, Tolerance, masks, matches
from harness.sut.host import cpu_flags

MODES = ("full", "t-wise", "ofat", "cells")
_ABSENT = object()


@dataclass(frozen=True, slots=True)
class Constraint:
    """A forbidden combination: a row is forbidden when every named factor is at a listed level."""

    forbid: Mapping[str, tuple[object, ...]]
    reason: str

    def forbids(self, row: Mapping[str, object]) -> bool:
        """Whether ``row`` (factor → level, all named factors present) matches this constraint."""
        return all(row[factor] in levels for factor, levels in self.forbid.items())


@dataclass(frozen=True, slots=True)
class WorkloadRule:
    """``[[workloads]]``: cells whose every named factor is at a listed level run ``run`` instead of the default."""

    when: Mapping[str, tuple[object, ...]]
    run: tuple[str, ...]
    reason: str

    def matches(self, row: Mapping[str, object]) -> bool:
        return matches(self.when, row)


@dataclass(frozen=True, slots=True)
class CellChoice:
    """``[[cells]]``: cells chosen to run (a budget's choice, never a constraint): the product of the levels ``choose``
    names, every factor it does not name at its golden level."""

    choose: Mapping[str, tuple[object, ...]]
    reason: str


@dataclass(frozen=True, slots=True)
class Cell:
    """One configuration: a level for every factor of the matrix, in file order."""

    factors: tuple[tuple[str, object], ...]

    @property
    def cell_id(self) -> str:
        """Stable id usable in ``pytest -k``: ``/model:dense/cache:device/page_size:16/``.

        Every factor:level pair has a ``/`` on both sides because ``-k`` matches substrings:
        ``-k "/page_size:1/"`` selects page_size 1 and never 16, ``-k "/tp:2/"`` never matches
        ``/decode_tp:2/``. ``/`` and ``:`` are identifier characters in pytest's ``-k`` grammar, no
        factor name or level token (``level_token``) contains them, and unlike ``[...]`` they
        leave pytest's node ids (``--lf``) alone.
        """
        return "".join(f"/{factor}:{level_token(level)}" for factor, level in self.factors) + "/"

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
class BoundarySettings:
    """How the boundary family runs in a matrix's cells: draws per cell, the shrink's run budget, shapes per draw, the
    longest sequence, and the levels of the cells that draw (empty: every cell)."""

    draws: int = 3
    shrink_runs: int = 40
    shapes: int = 4
    max_tokens: int = 256
    when: dict[str, tuple[object, ...]] = dataclasses.field(default_factory=dict)  # plain: a plan carrying it is pickled

    def applies(self, row: Mapping[str, object]) -> bool:
        """Whether a cell with these levels draws."""
        return not self.when or matches(self.when, row)


@dataclass(frozen=True, slots=True)
class Matrix:
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
    #: ``[[stronger]]``: factor groups covered at a higher strength inside the t-wise matrix.
    stronger: tuple[tuple[tuple[str, ...], int], ...] = ()
    #: ``[[workloads]]``: per-cell workloads by level, first match wins; other cells run ``workloads``.
    workload_rules: tuple[WorkloadRule, ...] = ()
    #: the system under test (``[matrix] engine``): a name in ``harness.sut.known()`` or an import path to an Engine.
    engine: str = "reference"
    #: ``[matrix] search_moves``: the move budget of the covering array's fixed-size search (t-wise).
    search_moves: int = covering.DEFAULT_MOVES
    #: ``[[expected]]``, ``[[tolerances]]``, ``[engine_args]`` (``harness.matrix.declared``).
    expected: tuple[Expected, ...] = ()
    tolerances: tuple[Tolerance, ...] = ()
    engine_args: Mapping[str, object] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    #: ``[[cells]]``: in mode ``cells``, the cells chosen to run; the rest of the product runs only when ``--cell`` names it.
    cell_choices: tuple[CellChoice, ...] = ()
    #: ``[boundary]``: the boundary family drawn per cell (``harness.matrix.boundary``); None: fixed workloads only.
    boundary: BoundarySettings | None = None

    def expected_for(self, cell: Cell) -> dict | None:
        """The known failures ``cell`` is judged against: every ``[[expected]]`` entry it matches, merged (their
        patterns, the union of what fails, their reasons, each declaration whole); None when it matches none."""
        matched = self.known_for(cell)
        if not matched:
            return None
        return {"when": [entry.to_json()["when"] for entry in matched],
                "fails": list(dict.fromkeys(name for entry in matched for name in entry.fails)),
                "reason": " | ".join(entry.reason for entry in matched),
                "declarations": [entry.to_json() for entry in matched]}

    def known_for(self, cell: Cell) -> tuple[Expected, ...]:
        """Every ``[[expected]]`` entry ``cell`` matches on this machine's CPU, in file order."""
        row, flags = cell.as_dict(), cpu_flags()
        return tuple(entry for entry in self.expected if entry.matches(row, flags))

    def masks(self) -> tuple[Mask, ...]:
        """The cell patterns its ``[[expected]]`` entries leave no oracle to judge (``harness.matrix.known.masks``)."""
        return masks(self.expected, oracles.names())

    def tolerances_for(self, cell: Cell) -> tuple[Tolerance, ...]:
        """Every ``[[tolerances]]`` entry ``cell`` matches (the loosest of each applies)."""
        row = cell.as_dict()
        return tuple(entry for entry in self.tolerances if entry.matches(row))

    def workloads_for(self, cell: Cell) -> tuple[str, ...]:
        """The workloads ``cell`` runs: those of the first ``[[workloads]]`` entry it matches, else ``workloads``."""
        row = cell.as_dict()
        return next((rule.run for rule in self.workload_rules if rule.matches(row)), self.workloads)

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

    def with_strength(self, t: int) -> Matrix:
        """This matrix as a t-wise matrix of strength ``t`` (the CLI's ``--strength``)."""
        check_strength(self, t, "--strength")
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


def generate(matrix: Matrix) -> list[Cell]:
    """The cells of ``matrix`` in its mode, never a forbidden or duplicate one, in a stable order."""
    return generate_certified(matrix)[0]


def generate_certified(matrix: Matrix) -> tuple[list[Cell], covering.Covering | None]:
    """The cells of ``matrix`` and, in t-wise mode, the covering array's certificate (bound, optimality, method):
    the array is the first ``len(certificate.rows)`` cells, those after it are added net of masking."""
    if matrix.mode == "full":
        rows = itertools.product(*(levels for _, levels in matrix.factors))
        cells = [_cell(matrix, row) for row in rows]
        return [cell for cell in cells if matrix.allows(cell.as_dict())], None
    if matrix.mode == "t-wise":
        assert matrix.strength is not None  # load_matrix requires it for t-wise
        try:
            result = covering.solve(_domains(matrix), matrix.strength, index_constraints(matrix), cost=_index_cost(matrix),
                                    stronger=stronger_groups(matrix), moves=matrix.search_moves)
        except ValueError as exc:
            raise matrix_error(matrix.path, "[factors]", str(exc)) from exc
        rows = [*result.rows, *_net_of_masking(matrix, result.rows)]
        return [_cell_of_indices(matrix, row) for row in rows], result
    if matrix.mode == "ofat":
        return _one_factor_at_a_time(matrix), None
    if matrix.mode == "cells":
        chosen = {cell.factors: cell for choice in matrix.cell_choices for cell in chosen_cells(matrix, choice)}
        return sorted(chosen.values(), key=lambda cell: _indices_of(matrix, cell)), None
    raise matrix_error(matrix.path, "[matrix] mode", f"unknown mode {matrix.mode!r} (modes: {', '.join(MODES)})")


def _net_of_masking(matrix: Matrix, rows: Sequence[covering.Row]) -> list[covering.Row]:
    """The rows to append to the covering array ``rows`` until every allowed t-tuple a judged cell can hold is held
    by one: a cell ``[[expected]]`` masks whole is judged by no oracle, so the tuples it alone held were covered by
    nothing that can fail (``harness.matrix.covering.net``). The array's own cells keep their places and ids."""
    assert matrix.strength is not None
    clauses = index_clauses(matrix, [mask.when for mask in matrix.masks()])
    if not clauses:
        return []
    return net.extend(rows, _domains(matrix), matrix.strength, index_constraints(matrix), clauses,
                      stronger_groups(matrix), matrix.search_moves).added


def coverage(matrix: Matrix, cells: Sequence[Cell], t: int) -> CoverageReport:
    """Count the allowed t-tuples (and ``[[stronger]]`` groups' tuples) and which of them the allowed ``cells`` cover."""
    check_strength(matrix, t, "t")
    domains, allowed = _domains(matrix), index_constraints(matrix)
    rows = [_indices_of(matrix, cell) for cell in cells]
    stronger = stronger_groups(matrix)
    required = len(covering.allowed_tuples(domains, t, allowed, stronger))
    missing = tuple(
        tuple((matrix.factors[f][0], matrix.factors[f][1][level]) for f, level in ttuple)
        for ttuple in covering.missing_tuples(rows, domains, t, allowed, stronger)
    )
    return CoverageReport(strength=t, required=required, covered=required - len(missing), missing=missing)


def ofat_coverage(matrix: Matrix, cells: Sequence[Cell]) -> CoverageReport:
    """What one factor at a time promises, and which of it ``cells`` hold: the golden cell, and each allowed level
    of each factor in a cell whose every other factor is at its golden level (strength 1: one level per tuple;
    the golden cell counts as the tuple of no level)."""
    base = matrix.golden_cell()
    required: list[tuple[tuple[str, object], ...]] = [()]
    for i, (factor, levels) in enumerate(matrix.factors):
        for level in levels:
            if level != base.factors[i][1] and matrix.allows(changed(base, ((factor, level),)).as_dict()):
                required.append(((factor, level),))
    held = {cell.factors for cell in cells}
    missing = tuple(change for change in required if changed(base, change).factors not in held)
    return CoverageReport(strength=1, required=len(required), covered=len(required) - len(missing), missing=missing)


def chosen_cells(matrix: Matrix, choice: CellChoice) -> list[Cell]:
    """The cells one ``[[cells]]`` entry chooses: its named levels crossed, every other factor at its golden cell's
    level (the file loads only where that is its golden level or its one level); ``generate`` puts them in order."""
    base = matrix.golden_cell().factors
    rows = itertools.product(*(choice.choose.get(factor, (level,)) for factor, level in base))
    return [_cell(matrix, row) for row in rows]


def changed(base: Cell, change: tuple[tuple[str, object], ...]) -> Cell:
    """``base`` with the levels of ``change`` in place of its own."""
    levels = dict(change)
    return Cell(tuple((factor, levels.get(factor, level)) for factor, level in base.factors))


def lower_bound(matrix: Matrix, t: int) -> int:
    """The most allowed tuples on one set of t factors (or of a ``[[stronger]]`` group's s factors): each
    cell holds one, so no matrix covering them has fewer cells."""
    check_strength(matrix, t, "t")
    domains = _domains(matrix)
    space = covering.TupleSpace(domains, covering.interactions(domains, t, stronger_groups(matrix)))
    return space.counting_bound(covering.required_mask(space, index_constraints(matrix)))


def _cell(matrix: Matrix, levels: Sequence[object]) -> Cell:
    """The cell with ``levels`` in the matrix's factor order."""
    return Cell(tuple(zip((factor for factor, _ in matrix.factors), levels)))


def _domains(matrix: Matrix) -> list[int]:
    """Number of levels of each factor, in file order."""
    return [len(levels) for _, levels in matrix.factors]


def _cell_of_indices(matrix: Matrix, row: Sequence[int]) -> Cell:
    """The cell whose levels are the given level indices."""
    return _cell(matrix, [levels[i] for (_, levels), i in zip(matrix.factors, row)])


def _indices_of(matrix: Matrix, cell: Cell) -> tuple[int, ...]:
    """Level indices of ``cell``, which must have exactly this matrix's factors and levels."""
    names = tuple(factor for factor, _ in cell.factors)
    if names != tuple(factor for factor, _ in matrix.factors):
        raise matrix_error(matrix.path, "cell", f"{cell.cell_id} has factors {names}, not the matrix's")
    try:
        return tuple(levels.index(level) for (_, levels), (_, level) in zip(matrix.factors, cell.factors))
    except ValueError as exc:
        raise matrix_error(matrix.path, "cell", f"{cell.cell_id} has a level outside the matrix") from exc


def stronger_groups(matrix: Matrix) -> list[tuple[tuple[int, ...], int]]:
    """``[[stronger]]`` as (factor positions, strength), the form the generator takes."""
    positions = {factor: i for i, (factor, _) in enumerate(matrix.factors)}
    return [(tuple(positions[f] for f in names), s) for names, s in matrix.stronger]


def index_constraints(matrix: Matrix) -> covering.Forbidden:
    """``matrix.allows`` on level indices, as clauses the generator can also judge partial rows by."""
    return covering.Forbidden(_domains(matrix), index_clauses(matrix, [c.forbid for c in matrix.constraints]))


def index_clauses(matrix: Matrix, patterns: Sequence[Mapping[str, tuple[object, ...]]]) -> list[dict[int, list[int]]]:
    """Cell patterns (factor → levels) as clauses on factor positions and level indices."""
    positions = {factor: i for i, (factor, _) in enumerate(matrix.factors)}
    return [{positions[f]: [level_index(matrix.factors[positions[f]][1], lv) for lv in levels]
             for f, levels in pattern.items()} for pattern in patterns]


def level_index(levels: Sequence[object], level: object) -> int:
    """Position of ``level`` in ``levels`` by type and value (``True`` is not ``1`` here)."""
    return next(i for i, candidate in enumerate(levels) if type(candidate) is type(level) and candidate == level)


def _index_cost(matrix: Matrix) -> Callable[[tuple[int, ...]], float] | None:
    """``matrix.cost_of`` on level indices, or None without a ``[cost]`` table (rows as before)."""
    if not matrix.cost:
        return None
    weights = [[matrix.cost.get(factor, {}).get(level, 1.0) for level in levels] for factor, levels in matrix.factors]
    return lambda row: math.fsum(w[i] for w, i in zip(weights, row))


def _one_factor_at_a_time(matrix: Matrix) -> list[Cell]:
    """The golden cell, then each other level of each factor with the rest at golden."""
    base = matrix.golden_cell()
    cells = [base]
    for i, (factor, levels) in enumerate(matrix.factors):
        for level in levels:
            if level == base.factors[i][1]:
                continue
            cell = Cell((*base.factors[:i], (factor, level), *base.factors[i + 1:]))
            if matrix.allows(cell.as_dict()):
                cells.append(cell)
    return cells


def check_strength(matrix: Matrix, t: object, key: str) -> None:
    """Reject a strength that is not an integer, or not in 1..number of factors."""
    k = len(matrix.factors)
    if isinstance(t, bool) or not isinstance(t, int):
        raise matrix_error(matrix.path, key, f"must be an integer, got {type(t).__name__} {t!r}")
    if not 1 <= t <= k:
        raise matrix_error(matrix.path, key, f"{t!r} is out of range 1..{k} (the number of factors)")

