"""Post-optimisation: drop a row, then repair coverage with local moves; keep going while repairs succeed.

A move picks a tuple no row covers and writes its levels into the row that loses least
coverage by it, among the rows that already agree with it on the most factors and stay
allowed (a focused local search, as the tabu and annealing searches of the covering-array
literature use). Every move is taken, even uphill; one in five takes a random agreeing row
instead of the best, which is what gets it off plateaus (measured: without it, 2^11 at t=3
stops at 17 rows, with it at 12). Ties and noise come from a seeded generator, so the same
rows always come back; the work is bounded by move counts, never a clock.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from harness.matrix.covering.space import Row, RowCheck, TupleSpace

#: moves one repair may take before the attempt to lose a row is given up, per required tuple
#: (small spaces give up fast, where the ILP is the better tool) and at most.
REPAIR_MOVES_PER_TUPLE = 20
MOVES_PER_REPAIR = 20_000
#: moves the whole post-optimisation may take.
MAX_MOVES = 150_000
#: chance that a move takes a random agreeing row instead of the best one (escapes plateaus).
NOISE = 0.2
SEED = 20_261_130


class _Array:
    """Rows plus how often each tuple id is covered, kept in step move by move."""

    def __init__(self, rows: np.ndarray, space: TupleSpace, required: np.ndarray, check: RowCheck) -> None:
        self.rows, self.space, self.required, self.check = rows.copy(), space, required, check
        k, width = rows.shape[1], max(len(combo) for combo in space.interactions)
        self.factors = np.full((len(space.interactions), width), k, dtype=np.int64)  # k: a zero pad column
        self.strides = np.zeros((len(space.interactions), width), dtype=np.int64)
        for j, (combo, dims) in enumerate(zip(space.interactions, space.dims)):
            self.factors[j, :len(combo)] = combo
            self.strides[j, :len(combo)] = np.cumprod((*dims[1:], 1)[::-1])[::-1]
        self.touching = [np.array([j for j, combo in enumerate(space.interactions) if f in combo], dtype=np.int64)
                         for f in range(k)]
        self.touched_by: dict[tuple[int, ...], np.ndarray] = {}
        self.required_ids = np.flatnonzero(required)
        self.ids = space.ids(rows)
        self.count = np.bincount(self.ids.ravel(), minlength=space.size)

    def missing(self) -> np.ndarray:
        """Required tuple ids no row covers."""
        return self.required_ids[self.count[self.required_ids] == 0]

    def ids_at(self, rows: np.ndarray, interactions: np.ndarray) -> np.ndarray:
        """Tuple ids of full ``rows`` on the given interactions."""
        padded = np.concatenate([rows, np.zeros((len(rows), 1), dtype=np.int64)], axis=1)
        picked = padded[:, self.factors[interactions]] * self.strides[interactions]
        return self.space.offsets[interactions] + picked.sum(axis=2)

    def _touched(self, factors: tuple[int, ...]) -> np.ndarray:
        """Interactions that contain any of ``factors`` (cached: the same factor sets come back)."""
        if factors not in self.touched_by:
            self.touched_by[factors] = np.unique(np.concatenate([self.touching[f] for f in factors]))
        return self.touched_by[factors]

    def drop(self, r: int) -> None:
        """Remove row ``r``."""
        np.subtract.at(self.count, self.ids[r], 1)
        self.rows, self.ids = np.delete(self.rows, r, axis=0), np.delete(self.ids, r, axis=0)

    def sole_counts(self) -> np.ndarray:
        """For each row, how many required tuples only it covers."""
        return ((self.count[self.ids] == 1) & self.required[self.ids]).sum(axis=1)

    def move(self, tuple_id: int, rng: random.Random) -> None:
        """Write the tuple's levels into the row where that costs the least coverage."""
        factors, levels = zip(*self.space.decode(tuple_id))
        cols, vals = list(factors), np.array(levels)
        mismatch = (self.rows[:, cols] != vals).sum(axis=1)
        for limit in (mismatch.min(), len(cols)):
            candidates = np.flatnonzero(mismatch <= limit)
            changed_rows = self.rows[candidates].copy()
            changed_rows[:, cols] = vals
            valid = self.check(changed_rows)
            if valid.any():
                break
        else:
            return  # no row may hold this tuple in place of its levels
        candidates, changed_rows = candidates[valid], changed_rows[valid]
        change = self.change(candidates, changed_rows, tuple(cols))
        delta = change.lost - change.gained
        if rng.random() < NOISE:
            pick = rng.randrange(len(candidates))
        else:
            best = np.flatnonzero(delta == delta.min())
            pick = int(best[rng.randrange(len(best))])
        self.apply(change, pick)

    def change(self, candidates: np.ndarray, changed_rows: np.ndarray, cols: tuple[int, ...]) -> _Change:
        """What replacing each candidate row by its changed row (different on ``cols`` only) would do."""
        touched = self._touched(cols)
        old, new = self.ids[candidates][:, touched], self.ids_at(changed_rows, touched)
        differs = old != new
        lost = (differs & (self.count[old] == 1) & self.required[old]).sum(axis=1)
        gained = (differs & (self.count[new] == 0) & self.required[new]).sum(axis=1)
        return _Change(candidates, changed_rows, touched, old, new, differs, lost, gained)

    def apply(self, change: _Change, pick: int) -> None:
        """Make one of the evaluated changes."""
        r = int(change.candidates[pick])
        np.subtract.at(self.count, change.old[pick][change.differs[pick]], 1)
        np.add.at(self.count, change.new[pick][change.differs[pick]], 1)
        self.ids[r, change.touched] = change.new[pick]
        self.rows[r] = change.rows[pick]


@dataclass(frozen=True, slots=True)
class _Change:
    """Candidate row changes with their old and new tuple ids and the required tuples each loses and gains."""

    candidates: np.ndarray
    rows: np.ndarray
    touched: np.ndarray
    old: np.ndarray
    new: np.ndarray
    differs: np.ndarray
    lost: np.ndarray
    gained: np.ndarray


def reduce_rows(rows: np.ndarray, space: TupleSpace, required: np.ndarray, check: RowCheck,
                floor: int) -> np.ndarray:
    """A covering array with as few rows as the move budget reaches (never more than ``rows``, never below ``floor``)."""
    array = _Array(rows, space, required, check)
    _drop_redundant(array)
    best = array.rows.copy()
    rng, budget = random.Random(SEED), MAX_MOVES
    per_repair = min(MOVES_PER_REPAIR, REPAIR_MOVES_PER_TUPLE * len(array.required_ids))
    while len(array.rows) > max(floor, 1) and budget > 0:
        array.drop(int(np.argmin(array.sole_counts())))
        for _ in range(min(per_repair, budget)):
            missing = array.missing()
            if len(missing) == 0:
                break
            budget -= 1
            array.move(int(missing[rng.randrange(len(missing))]), rng)
        if len(array.missing()):
            break
        _drop_redundant(array)
        best = array.rows.copy()
    return best


def cheapen_cells(rows: np.ndarray, space: TupleSpace, required: np.ndarray, check: RowCheck,
                  cost: Callable[[Row], float], domains: tuple[int, ...]) -> np.ndarray:
    """Lower the total cost at the same rows: move single cells to levels that make their row cheaper.

    A change is taken only when the row stays allowed and no required tuple loses its last row;
    each one strictly lowers the total cost, so the sweeps end. Rows, factors and levels are
    visited in order (deterministic).
    """
    array = _Array(rows, space, required, check)
    changed = True
    while changed:
        changed = False
        for r in range(len(array.rows)):
            for f, size in enumerate(domains):
                options = np.repeat(array.rows[r:r + 1], size, axis=0)
                options[:, f] = np.arange(size)
                prices = np.array([cost(tuple(int(v) for v in row)) for row in options])
                keep = check(options) & (prices < prices[array.rows[r, f]])
                if not keep.any():
                    continue
                change = array.change(np.full(int(keep.sum()), r), options[keep], (f,))
                safe = np.flatnonzero(change.lost == 0)
                if len(safe):
                    array.apply(change, int(safe[np.argmin(prices[keep][safe])]))
                    changed = True
    return array.rows


def _drop_redundant(array: _Array) -> None:
    """Remove rows (last first) whose every required tuple another row also covers."""
    for r in range(len(array.rows) - 1, -1, -1):
        if array.sole_counts()[r] == 0:
            array.drop(r)
