"""In-parameter-order (IPOG) construction: a covering array built factor by factor, never from the product.

Factors are added one at a time. When factor i joins, the tuples to cover are those of the
interactions whose last factor is i. *Horizontal growth* gives each existing row the level of
i that covers the most of them (or leaves it free when none would); *vertical growth* then
places each tuple still uncovered into the first row whose free factors can take it, or into
a new row. Constraints are forbidden clauses: a partial row is kept only while it still
extends to an allowed full row (``Forbidden.extendable``), so no row ever needs undoing, and
free factors are filled at the end with levels that keep the row allowed.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from harness.matrix.covering.space import FREE, Forbidden, Interaction, TupleSpace


def ipog(domains: Sequence[int], interactions: Sequence[Interaction], required: np.ndarray,
         forbidden: Forbidden, start: np.ndarray | None = None) -> np.ndarray:
    """Allowed full rows covering every required tuple of ``interactions`` (ids as in ``TupleSpace``).

    ``start`` (rows × its first factors) is taken as already covering every interaction among those
    factors (an algebraic seed, say); growth goes on from the next factor.
    """
    space = TupleSpace(domains, interactions)
    uncovered = required.copy()
    rows = np.empty((0, len(domains)), dtype=np.int64)
    if start is not None:
        rows = np.full((len(start), len(domains)), FREE, dtype=np.int64)
        rows[:, :start.shape[1]] = start
    for i in range(0 if start is None else start.shape[1], len(domains)):
        joining = [j for j, combo in enumerate(space.interactions) if combo[-1] == i]
        if not joining:
            continue
        _horizontal(rows, i, space, joining, uncovered, forbidden)
        rows = _vertical(rows, i, space, joining, uncovered, forbidden)
    return np.array([forbidden.complete(row) for row in rows], dtype=np.int64).reshape(-1, len(domains))


def _bases(rows: np.ndarray, space: TupleSpace, joining: list[int]) -> np.ndarray:
    """(rows × joining) id of each row's tuple with the joining factor at level 0; -1 where a factor is free."""
    bases = np.full((len(rows), len(joining)), -1, dtype=np.int64)
    for column, j in enumerate(joining):
        combo, dims = space.interactions[j], space.dims[j]
        head = rows[:, list(combo[:-1])]
        set_ = np.all(head != FREE, axis=1)
        if len(combo) == 1:
            bases[:, column] = space.offsets[j]
            continue
        index = np.ravel_multi_index(tuple(np.where(set_[:, None], head, 0).T), dims[:-1])
        bases[:, column] = np.where(set_, space.offsets[j] + index * dims[-1], -1)
    return bases


def _horizontal(rows: np.ndarray, i: int, space: TupleSpace, joining: list[int], uncovered: np.ndarray,
                forbidden: Forbidden) -> None:
    """Give each row, in order, the level of factor i that covers the most uncovered tuples (free if none)."""
    bases = _bases(rows, space, joining)
    levels = np.arange(space.domains[i])
    for r in range(len(rows)):
        base = bases[r][bases[r] >= 0]
        if len(base) == 0:
            continue
        gains = uncovered[base[:, None] + levels].sum(axis=0)
        for level in np.argsort(-gains, kind="stable"):
            if gains[level] == 0:
                break
            rows[r, i] = level
            if forbidden.extendable(rows[r]):
                uncovered[base + level] = False
                break
            rows[r, i] = FREE


def _vertical(rows: np.ndarray, i: int, space: TupleSpace, joining: list[int], uncovered: np.ndarray,
              forbidden: Forbidden) -> np.ndarray:
    """Place every tuple still uncovered into the first row that can take it, else into a new row."""
    todo = [int(tuple_id) for j in joining
            for tuple_id in np.flatnonzero(uncovered[space.offsets[j]:space.offsets[j + 1]]) + space.offsets[j]]
    grown = np.full((len(rows) + len(todo), rows.shape[1]), FREE, dtype=np.int64)
    grown[:len(rows)] = rows
    n = len(rows)
    for tuple_id in todo:
        factors, levels = zip(*space.decode(tuple_id))
        cols, vals = list(factors), np.array(levels, dtype=np.int64)
        if not _first_fit(grown[:n], cols, vals, forbidden):
            grown[n, cols] = vals
            n += 1
        uncovered[tuple_id] = False
    return grown[:n]


def _first_fit(rows: np.ndarray, cols: list[int], vals: np.ndarray, forbidden: Forbidden) -> bool:
    """Write the tuple into the first row whose free factors take it and that stays extendable."""
    fits = np.flatnonzero(np.all((rows[:, cols] == FREE) | (rows[:, cols] == vals), axis=1))
    for r in fits:
        saved = rows[r, cols].copy()
        rows[r, cols] = vals
        if forbidden.extendable(rows[r]):
            return True
        rows[r, cols] = saved
    return False
