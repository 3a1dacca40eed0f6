"""t-wise covering arrays on level indices: few rows that contain every allowed t-tuple.

Pure combinatorics, no matrix files: a factor is a domain size, a level an index into it,
a row one level per factor. ``allowed`` says whether a full row may run: an opaque predicate,
or a ``Forbidden`` set of clauses (which can also judge partial rows). A t-tuple is *allowed*
(required) when some allowed row contains it; a covering array holds only allowed rows and
contains every allowed t-tuple.

What runs (``solve``, method ``auto``):

- Small spaces (the product of the domains × the interactions up to ``EXACT_MAX_INCIDENCES``,
  or any opaque predicate): every allowed row is a candidate. Greedy set cover, then the local
  search of ``postopt`` down towards the counting bound, then the LP bound, and, when the rows
  are at most ``ILP_MAX_GAP`` above it and the model is within ``exact.ILP_MAX_INCIDENCES``, a
  set-cover ILP over *all* candidates (HiGHS, at most ``ILP_NODE_LIMIT`` nodes) asked for one
  row fewer: a solution replaces the rows, infeasibility proves them optimal.
- Larger spaces with clause constraints: IPOG (``ipog``), which never enumerates the product,
  then the same local search; unconstrained ones also try algebraic seeds (``algebra``: a
  covering perfect hash family over GF(q) on as many factors as one is found for, grown to the
  rest by IPOG; ``orbit``, for at most 3 levels at t=3 only: a starter array's images under every
  permutation of the levels), the smallest kept only when smaller and covering.
- Then, in both, while the rows are above the counting bound: the fixed-size search
  (``fixedsize``), at most ``moves`` moves (``[matrix] search_moves``).

What is guaranteed: every returned array is checked against the allowed tuples (a gap raises
``CoverageError``); the rows are sorted and depend on nothing but the input (seeded search,
node and move counts, no clock — an ILP past its ``ILP_TIME_LIMIT_S`` safety net, or a fixed-size
search past ``fixedsize.WALL_CAP_S``, is discarded, and the certificate says so); ``Covering.bound`` is a proven lower bound (the most allowed
tuples on one t-subset, raised by the LP or ILP where they ran), so ``optimal`` is claimed
only when the rows meet it. The row count is otherwise the best found, not a minimum.

With a ``cost`` per row, the row count is fixed first and cost passes then lower the total cost
at that count (small spaces: ``exact.cheapen`` and ``exact.cheapest_cover``; IPOG spaces:
``postopt.cheapen_cells``). ``stronger`` groups (mixed strength) are more interactions to cover.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from harness.matrix.covering.exact import ILP_MAX_GAP, ILP_NODE_LIMIT, ILP_TIME_LIMIT_S
from harness.matrix.covering.fixedsize import DEFAULT_MOVES
from harness.matrix.covering.solve import (
    EXACT_MAX_INCIDENCES, METHODS, CoverageError, Covering, Method, check_args, covering_array, interactions, solve,
)
from harness.matrix.covering.space import (
    MAX_ENUMERATED_ROWS, Forbidden, Row, TTuple, TupleSpace, interactions_at, required_mask,
)

__all__ = [
    "DEFAULT_MOVES", "EXACT_MAX_INCIDENCES", "ILP_MAX_GAP", "ILP_NODE_LIMIT", "ILP_TIME_LIMIT_S", "MAX_ENUMERATED_ROWS", "METHODS",
    "CoverageError", "Covering", "Forbidden", "Method", "Row", "TTuple", "TupleSpace", "allowed_tuples",
    "covering_array", "interactions", "interactions_at", "product_bound", "missing_tuples", "required_mask", "solve",
]


def product_bound(domains: Sequence[int], t: int) -> int:
    """Product of the t largest domains: no t-wise array of the *unconstrained* space is smaller."""
    check_args(domains, t)
    return math.prod(sorted(domains, reverse=True)[:t])


def allowed_tuples(domains: Sequence[int], t: int, allowed: Callable[[Row], bool],
                   stronger: Sequence[tuple[Sequence[int], int]] = ()) -> list[TTuple]:
    """Every allowed t-tuple (contained in at least one allowed row), and the ``stronger`` groups' ones, sorted."""
    return missing_tuples([], domains, t, allowed, stronger)


def missing_tuples(rows: Sequence[Sequence[int]], domains: Sequence[int], t: int, allowed: Callable[[Row], bool],
                   stronger: Sequence[tuple[Sequence[int], int]] = ()) -> list[TTuple]:
    """Allowed t-tuples (and ``stronger`` groups' tuples) no allowed row of ``rows`` contains (a forbidden row never runs)."""
    check_args(domains, t)
    space = TupleSpace(domains, interactions(domains, t, stronger))
    runnable = [tuple(int(level) for level in row) for row in rows]
    runnable = np.array([row for row in runnable if allowed(row)], dtype=np.int64).reshape(-1, len(domains))
    covered = np.zeros(space.size, dtype=bool)
    covered[space.ids(runnable).ravel()] = True
    return [space.decode(int(i)) for i in np.flatnonzero(required_mask(space, allowed) & ~covered)]
