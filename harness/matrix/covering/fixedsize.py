"""Fixed-size search: hold the row count at N, move cells until no required tuple is missing, then try fewer rows.

This is the CASA scheme (choose N, search to zero missing tuples, try a smaller N) with the move
of the tabu searches of the covering-array literature (Nurmela; TCA): pick a missing tuple at
random, write its levels into the row where that loses the fewest required tuples (usually one
cell changes: the row already agrees on the others), never into a cell changed in the last
``TABU_TENURE`` moves; one move in twenty takes a random non-tabu row instead (``NOISE``).
Every chosen move is taken, uphill too; the tabu list is what keeps it from undoing itself.
Measured against Metropolis acceptance of the same moves (3^7 at t=4, 135 rows from random
rows): tabu reached zero missing in 28,000 moves, annealing at temperatures 0.5 → 0.05 was
still 4 tuples short after 100,000.

Scores are coverage counts per tuple id (numpy arrays, updated move by move), so a move costs
a few array operations over the rows and the interactions its cells touch. Rows stay allowed:
a candidate row whose change the constraints forbid is not a candidate. Ties and the missing
tuple come from a seeded generator; the work is bounded by a move count, and the one clock,
``WALL_CAP_S``, is a safety net whose firing throws the search's result away (``Shrunk.capped``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from harness.matrix.covering.space import RowCheck, TupleSpace

#: moves the search may take unless the caller (a matrix's ``search_moves``) says otherwise: about
#: a second on the project's matrices, which are mostly proven optimal before it would run.
DEFAULT_MOVES = 10_000
#: a cell changed within this many moves may not change again (3^7 at t=4, 135 rows from random
#: rows: 4 reached zero missing in 28,000 moves; 1 was 4 tuples short after 100,000).
TABU_TENURE = 4
#: chance that a move takes a random non-tabu row instead of a least-losing one. Measured from
#: IPOG's rows, 20,000 moves: 4^6 at t=2 reaches 19 rows with 0.05, 21 with 0.2, 27 without (it
#: circles on a plateau of two missing pairs); 3^7 at t=4 reaches 135 with 0.05 and without, 143 with 0.2.
NOISE = 0.05
#: an attempt at one row count gives up after this many moves without a new low of missing tuples
#: (a share of the budget, at least ``MIN_PATIENCE``), leaving the rest for the next attempt.
PATIENCE_SHARE = 4
MIN_PATIENCE = 2_000
#: safety net only: seconds after which the search stops and its rows are discarded.
WALL_CAP_S = 600.0
SEED = 20_261_201


@dataclass(frozen=True, slots=True)
class Shrunk:
    """What the search returns: the smallest complete array it reached, the moves it took, and whether the clock cut it."""

    rows: np.ndarray
    moves: int
    capped: bool


class _State:
    """Rows, tuple ids per row and interaction, coverage counts, and the list of missing required tuples."""

    def __init__(self, rows: np.ndarray, space: TupleSpace, required: np.ndarray, check: RowCheck | None,
                 rng: np.random.Generator, moves: int = 0) -> None:
        self.rows, self.space, self.required, self.check, self.rng = rows.copy(), space, required, check, rng
        k, n_inter = rows.shape[1], len(space.interactions)
        # stride[f, j]: how much a level step of factor f moves the tuple id of interaction j (0: f not in j)
        self.stride = np.zeros((k, n_inter), dtype=np.int64)
        for j, (combo, dims) in enumerate(zip(space.interactions, space.dims)):
            self.stride[list(combo), j] = np.cumprod((*dims[1:], 1)[::-1])[::-1]
        self.interaction_of = np.repeat(np.arange(n_inter), np.diff(space.offsets))
        self.local = [np.array(np.unravel_index(np.arange(int(b - a)), dims), dtype=np.int64).T
                      for a, b, dims in zip(space.offsets[:-1], space.offsets[1:], space.dims)]
        self.geometry: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.ids = space.ids(self.rows)
        self.count = np.bincount(self.ids.ravel(), minlength=space.size)
        self.position = np.full(space.size, -1, dtype=np.int64)
        self.missing = np.zeros(space.size, dtype=np.int64)
        self.n_missing = 0
        # 0/1 per tuple id, as int8: the gathers over them are most of a move's time
        self.sole = np.zeros(space.size, dtype=np.int8)
        self.absent = np.zeros(space.size, dtype=np.int8)
        self._refresh(np.arange(space.size))
        self.moves = moves
        self.changed_at = np.full(rows.shape, moves - TABU_TENURE - 1, dtype=np.int64)

    def _refresh(self, ids: np.ndarray) -> None:
        """Recompute which of ``ids`` only one row covers and which none does, and keep the missing list in step."""
        counts = self.count[ids]
        self.sole[ids] = (counts == 1) & self.required[ids]
        self.absent[ids] = (counts == 0) & self.required[ids]
        for tuple_id in ids[(self.absent[ids] == 1) & (self.position[ids] < 0)].tolist():
            self.position[tuple_id], self.missing[self.n_missing] = self.n_missing, tuple_id
            self.n_missing += 1
        for tuple_id in ids[(self.absent[ids] == 0) & (self.position[ids] >= 0)].tolist():
            slot, self.n_missing = self.position[tuple_id], self.n_missing - 1
            last = self.missing[self.n_missing]
            self.missing[slot], self.position[last], self.position[tuple_id] = last, slot, -1

    def _geometry(self, j: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Interaction j's factors, the interactions sharing one of them, and their strides there (cached)."""
        if j not in self.geometry:
            factors = np.array(self.space.interactions[j], dtype=np.int64)
            touched = np.flatnonzero(self.stride[factors].any(axis=0))
            self.geometry[j] = (factors, touched, self.stride[factors][:, touched])
        return self.geometry[j]

    def move(self) -> None:
        """Write one missing tuple into the non-tabu row where it loses the fewest required tuples."""
        tuple_id = int(self.missing[self.rng.integers(self.n_missing)])
        j = int(self.interaction_of[tuple_id])
        factors, touched, strides = self._geometry(j)
        levels = self.local[j][tuple_id - int(self.space.offsets[j])]
        current = self.rows[:, factors]
        differs = current != levels
        candidates = np.arange(len(self.rows))
        if self.check is not None:
            changed = self.rows.copy()
            changed[:, factors] = levels
            candidates = candidates[self.check(changed)]
        self.moves += 1
        if len(candidates) == 0:
            return  # no row may take this tuple in place of its levels now; another move may free one
        free = ~((self.changed_at[candidates][:, factors] >= self.moves - TABU_TENURE) & differs[candidates]).any(axis=1)
        if free.any():
            candidates = candidates[free]
        old = self.ids[candidates][:, touched]
        new = old + (levels - current[candidates]) @ strides
        moved = old != new
        delta = (self.sole[old] * moved).sum(axis=1) - self.absent[new].sum(axis=1)
        best = np.flatnonzero(delta == delta.min()) if self.rng.random() >= NOISE else np.arange(len(candidates))
        pick = int(best[self.rng.integers(len(best))])
        self._apply(int(candidates[pick]), factors, levels, touched, new[pick], moved[pick])

    def _apply(self, r: int, factors: np.ndarray, levels: np.ndarray, touched: np.ndarray, new: np.ndarray,
               moved: np.ndarray) -> None:
        """Row r takes ``levels`` on ``factors``: its tuple ids on ``touched`` become ``new`` (``moved``: where they differ)."""
        lost, gained = self.ids[r, touched][moved], new[moved]
        self.count[lost] -= 1
        self.count[gained] += 1
        self.changed_at[r, factors[self.rows[r, factors] != levels]] = self.moves
        self.ids[r, touched] = new
        self.rows[r, factors] = levels
        self._refresh(np.concatenate([lost, gained]))

    def drop_row(self) -> None:
        """Remove the row that covers the fewest required tuples alone (the first such row)."""
        r = int(np.argmin(self.sole[self.ids].sum(axis=1)))
        lost = self.ids[r]
        self.count[lost] -= 1
        self.rows, self.ids = np.delete(self.rows, r, axis=0), np.delete(self.ids, r, axis=0)
        self.changed_at = np.delete(self.changed_at, r, axis=0)
        self._refresh(lost)


def shrink(rows: np.ndarray, space: TupleSpace, required: np.ndarray, check: RowCheck | None, floor: int,
           moves: int = DEFAULT_MOVES, seed: int = SEED) -> Shrunk:
    """The smallest covering array the move budget reaches from the covering array ``rows`` (never more rows).

    Row counts are searched downwards by galloping: after a success the next target drops twice as
    many rows, after a failure half as many, until one row fewer than the best has failed or the
    budget is spent. ``check`` (None: every row allowed) judges changed rows; ``floor`` is a proven
    lower bound, never searched below.
    """
    state = _State(rows, space, required, check, np.random.default_rng(seed))
    best, failed, step = rows.copy(), max(floor, 1) - 1, 1
    patience = max(MIN_PATIENCE, moves // PATIENCE_SHARE)
    start = time.monotonic()
    while len(best) - 1 > failed and state.moves < moves:
        target = max(failed + 1, len(best) - step)
        state = _State(best, space, required, check, state.rng, state.moves)
        while len(state.rows) > target:
            state.drop_row()
        if _search(state, moves, patience, start):
            best, step = state.rows.copy(), step * 2
        else:
            failed, step = target, max(1, step // 2)
        if time.monotonic() - start > WALL_CAP_S:
            return Shrunk(rows, state.moves, capped=True)
    return Shrunk(best, state.moves, capped=False)


def _search(state: _State, budget: int, patience: int, start: float) -> bool:
    """Move until nothing is missing (True), or the attempt stalls, the budget ends or the wall cap passes (False)."""
    low, since = state.n_missing, state.moves
    while state.n_missing:
        if state.moves >= budget or state.moves - since > patience or (
                state.moves % 1024 == 0 and time.monotonic() - start > WALL_CAP_S):
            return False
        state.move()
        if state.n_missing < low:
            low, since = state.n_missing, state.moves
    return True
