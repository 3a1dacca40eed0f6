"""Coverage net of masking: what a list of cells covers once the cells no oracle judges are left out.

A cell that ``[[expected]]`` masks whole (``Matrix.masks``: an expected error, or every oracle excused) still runs,
but nothing in it can fail, so a t-tuple only such cells hold is covered by nothing that judges it: the masking
effect of combinatorial testing (Yilmaz et al., "Reducing masking effects in combinatorial interaction testing").
The generator adds cells until every tuple a judged cell can hold is held by one (``harness.matrix.covering.net``);
this module says, for ``harness list``, how far a list of cells gets and which tuples no judged cell can hold (a
declaration's own defining tuple), with the declarations that mask them.

Net coverage is per cell, not per (tuple, oracle): a declaration that excuses some oracles only (or some findings
only: a signature) leaves the cell judged by the others, and the matrix file does not say which oracle can see
which tuple (accept_length judges nothing without a proposer), so a per-oracle goal would ask for tuples no cell can
give it. ``oracles_excused`` counts such cells, shown beside the net coverage.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.matrix.covering.net import judged_space
from harness.matrix.covering.space import FREE
from harness.matrix.known import Mask, matches
from harness.matrix.model import (
    Cell, CoverageReport, Matrix, changed, coverage, index_clauses, index_constraints, level_index, ofat_coverage,
)

#: a tuple as ``coverage`` names it: ((factor, level), ...)
Named = tuple[tuple[str, object], ...]


@dataclass(frozen=True, slots=True)
class NetCoverage:
    """``plain`` coverage beside the same over the judged cells only (``net``); of the tuples ``net`` misses that
    ``plain`` holds, which only masked cells can hold (``masked``) and which a judged cell could (``gaps``), each
    with the ``[[expected]]`` numbers that mask it; how many cells are masked whole, and how many more have an
    oracle excused whole but stay judged by the others (``oracles_excused``)."""

    plain: CoverageReport
    net: CoverageReport
    masked: tuple[tuple[Named, tuple[int, ...]], ...]
    gaps: tuple[tuple[Named, tuple[int, ...]], ...]
    masked_cells: int
    oracles_excused: int

    @property
    def ok(self) -> bool:
        """Whether every tuple a judged cell can hold is held by one."""
        return not self.gaps


def masked_by(found: Sequence[Mask], cell: Cell) -> tuple[int, ...]:
    """The ``[[expected]]`` numbers that mask ``cell`` whole (empty: it is judged)."""
    row = cell.as_dict()
    return tuple(sorted({number for mask in found if mask.matches(row) for number in mask.numbers}))


def net_coverage(matrix: Matrix, cells: Sequence[Cell], t: int | None) -> NetCoverage:
    """Coverage of ``cells`` at strength ``t`` (None: one factor at a time), plain and net of masking."""
    found = matrix.masks()
    judged = [cell for cell in cells if not masked_by(found, cell)]
    if t is None:
        plain, net = ofat_coverage(matrix, cells), ofat_coverage(matrix, judged)
    else:
        plain, net = coverage(matrix, cells, t), coverage(matrix, judged, t)
    unheld = set(plain.missing)
    judgeable = judged_space(index_constraints(matrix), index_clauses(matrix, [mask.when for mask in found]))
    masked, gaps = [], []
    for ttuple in (ttuple for ttuple in net.missing if ttuple not in unheld):
        if t is None:  # a change off golden has one cell, and it is masked
            masked.append((ttuple, masked_by(found, changed(matrix.golden_cell(), ttuple))))
        elif judgeable.extendable(_partial(matrix, ttuple)):  # some judged cell could hold it
            holders = [cell for cell in cells if all(cell.level(f) == level for f, level in ttuple)]
            gaps.append((ttuple, tuple(sorted({n for cell in holders for n in masked_by(found, cell)}))))
        else:
            masked.append((ttuple, _masking(matrix, found, ttuple)))
    excused = sum(1 for cell in judged
                  if any(entry.excused_whole and matches(entry.when, cell.as_dict()) for entry in matrix.expected))
    return NetCoverage(plain, net, tuple(masked), tuple(gaps), len(cells) - len(judged), excused)


def _partial(matrix: Matrix, ttuple: Named) -> list[int]:
    """``ttuple`` as a partial row of level indices (``FREE`` elsewhere)."""
    row = [FREE] * len(matrix.factors)
    positions = {factor: i for i, (factor, _) in enumerate(matrix.factors)}
    for factor, level in ttuple:
        row[positions[factor]] = level_index(matrix.factors[positions[factor]][1], level)
    return row


def _masking(matrix: Matrix, found: Sequence[Mask], ttuple: Named) -> tuple[int, ...]:
    """The ``[[expected]]`` numbers that keep ``ttuple`` from every judged cell: each mask that does so alone, else
    (masks that do it only together) every mask an allowed cell holding it can match."""
    partial = _partial(matrix, ttuple)
    alone = [mask for mask in found
             if not judged_space(index_constraints(matrix), index_clauses(matrix, [mask.when])).extendable(partial)]
    together = alone or [mask for mask in found if all(level in mask.when.get(f, (level,)) for f, level in ttuple)]
    return tuple(sorted({number for mask in together for number in mask.numbers}))
