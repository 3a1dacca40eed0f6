"""Coverage net of masking: rows added to a covering array until every tuple a *judged* row can hold is held by one.

A row is *masked* when something outside the array's constraints keeps it from being judged (in a matrix: a
declared known failure that excuses the whole cell); it still runs, but a t-tuple only masked rows hold is
covered by nothing that can fail. Masking is given as forbidden clauses of its own (``masked``): a row is
judged when the constraints allow it and no masking clause matches it.

Each tuple is then one of three things: *held* by a judged row of the array; *reachable*, held by no judged row
of the array but by some judged row outside it (``extend`` adds rows for these); or *masked*, held by no judged
row at all (every allowed row holding it is masked: a declaration's own defining tuple), which no row can
cover net and which is reported, not added for.

The rows are found as the array's own are, never from the product: greedily (the first reachable tuple not yet
held seeds a row, each free factor in order then takes the level that holds the most reachable tuples not yet held,
the lowest such level on a tie, while the row still extends to a judged row), then fewer by ``postopt``'s local
search and ``fixedsize``'s search, both seeded and bounded by moves. Measured on ``matrices/vllm.toml`` (13 of its
40 cells masked, 309 tuples to add for): greedy 26 rows, local search 22, fixed-size search 21 in 5,859 moves,
which a set-cover ILP over every judged row proves the fewest that hold them (its LP bound: 20).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.matrix.covering import fixedsize, postopt
from harness.matrix.covering.solve import CoverageError, interactions
from harness.matrix.covering.space import FREE, Forbidden, Row, TTuple, TupleSpace, required_mask


@dataclass(frozen=True, slots=True)
class NetExtension:
    """What ``extend`` found: the rows it added (to append to the array) and the tuples no judged row can hold."""

    added: list[Row]
    masked: list[TTuple]


def judged_space(allowed: Forbidden, masked: Sequence[dict[int, Sequence[int]]]) -> Forbidden:
    """The rows that are allowed and judged, as one set of clauses: the constraints' and the masking ones."""
    return Forbidden(allowed.domains, [*({f: levels for f, levels in clause} for clause in allowed.clauses), *masked])


def extend(rows: Sequence[Sequence[int]], domains: Sequence[int], t: int, allowed: Forbidden,
           masked: Sequence[dict[int, Sequence[int]]], stronger: Sequence[tuple[Sequence[int], int]] = (),
           moves: int = fixedsize.DEFAULT_MOVES) -> NetExtension:
    """Rows to append to ``rows`` so that every allowed tuple some judged row can hold is held by a judged row.

    ``rows`` are kept as they are (a frozen array keeps its ids); the added rows are allowed and judged, sorted.
    ``moves`` bounds the fixed-size search (0: none). Raises ``CoverageError`` if a reachable tuple stays unheld
    (a bug, never ignored).
    """
    space = TupleSpace(domains, interactions(domains, t, stronger))
    judged = judged_space(allowed, masked)
    required = required_mask(space, allowed)
    reachable = required_mask(space, judged) & required
    held = _held(space, [tuple(row) for row in rows if judged(tuple(row))])
    todo = reachable & ~held
    added: list[Row] = []
    while todo.any():
        row = _greedy_row(space, judged, todo, space.decode(int(np.flatnonzero(todo)[0])))
        added.append(row)
        todo[space.ids(np.array([row], dtype=np.int64)).ravel()] = False
    added = _fewer(added, space, reachable & ~held, judged, moves)
    left = reachable & ~(held | _held(space, added))
    if left.any():
        raise CoverageError(f"net extension left {int(left.sum())} reachable tuples unheld, first "
                            f"{space.decode(int(np.flatnonzero(left)[0]))}")
    return NetExtension(added, [space.decode(int(i)) for i in np.flatnonzero(required & ~reachable)])


def _fewer(rows: list[Row], space: TupleSpace, todo: np.ndarray, judged: Forbidden, moves: int) -> list[Row]:
    """``rows`` (judged, holding every ``todo`` tuple) made fewer by the local search, then the fixed-size search
    where it ran to the end (a search its safety clock stopped is discarded, as in ``solve``); sorted."""
    if len(rows) <= 1:
        return sorted(rows)
    floor = space.counting_bound(todo)
    reduced = postopt.reduce_rows(np.array(rows, dtype=np.int64), space, todo, judged.allowed_mask, floor)
    if moves and len(reduced) > floor:
        shrunk = fixedsize.shrink(reduced, space, todo, judged.allowed_mask, floor, moves)
        reduced = reduced if shrunk.capped else np.unique(shrunk.rows, axis=0)
    return sorted(tuple(int(level) for level in row) for row in reduced)


def _held(space: TupleSpace, rows: Sequence[Row]) -> np.ndarray:
    """Which tuple ids ``rows`` hold."""
    held = np.zeros(space.size, dtype=bool)
    if rows:
        held[space.ids(np.array(rows, dtype=np.int64)).ravel()] = True
    return held


def _greedy_row(space: TupleSpace, judged: Forbidden, todo: np.ndarray, seed: TTuple) -> Row:
    """A judged row holding ``seed``, each other factor (in order) at the level that holds the most ``todo`` tuples
    among the interactions it completes, the lowest level on a tie; a level is taken only if the row still extends
    to a judged row (``seed`` is reachable, so some level always does)."""
    row = [FREE] * len(space.domains)
    for f, level in seed:
        row[f] = level
    for f in range(len(space.domains)):
        if row[f] != FREE:
            continue
        best, best_gain = FREE, -1
        for level in range(space.domains[f]):
            trial = [*row[:f], level, *row[f + 1:]]
            if not judged.extendable(trial):
                continue
            gain = _gain(space, todo, trial, f)
            if gain > best_gain:
                best, best_gain = level, gain
        row[f] = best
    return tuple(row)


def _gain(space: TupleSpace, todo: np.ndarray, row: Sequence[int], f: int) -> int:
    """How many ``todo`` tuples the partial ``row`` holds among the interactions containing ``f`` whose every
    factor it has set."""
    gain = 0
    for j, (combo, dims) in enumerate(zip(space.interactions, space.dims)):
        if f in combo and all(row[g] != FREE for g in combo):
            gain += bool(todo[space.offsets[j] + np.ravel_multi_index([row[g] for g in combo], dims)])
    return gain
