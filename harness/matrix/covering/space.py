"""The space a covering array lives in: domains, forbidden clauses, and the numbering of t-tuples.

A factor is a domain size, a level an index into it, a row one level per factor; a partial
row marks a factor not yet chosen with ``FREE`` (-1). An *interaction* is a sorted tuple of
factor indices (every t-subset at strength t); a tuple is one level on each factor of an
interaction, and it is *required* when some allowed full row contains it.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

Row = tuple[int, ...]
#: one tuple: ((factor index, level index), ...) in increasing factor order.
TTuple = tuple[tuple[int, int], ...]
Interaction = tuple[int, ...]
#: a factor not chosen yet in a partial row.
FREE = -1
#: full rows enumerated to find the allowed ones when the predicate sees whole rows only.
MAX_ENUMERATED_ROWS = 2_000_000


class Forbidden:
    """Forbidden clauses: a row is forbidden when, for one clause, every named factor sits at a listed level.

    Called on a full row it is a predicate (True: allowed). Unlike an opaque predicate it also
    says whether a *partial* row extends to an allowed full row (``extendable``), which is what
    lets the generator build rows without enumerating the product of the domains.
    """

    def __init__(self, domains: Sequence[int], clauses: Iterable[Mapping[int, Iterable[int]]] = ()) -> None:
        self.domains = tuple(domains)
        self.clauses = tuple(
            tuple(sorted((int(f), frozenset(int(level) for level in levels)) for f, levels in clause.items()))
            for clause in clauses
        )
        for clause in self.clauses:
            if not clause or any(not 0 <= f < len(self.domains) or not levels
                                 or not all(0 <= level < self.domains[f] for level in levels) for f, levels in clause):
                raise ValueError(f"forbidden clause {dict(clause)} names a factor or level outside the domains "
                                 f"{list(self.domains)}, or no level")
        self.factors = tuple(sorted({f for clause in self.clauses for f, _ in clause}))
        self._memo: dict[tuple[int, ...], bool] = {}
        # per clause, per named factor: a level → "at a forbidden level" table, for whole arrays of rows
        self._tables = [[(f, np.isin(np.arange(self.domains[f]), list(levels))) for f, levels in clause]
                        for clause in self.clauses]

    def __call__(self, row: Sequence[int]) -> bool:
        return not any(all(row[f] in levels for f, levels in clause) for clause in self.clauses)

    def extendable(self, row: Sequence[int]) -> bool:
        """Whether the partial ``row`` (``FREE`` where unchosen) extends to an allowed full row."""
        key = tuple(int(row[f]) for f in self.factors)
        if key not in self._memo:
            assigned = {f: level for f, level in zip(self.factors, key) if level != FREE}
            self._memo[key] = self._extends(assigned)
        return self._memo[key]

    def _extends(self, assigned: dict[int, int]) -> bool:
        """Depth-first search: branch on an open factor of the first clause still alive."""
        live = None
        for clause in self.clauses:
            if any(f in assigned and assigned[f] not in levels for f, levels in clause):
                continue  # dead: a chosen level is outside the clause
            open_factors = [(f, levels) for f, levels in clause if f not in assigned]
            if not open_factors:
                return False  # every factor of the clause sits at a forbidden level
            live = live or open_factors[0]
        if live is None:
            return True  # no clause can still match, whatever the free factors take
        f, levels = live
        order = sorted(range(self.domains[f]), key=lambda level: level in levels)  # escape the clause first
        return any(self._extends({**assigned, f: level}) for level in order)

    def complete(self, row: Sequence[int]) -> Row:
        """An allowed full row extending the extendable partial ``row``: each free factor at its lowest fitting level."""
        filled = [int(level) for level in row]
        for f, level in enumerate(filled):
            if level == FREE:
                filled[f] = next(v for v in range(self.domains[f])
                                 if self.extendable(filled[:f] + [v] + filled[f + 1:]))
        return tuple(filled)

    def allowed_mask(self, rows: np.ndarray) -> np.ndarray:
        """For an (n, k) array of full rows, which are allowed (vectorised over rows)."""
        ok = np.ones(len(rows), dtype=bool)
        for clause in self._tables:
            hit = np.ones(len(rows), dtype=bool)
            for f, table in clause:
                hit &= table[rows[:, f]]
            ok &= ~hit
        return ok


RowCheck = Callable[[np.ndarray], np.ndarray]


def row_check(domains: Sequence[int], allowed: Callable[[Row], bool]) -> RowCheck:
    """A vectorised ``allowed`` over (n, k) arrays of full rows: clauses directly, else a table of the product."""
    if isinstance(allowed, Forbidden):
        return allowed.allowed_mask
    table = np.zeros(math.prod(domains), dtype=bool)
    for row in enumerated_allowed_rows(domains, allowed):
        table[np.ravel_multi_index(row, domains)] = True
    return lambda rows: table[np.ravel_multi_index(tuple(rows.T), domains)]


def enumerated_allowed_rows(domains: Sequence[int], allowed: Callable[[Row], bool]) -> list[Row]:
    """Every allowed full row in lexicographic order, refused past ``MAX_ENUMERATED_ROWS``."""
    size = math.prod(domains)
    if size > MAX_ENUMERATED_ROWS:
        raise ValueError(f"{size} rows in the product of domains {list(domains)} exceed the enumeration "
                         f"budget of {MAX_ENUMERATED_ROWS}; give the constraints as forbidden clauses "
                         f"(harness.matrix.covering.Forbidden) or split the matrix")
    return [row for row in itertools.product(*(range(d) for d in domains)) if allowed(row)]


def interactions_at(k: int, t: int) -> list[Interaction]:
    """Every t-subset of k factors, in lexicographic order: what strength t must cover."""
    return list(itertools.combinations(range(k), t))


class TupleSpace:
    """Numbers every tuple: each interaction owns a block of mixed-radix ids (its last factor varies fastest)."""

    def __init__(self, domains: Sequence[int], interactions: Sequence[Interaction]) -> None:
        self.domains = tuple(domains)
        self.interactions = [tuple(combo) for combo in interactions]
        self.dims = [tuple(domains[f] for f in combo) for combo in self.interactions]
        self.offsets = np.cumsum([0, *(math.prod(d) for d in self.dims)])
        self.size = int(self.offsets[-1])

    def ids(self, rows: np.ndarray) -> np.ndarray:
        """(rows × interactions) ids of the tuples each full row contains."""
        ids = np.empty((rows.shape[0], len(self.interactions)), dtype=np.int64)
        for j, (combo, dims) in enumerate(zip(self.interactions, self.dims)):
            ids[:, j] = self.offsets[j] + np.ravel_multi_index(tuple(rows[:, list(combo)].T), dims)
        return ids

    def decode(self, tuple_id: int) -> TTuple:
        """The tuple behind one id."""
        j = int(np.searchsorted(self.offsets, tuple_id, side="right")) - 1
        levels = np.unravel_index(tuple_id - int(self.offsets[j]), self.dims[j])
        return tuple((f, int(level)) for f, level in zip(self.interactions[j], levels))

    def counting_bound(self, required: np.ndarray) -> int:
        """Most required tuples on one interaction: each row covers one of them, so no cover is smaller."""
        return max((int(required[a:b].sum()) for a, b in zip(self.offsets[:-1], self.offsets[1:])), default=0)


def required_mask(space: TupleSpace, allowed: Callable[[Row], bool]) -> np.ndarray:
    """Which tuple ids some allowed full row contains: by clause search, else by enumerating the product."""
    if not isinstance(allowed, Forbidden):
        required = np.zeros(space.size, dtype=bool)
        rows = np.array(enumerated_allowed_rows(space.domains, allowed), dtype=np.int64).reshape(-1, len(space.domains))
        required[space.ids(rows).ravel()] = True
        return required
    required = np.ones(space.size, dtype=bool)
    partial = [FREE] * len(space.domains)
    if not allowed.extendable(partial):
        return np.zeros(space.size, dtype=bool)
    for j, (combo, dims) in enumerate(zip(space.interactions, space.dims)):
        if not set(combo) & set(allowed.factors):
            continue  # no clause names these factors: every tuple extends
        for offset, levels in enumerate(itertools.product(*(range(d) for d in dims))):
            row = list(partial)
            for f, level in zip(combo, levels):
                row[f] = level
            required[space.offsets[j] + offset] = allowed.extendable(row)
    return required
