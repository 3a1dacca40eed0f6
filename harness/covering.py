"""t-wise covering arrays on level indices: the fewest rows that contain every allowed t-tuple.

Pure combinatorics, no matrix files: a factor is a domain size, a level is an index into
it, a row is one level index per factor, and ``allowed(row)`` says whether a full row may
run. A t-tuple (t factors, one level each) is *allowed* when some allowed row contains
it; a covering array holds only allowed rows and contains every allowed t-tuple.

Construction: a greedy set cover over the allowed rows first. When it is above the
counting bound (the most allowed tuples on one t-subset of factors) and the problem is
small enough, a minimum set-cover ILP (scipy ``milp``, HiGHS) replaces it if smaller. The
ILP's columns are the rows its LP relaxation uses plus the greedy rows: measured, that
model is solved in a fraction of the time of the one over every candidate, and at the
root node it finds smaller arrays on most factor sets (the lower bound, 16 rows at t=2
and 48 at t=3, on 3,2,4,2,2,4,2). Everything is deterministic: a node count, never a
clock, bounds the solver, ties go to the first row in lexicographic order, and rows come
back sorted. Every result is checked against the allowed tuples before it is returned,
so a gap is never silent.

With a ``cost`` per row, the row count is fixed first (the same search, so never more rows
than without costs) and a local pass then lowers the total cost: it replaces each chosen
row by the cheapest allowed row that still covers every tuple only it covered, and drops a
row that covers nothing alone, until no row changes. That is a local optimum (2,3,3 at t=2
with one dear level of the first factor: 4 dear rows, where 3 need two rows to change
together), so when the ILP may run, a second one (min total cost, at most that many rows,
root node) replaces it if cheaper.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
from scipy import optimize, sparse

Row = tuple[int, ...]
#: one t-tuple: ((factor index, level index), ...) in increasing factor order.
TTuple = tuple[tuple[int, int], ...]
Method = Literal["auto", "ilp", "greedy"]

#: the ILP runs only up to this many allowed candidate rows ...
ILP_MAX_ROWS = 10_000
#: ... and this many (row, t-subset) incidences: measured, the 11-factor t=3 shape of a
#: nightly matrix (1.35M) spends 40 s in the LP alone and then loses to greedy.
ILP_MAX_INCIDENCES = 1_000_000
#: branch-and-bound nodes the ILP may explore: a count, not a clock, so every machine gets
#: the same rows. Root only: on the measured factor sets 10 or 100 nodes cost 2-5x the
#: time and improved one array by one row.
ILP_NODE_LIMIT = 1
#: full rows enumerated to find the allowed ones (the predicate sees whole rows only).
MAX_ENUMERATED_ROWS = 2_000_000
#: candidate rows × t-subsets held in memory at once (8 bytes each).
MAX_INCIDENCES = 20_000_000


class CoverageError(AssertionError):
    """A generated array misses an allowed t-tuple: a generator bug, never ignored."""


def lower_bound(domains: Sequence[int], t: int) -> int:
    """Product of the t largest domains: no t-wise array of the unconstrained space is smaller."""
    _check_args(domains, t)
    return math.prod(sorted(domains, reverse=True)[:t])


def allowed_rows(domains: Sequence[int], allowed: Callable[[Row], bool]) -> list[Row]:
    """Every allowed full row in lexicographic order: the candidates of a covering array."""
    if math.prod(domains) > MAX_ENUMERATED_ROWS:
        raise ValueError(f"{math.prod(domains)} rows in the product of domains {list(domains)} exceed "
                         f"the enumeration budget of {MAX_ENUMERATED_ROWS}; split the matrix")
    return [row for row in itertools.product(*(range(d) for d in domains)) if allowed(row)]


def allowed_tuples(domains: Sequence[int], t: int, allowed: Callable[[Row], bool]) -> list[TTuple]:
    """Every allowed t-tuple (contained in at least one allowed row), sorted."""
    return missing_tuples([], domains, t, allowed)


def missing_tuples(
    rows: Sequence[Sequence[int]], domains: Sequence[int], t: int, allowed: Callable[[Row], bool]
) -> list[TTuple]:
    """Allowed t-tuples that no allowed row of ``rows`` contains (a forbidden row never runs)."""
    _check_args(domains, t)
    space = _TupleSpace(domains, t)
    required = np.unique(space.ids(_as_array(allowed_rows(domains, allowed), len(domains))))
    runnable = [row for row in (tuple(int(level) for level in r) for r in rows) if allowed(row)]
    covered = space.ids(_as_array(runnable, len(domains)))
    return [space.decode(int(i)) for i in np.setdiff1d(required, covered)]


def covering_array(
    domains: Sequence[int],
    t: int,
    allowed: Callable[[Row], bool],
    *,
    method: Method = "auto",
    cost: Callable[[Row], float] | None = None,
) -> list[Row]:
    """A t-wise covering array of the allowed rows, sorted; ``method`` forces or skips the ILP.

    The search runs twice, on the factors in the caller's order and largest domain first,
    and keeps the smaller array (the first on a tie): neither order wins everywhere
    (2,2,2,4,4,2,2,2 at t=3: 37 rows as given, 32 sorted; 3,2,4,2,2,4,2 at t=2: 16 as
    given, 17 sorted), and both are deterministic.

    ``cost(row)`` (finite, >= 0) ranks arrays of equal size: fewest rows first, then least
    total cost. It is a row predicate's twin, not per-level weights, because the cost pass
    prices whole candidate rows (no additivity needed) and a caller may price combinations
    (Triton at page_size 1 dearer than at 16); additive weights are a one-line callable.
    """
    _check_args(domains, t)
    if method not in ("auto", "ilp", "greedy"):
        raise ValueError(f"unknown covering method {method!r} (methods: auto, ilp, greedy)")
    rows = _covering_array_in_order(domains, t, allowed, method, cost)
    order = sorted(range(len(domains)), key=lambda i: -domains[i])
    if order != sorted(order):
        back = [order.index(i) for i in range(len(domains))]

        def in_caller_order(row: Row) -> Row:
            return tuple(row[j] for j in back)

        permuted = _covering_array_in_order(
            [domains[i] for i in order], t, lambda row: allowed(in_caller_order(row)), method,
            None if cost is None else lambda row: cost(in_caller_order(row)),
        )
        permuted = [in_caller_order(row) for row in permuted]
        if _rank(permuted, cost) < _rank(rows, cost):
            rows = permuted
    rows = sorted(rows)
    missing = missing_tuples(rows, domains, t, allowed)
    if missing:
        raise CoverageError(f"covering array for domains {list(domains)} at t={t} misses "
                            f"{len(missing)} allowed tuples, first {missing[0]}")
    return rows


def _rank(rows: Sequence[Row], cost: Callable[[Row], float] | None) -> tuple[int, float]:
    """What ``covering_array`` minimises: the row count, then the total cost (0 without one)."""
    return len(rows), 0.0 if cost is None else math.fsum(cost(row) for row in rows)


def _covering_array_in_order(
    domains: Sequence[int], t: int, allowed: Callable[[Row], bool], method: Method,
    cost: Callable[[Row], float] | None,
) -> list[Row]:
    """The set-cover search itself, on domains already in search order, then the cost pass."""
    candidates = _as_array(allowed_rows(domains, allowed), len(domains))
    if len(candidates) == 0:
        return []
    incidence = _TupleSpace(domains, t).ids(candidates)
    chosen = _greedy_cover(incidence)
    if method == "ilp" or (method == "auto" and _ilp_worthwhile(incidence, chosen)):
        solved = _lp_guided_ilp(incidence, chosen)
        if len(solved) < len(chosen):
            chosen = solved
    if cost is not None:
        costs = _row_costs(candidates, cost)
        chosen = _cheapen(incidence, chosen, costs)
        if method != "greedy" and len(incidence) <= ILP_MAX_ROWS and incidence.size <= ILP_MAX_INCIDENCES:
            chosen = _cheapest_cover(incidence, chosen, costs)
    return [tuple(int(level) for level in candidates[i]) for i in chosen]


def _row_costs(candidates: np.ndarray, cost: Callable[[Row], float]) -> np.ndarray:
    """``cost`` of every candidate row; a negative or non-finite cost names the row at fault."""
    costs = np.array([cost(tuple(int(level) for level in row)) for row in candidates], dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(costs) | (costs < 0))
    if len(bad):
        row = tuple(int(level) for level in candidates[bad[0]])
        raise ValueError(f"row cost must be finite and >= 0, got {costs[bad[0]]!r} for row {row}")
    return costs


def _check_args(domains: Sequence[int], t: int) -> None:
    """Reject empty domains and strengths outside 1..len(domains), naming the value at fault."""
    bad = [d for d in domains if not isinstance(d, int) or isinstance(d, bool) or d < 1]
    if bad:
        raise ValueError(f"domain sizes must be positive ints, got {bad[0]!r} in {list(domains)}")
    if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= len(domains):
        raise ValueError(f"strength t={t!r} is out of range 1..{len(domains)} for domains {list(domains)}")


def _as_array(rows: Sequence[Sequence[int]], k: int) -> np.ndarray:
    """Rows as an (n, k) int64 array, also when there are none."""
    return np.array(rows, dtype=np.int64).reshape(-1, k)


class _TupleSpace:
    """Numbers every t-tuple: each t-subset of factors owns a block of mixed-radix ids."""

    def __init__(self, domains: Sequence[int], t: int) -> None:
        self.combos = list(itertools.combinations(range(len(domains)), t))
        self.dims = [tuple(domains[f] for f in combo) for combo in self.combos]
        self.offsets = np.cumsum([0, *(math.prod(d) for d in self.dims)])

    def ids(self, rows: np.ndarray) -> np.ndarray:
        """(rows × t-subsets) ids of the t-tuples each row contains."""
        if rows.shape[0] * len(self.combos) > MAX_INCIDENCES:
            raise ValueError(f"{rows.shape[0]} rows × {len(self.combos)} factor subsets exceeds "
                             f"the enumeration budget of {MAX_INCIDENCES}; split the matrix or lower t")
        ids = np.empty((rows.shape[0], len(self.combos)), dtype=np.int64)
        for j, (combo, dims) in enumerate(zip(self.combos, self.dims)):
            ids[:, j] = self.offsets[j] + np.ravel_multi_index(tuple(rows[:, list(combo)].T), dims)
        return ids

    def decode(self, tuple_id: int) -> TTuple:
        """The t-tuple behind one id."""
        j = int(np.searchsorted(self.offsets, tuple_id, side="right")) - 1
        levels = np.unravel_index(tuple_id - int(self.offsets[j]), self.dims[j])
        return tuple((f, int(level)) for f, level in zip(self.combos[j], levels))


def _compact(incidence: np.ndarray) -> tuple[np.ndarray, int]:
    """Renumber tuple ids to 0..n-1 over the tuples that occur (exactly the allowed ones)."""
    unique, inverse = np.unique(incidence, return_inverse=True)
    return inverse.reshape(incidence.shape), len(unique)


def _counting_bound(incidence: np.ndarray) -> int:
    """Most allowed tuples on one t-subset: each row covers one of them, so no cover is smaller."""
    return max(len(np.unique(incidence[:, j])) for j in range(incidence.shape[1]))


def _ilp_worthwhile(incidence: np.ndarray, greedy: list[int]) -> bool:
    """Run the ILP only when greedy may be beaten and the model is small enough to pay off."""
    small = len(incidence) <= ILP_MAX_ROWS and incidence.size <= ILP_MAX_INCIDENCES
    return small and len(greedy) > _counting_bound(incidence)


def _lp_guided_ilp(incidence: np.ndarray, greedy: list[int]) -> list[int]:
    """Indices of a minimum cover among the rows the LP relaxation uses and the greedy rows."""
    cover = _cover_matrix(incidence)
    relaxed = _solve_cover(cover, integral=False)
    columns = np.union1d(np.flatnonzero(relaxed > 1e-9), greedy)
    solved = _solve_cover(cover[:, columns], integral=True)
    return [int(columns[i]) for i in np.flatnonzero(solved > 0.5)]


def _cover_matrix(incidence: np.ndarray) -> sparse.csr_array:
    """(tuples × rows) 0/1 matrix: entry (k, r) is 1 when row r contains tuple k."""
    ids, n_tuples = _compact(incidence)
    n_rows, per_row = ids.shape
    return sparse.csr_array(
        (np.ones(ids.size), (ids.ravel(), np.repeat(np.arange(n_rows), per_row))),
        shape=(n_tuples, n_rows),
    )


def _solve_cover(cover: sparse.csr_array, *, integral: bool) -> np.ndarray:
    """HiGHS on min Σx subject to cover·x ≥ 1, 0 ≤ x ≤ 1; binary x when ``integral``."""
    n_rows = cover.shape[1]
    result = optimize.milp(
        c=np.ones(n_rows),
        integrality=np.full(n_rows, int(integral)),
        bounds=optimize.Bounds(0, 1),
        constraints=optimize.LinearConstraint(cover, lb=1, ub=np.inf),
        options={"node_limit": ILP_NODE_LIMIT},
    )
    if result.x is None:  # a set cover is always feasible (take every row), so this is a solver fault
        raise RuntimeError(f"HiGHS returned no cover: {result.message}")
    return result.x


def _greedy_cover(incidence: np.ndarray) -> list[int]:
    """Greedy set cover (first row covering the most uncovered tuples), then drop redundant rows."""
    ids, n_tuples = _compact(incidence)
    n_rows, per_row = ids.shape
    # rows_of[starts[k]:starts[k + 1]] are the rows that contain tuple k (an inverse index).
    flat = ids.ravel()
    order = np.argsort(flat, kind="stable")
    rows_of = order // per_row
    starts = np.searchsorted(flat[order], np.arange(n_tuples + 1))
    gain = np.full(n_rows, per_row, dtype=np.int64)
    uncovered = np.ones(n_tuples, dtype=bool)
    chosen: list[int] = []
    while uncovered.any():
        best = int(np.argmax(gain))
        chosen.append(best)
        fresh = ids[best][uncovered[ids[best]]]
        uncovered[fresh] = False
        hit = np.concatenate([rows_of[starts[k]:starts[k + 1]] for k in fresh])
        gain -= np.bincount(hit, minlength=n_rows)
    return _drop_redundant(ids, n_tuples, chosen)


def _cheapen(incidence: np.ndarray, chosen: list[int], costs: np.ndarray) -> list[int]:
    """Lower the cover's cost without adding rows: swap each row for the cheapest sole-cover-keeping one.

    A row's *sole* tuples are those no other chosen row covers; any candidate holding all of
    them may replace it and coverage stays complete. Each change strictly lowers the total
    cost or the row count, so the sweeps end; ties go to the first candidate (lexicographic).
    """
    ids, n_tuples = _compact(incidence)
    times_covered = np.bincount(ids[chosen].ravel(), minlength=n_tuples)
    rows: list[int | None] = list(chosen)
    changed = True
    while changed:
        changed = False
        for k, row in enumerate(rows):
            if row is None:
                continue
            sole = np.flatnonzero(times_covered[ids[row]] == 1)
            times_covered[ids[row]] -= 1
            if len(sole) == 0:  # every tuple it holds is covered elsewhere: drop it
                rows[k], changed = None, True
                continue
            fits = np.flatnonzero(np.all(ids[:, sole] == ids[row, sole], axis=1))
            best = int(fits[np.argmin(costs[fits])])
            kept = best if costs[best] < costs[row] else row
            rows[k], changed = kept, changed or kept != row
            times_covered[ids[kept]] += 1
    return [row for row in rows if row is not None]


def _cheapest_cover(incidence: np.ndarray, chosen: list[int], costs: np.ndarray) -> list[int]:
    """The least-cost cover of at most ``len(chosen)`` rows HiGHS finds at the root, if cheaper than ``chosen``.

    It changes rows together where the local pass cannot (2,3,3 at t=2 with one dear level:
    3 dear rows, not 4); a root node without a feasible cover keeps ``chosen``.
    """
    cover = _cover_matrix(incidence)
    n_rows = cover.shape[1]
    result = optimize.milp(
        c=costs,
        integrality=np.ones(n_rows),
        bounds=optimize.Bounds(0, 1),
        constraints=[optimize.LinearConstraint(cover, lb=1, ub=np.inf),
                     optimize.LinearConstraint(np.ones((1, n_rows)), lb=0, ub=len(chosen))],
        options={"node_limit": ILP_NODE_LIMIT},
    )
    if result.x is None:
        return chosen
    picked = [int(i) for i in np.flatnonzero(result.x > 0.5)]
    return picked if costs[picked].sum() < costs[chosen].sum() else chosen


def _drop_redundant(ids: np.ndarray, n_tuples: int, chosen: list[int]) -> list[int]:
    """Remove rows (latest picked first) whose every tuple is also covered by a kept row."""
    times_covered = np.bincount(ids[chosen].ravel(), minlength=n_tuples)
    kept = list(chosen)
    for row in reversed(chosen):
        if times_covered[ids[row]].min() >= 2:
            times_covered[ids[row]] -= 1
            kept.remove(row)
    return kept
