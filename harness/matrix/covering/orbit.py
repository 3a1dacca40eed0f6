"""Orbit seeds for three levels at strength 3: a small starter array developed under every permutation of the levels.

Chateauneuf, Colbourn and Kreher ("Covering arrays of strength three", Des. Codes Cryptogr. 16,
1999) let a group act on the levels: the images of a starter array's rows under the group, plus
the constant rows, form a covering array when every t columns of the starter meet every orbit of
non-constant level tuples. This module is their construction for 3 levels and t = 3 only, with
the group S3 (= PSL(2, 2), sharply 3-transitive on {0, 1, 2}): its orbits on the 24 non-constant
level triples are four, one per *pattern* (all levels distinct; or which one of the three
positions differs from the other two), six triples each. So an m × k starter whose every 3
columns show all four patterns gives a CA(6m + 3; 3, k, 3): each row's 6 images and the 3
constant rows. 3^12 at t=3: a 7-row starter, 45 rows (the best known); 3^15: a 9-row starter, 57
rows (an 8-row one would give the best known 51: 20 searches of 50,000 moves found none).

The starter comes from a seeded tabu search over its cells (CASA's move: a missing pattern of
some 3 columns, written into the row and cell where it loses the fewest patterns). A factor with
fewer than 3 levels takes its level modulo its domain, which keeps every tuple covered. As with
every seed, the caller checks the coverage before it uses the rows (``solve``).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

#: tabu moves one starter search may take before its row count counts as not found (3^15, 9 rows:
#: 3,000 missed it on two of five generator seeds, 10,000 found it on all five; about 1.5 s).
STARTER_MOVES = 10_000
#: a cell changed within this many moves may not change again.
TABU_TENURE = 3
#: chance that a move takes a random candidate change instead of a least-losing one (as in ``fixedsize``).
NOISE = 0.05
#: the most starter rows tried (k = 50 factors needs far fewer), so a loose ``below`` costs no search.
MAX_STARTER_ROWS = 40
#: column triples up to which the seed is tried (k = 50 factors: 19,600).
MAX_TRIPLES = 20_000
#: the generator seed; measured over seeds 1-4 and 20,261,203 (3^15 at t=3, bench budget of 200,000 moves), the
#: fixed-size search then takes the 57 rows to 54, 54, 56, 54 and 57 (no change): this one is seed 2.
SEED = 2
#: pattern of a level triple (a, b, c) by its equalities 4·[a=b] + 2·[a=c] + [b=c]: 0 constant,
#: 1 all distinct, 2 a differs, 3 b differs, 4 c differs (-1: equalities no triple has).
_PATTERN = np.array([1, 2, 3, -1, 4, -1, -1, 0], dtype=np.int64)
_LEVEL_PERMUTATIONS = np.array(list(itertools.permutations(range(3))), dtype=np.int64)


def orbit_seed(domains: Sequence[int], t: int, below: int, moves: int = STARTER_MOVES) -> np.ndarray | None:
    """Rows, fewer than ``below``, covering every 3-tuple of an unconstrained space of at most 3 levels at t = 3, or None.

    Starter sizes m go down from the largest whose 6m + 3 rows are below ``below`` (at most
    ``MAX_STARTER_ROWS``) while the search finds one; the smallest found is developed.
    """
    k = len(domains)
    if t != 3 or max(domains) != 3 or math.comb(k, 3) > MAX_TRIPLES:
        return None
    rng, found = np.random.default_rng(SEED), None
    for m in range(min((below - 4) // 6, MAX_STARTER_ROWS), 3, -1):  # 4 patterns need 4 starter rows at least
        starter = _starter(m, k, moves, rng)
        if starter is None:
            break
        found = starter
    if found is None:
        return None
    images = _LEVEL_PERMUTATIONS[:, found].reshape(-1, k)
    constant = np.repeat(np.arange(3)[:, None], k, axis=1)
    return np.unique(np.concatenate([images, constant]) % np.array(domains), axis=0)


def _patterns(rows: np.ndarray, triples: np.ndarray) -> np.ndarray:
    """(rows × triples) pattern of each row on each column triple (0 constant, 1 distinct, 2-4 the differing position)."""
    return _pattern_of(*(rows[..., triples[:, i]] for i in range(3)))


def _pattern_of(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Pattern of the level triples (a, b, c), elementwise."""
    return _PATTERN[4 * (a == b) + 2 * (a == c) + (b == c)]


def _starter(m: int, k: int, moves: int, rng: np.random.Generator) -> np.ndarray | None:
    """An m × k starter whose every 3 columns show the four non-constant patterns, or None if ``moves`` end first."""
    triples = np.array(list(itertools.combinations(range(k), 3)), dtype=np.int64)
    # containing[c]: the triples with column c, the same number for every c
    containing = np.array([np.flatnonzero((triples == c).any(axis=1)) for c in range(k)], dtype=np.int64)
    cells = rng.integers(0, 3, (m, k))
    seen = _patterns(cells, triples)
    count = np.zeros((len(triples), 5), dtype=np.int64)
    np.add.at(count, (np.broadcast_to(np.arange(len(triples)), seen.shape), seen), 1)
    changed_at = np.full((m, k), -TABU_TENURE - 1, dtype=np.int64)
    for step in range(moves):
        missing = np.flatnonzero(count[:, 1:].ravel() == 0)
        if len(missing) == 0:
            return cells
        triple, pattern = divmod(int(missing[rng.integers(len(missing))]), 4)
        move = _best_move(cells, triples, containing, seen, count, triple, pattern + 1, changed_at, step, rng)
        if move is None:
            continue
        r, c, level, new = move
        touched = containing[c]
        np.add.at(count, (touched, seen[r, touched]), -1)
        np.add.at(count, (touched, new), 1)
        seen[r, touched], cells[r, c], changed_at[r, c] = new, level, step
    return None


def _best_move(cells: np.ndarray, triples: np.ndarray, containing: np.ndarray, seen: np.ndarray, count: np.ndarray,
               triple: int, pattern: int, changed_at: np.ndarray, step: int,
               rng: np.random.Generator) -> tuple[int, int, int, np.ndarray] | None:
    """The non-tabu one-cell change giving ``triple`` its ``pattern`` that loses the fewest patterns, with its new
    patterns on the column's triples (ties at random), or None where no such change exists."""
    m = len(cells)
    r, position, level = (g.ravel() for g in np.meshgrid(np.arange(m), np.arange(3), np.arange(3), indexing="ij"))
    c = triples[triple][position]
    trial = cells[r].copy()
    trial[np.arange(len(r)), c] = level
    keep = ((level != cells[r, c]) & (changed_at[r, c] < step - TABU_TENURE)
            & (_patterns(trial, triples[triple:triple + 1])[:, 0] == pattern))
    if not keep.any():
        return None
    r, c, level, trial = r[keep], c[keep], level[keep], trial[keep]
    touched = containing[c]  # (candidates × triples with c)
    new = _pattern_of(*(trial[np.arange(len(r))[:, None], triples[touched, i]] for i in range(3)))
    old = seen[r[:, None], touched]
    moved = old != new
    lost = (moved & (old > 0) & (count[touched, old] == 1)).sum(axis=1)
    gained = (moved & (new > 0) & (count[touched, new] == 0)).sum(axis=1)
    delta = lost - gained
    best = np.flatnonzero(delta == delta.min()) if rng.random() >= NOISE else np.arange(len(r))
    pick = int(best[rng.integers(len(best))])
    return int(r[pick]), int(c[pick]), int(level[pick]), new[pick]
