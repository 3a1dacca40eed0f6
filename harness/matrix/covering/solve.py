"""Which construction runs for which space, and the certificate that comes back with the rows."""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from harness.matrix.covering import algebra, exact, fixedsize, orbit, postopt
from harness.matrix.covering.ipog import ipog
from harness.matrix.covering.space import (
    Forbidden, Interaction, Row, RowCheck, TupleSpace, enumerated_allowed_rows, interactions_at, required_mask, row_check,
)

Method = Literal["auto", "ilp", "greedy", "ipog"]
METHODS = ("auto", "ilp", "greedy", "ipog")
#: candidate rows × interactions up to which ``auto`` enumerates the product and solves set cover
#: over it (greedy, local search, the LP bound and a node-limited ILP); past it, IPOG.
EXACT_MAX_INCIDENCES = 250_000
#: candidate rows × interactions held in memory at once by a forced exact method (8 bytes each).
MAX_INCIDENCES = 20_000_000


class CoverageError(AssertionError):
    """A generated array misses a required tuple: a generator bug, never ignored."""


@dataclass(frozen=True, slots=True)
class Covering:
    """A covering array and its certificate: no array of these allowed tuples has fewer than ``bound`` rows."""

    rows: list[Row]
    bound: int
    how: str

    @property
    def optimal(self) -> bool:
        """Proven minimum: the rows meet a proven lower bound."""
        return len(self.rows) == self.bound


def solve(domains: Sequence[int], t: int, allowed: Callable[[Row], bool], *, method: Method = "auto",
          cost: Callable[[Row], float] | None = None, stronger: Sequence[tuple[Sequence[int], int]] = (),
          moves: int = fixedsize.DEFAULT_MOVES) -> Covering:
    """A t-wise covering array of the allowed rows, sorted, with its lower bound and how it was built.

    ``stronger`` asks for mixed strength: each (factors, s) also covers every allowed s-tuple of
    those factors (a 3-wise core inside a 2-wise array); every construction takes it as more
    interactions to cover. ``moves`` bounds the fixed-size search (0: none; ``fixedsize``).
    """
    check_args(domains, t)
    if method not in METHODS:
        raise ValueError(f"unknown covering method {method!r} (methods: {', '.join(METHODS)})")
    if isinstance(moves, bool) or not isinstance(moves, int) or moves < 0:
        raise ValueError(f"search moves must be an int >= 0, got {moves!r}")
    combos = interactions(domains, t, stronger)
    space = TupleSpace(domains, combos)
    if method == "ipog" or (method == "auto" and _beyond_enumeration(domains, combos, allowed)):
        result = _ipog_covering(domains, t, space, allowed, cost, moves)
    else:
        result = _exact_covering(domains, space, allowed, method, cost, moves)
    rows = sorted(result.rows)
    missing = _missing_ids(rows, space, allowed)
    if len(missing):
        raise CoverageError(f"covering array for domains {list(domains)} at t={t} misses {len(missing)} "
                            f"allowed tuples, first {space.decode(int(missing[0]))}")
    return Covering(rows, result.bound, result.how)


def interactions(domains: Sequence[int], t: int, stronger: Sequence[tuple[Sequence[int], int]] = ()) -> list[Interaction]:
    """Every t-subset of the factors, then each stronger group's s-subsets not already listed."""
    combos = interactions_at(len(domains), t)
    seen = set(combos)
    for factors, s in stronger:
        group = sorted(set(factors))
        if not group or any(not 0 <= f < len(domains) for f in group) or not 1 <= s <= len(group):
            raise ValueError(f"stronger group {list(factors)} at strength {s!r} is not s distinct factors "
                             f"of {len(domains)} with 1 <= s <= len(group)")
        fresh = [combo for combo in itertools.combinations(group, s) if combo not in seen]
        combos.extend(fresh)
        seen.update(fresh)
    return combos


def _beyond_enumeration(domains: Sequence[int], combos: list[Interaction], allowed: Callable[[Row], bool]) -> bool:
    """Whether ``auto`` builds with IPOG: clause constraints (or none) on a product too big to enumerate."""
    return isinstance(allowed, Forbidden) and math.prod(domains) * len(combos) > EXACT_MAX_INCIDENCES


def _ipog_covering(domains: Sequence[int], t: int, space: TupleSpace, allowed: Callable[[Row], bool],
                   cost: Callable[[Row], float] | None, moves: int) -> Covering:
    """IPOG on the factors largest domain first, post-optimisation, algebraic seeds where they apply and are
    smaller, the fixed-size search, the cell-wise cost pass; bound from the tuples."""
    if not isinstance(allowed, Forbidden):
        raise ValueError("IPOG needs the constraints as forbidden clauses (harness.covering.Forbidden)")
    order = sorted(range(len(domains)), key=lambda f: -domains[f])
    back = np.argsort(order)
    ordered = Forbidden([domains[f] for f in order],
                        [{int(back[f]): levels for f, levels in clause} for clause in allowed.clauses])
    inner = TupleSpace(ordered.domains, [tuple(sorted(int(back[f]) for f in combo)) for combo in space.interactions])
    required = required_mask(inner, ordered)
    built = ipog(ordered.domains, inner.interactions, required, ordered)
    floor = inner.counting_bound(required)
    reduced = postopt.reduce_rows(built, inner, required, ordered.allowed_mask, floor)
    how = f"IPOG ({len(built)} rows), post-optimisation ({len(reduced)})"
    if not ordered.clauses and len(inner.interactions) == math.comb(len(domains), t) and len(reduced) > floor:
        reduced, how = _seeded(reduced, t, ordered, inner, required, floor, how)
    check = ordered.allowed_mask if ordered.clauses else None
    reduced, how = _fixed_size(reduced, inner, required, check, floor, moves, how)
    if cost is not None:
        def inner_cost(row: Row) -> float:
            return cost(tuple(row[back[f]] for f in range(len(domains))))

        _check_costs(reduced, inner_cost)
        reduced = postopt.cheapen_cells(reduced, inner, required, ordered.allowed_mask, inner_cost, ordered.domains)
        how += ", cost pass"
    rows = [tuple(int(row[back[f]]) for f in range(len(domains))) for row in reduced]
    return Covering(rows, floor, how)


def _seeded(rows: np.ndarray, t: int, forbidden: Forbidden, space: TupleSpace, required: np.ndarray, floor: int,
            how: str) -> tuple[np.ndarray, str]:
    """The smallest of ``rows`` and the algebraic seeds that apply (the S3 orbit of a starter, a CPHF), each grown to
    every factor by IPOG and post-optimised, kept only if it covers every required tuple (checked here: a seed is
    never trusted)."""
    field = algebra.prime_power_at_least(max(forbidden.domains))
    seeds = ((orbit.orbit_seed, "S3 orbit seed"), (algebra.cphf_seed, f"CPHF seed over GF({field})"))
    for build, name in seeds:
        seed = build(forbidden.domains, t, len(rows))
        if seed is None:
            continue
        grown = seed
        if seed.shape[1] < len(forbidden.domains):
            grown = ipog(forbidden.domains, space.interactions, required, forbidden, start=seed)
        seeded = postopt.reduce_rows(grown, space, required, forbidden.allowed_mask, floor)
        if len(seeded) >= len(rows) or not _covers(seeded, space, required):
            continue
        grew = f", IPOG growth to {len(grown)}" if seed.shape[1] < len(forbidden.domains) else ""
        rows, how = seeded, (f"{how}; {name} on {seed.shape[1]} factors ({len(seed)} rows){grew}, "
                             f"post-optimisation ({len(seeded)})")
    return rows, how


def _exact_covering(domains: Sequence[int], space: TupleSpace, allowed: Callable[[Row], bool], method: Method,
                    cost: Callable[[Row], float] | None, moves: int) -> Covering:
    """Set cover over every allowed row: greedy, local search, then the ILP where it may prove or improve."""
    candidates = np.array(enumerated_allowed_rows(domains, allowed), dtype=np.int64).reshape(-1, len(domains))
    if len(candidates) == 0:
        return Covering([], 0, "no allowed row")
    if candidates.shape[0] * len(space.interactions) > MAX_INCIDENCES:
        raise ValueError(f"{candidates.shape[0]} rows × {len(space.interactions)} factor subsets exceed the "
                         f"enumeration budget of {MAX_INCIDENCES}; split the matrix or lower t")
    incidence = space.ids(candidates)
    required = np.zeros(space.size, dtype=bool)
    required[incidence.ravel()] = True
    floor = space.counting_bound(required)
    chosen = exact.greedy_cover(incidence)
    how = "greedy set cover"
    if method != "greedy" and len(chosen) > floor:
        check = row_check(domains, allowed)
        reduced = postopt.reduce_rows(candidates[chosen], space, required, check, floor)
        reduced, how = _fixed_size(reduced, space, required, check, floor, moves, how + ", local search")
        index = {tuple(row): i for i, row in enumerate(candidates.tolist())}
        chosen = [index[tuple(row)] for row in reduced.tolist()]
    bound = floor
    if method == "ilp" or (method == "auto" and len(chosen) > floor):
        outcome = exact.improve_or_prove(incidence, chosen, None if method == "ilp" else exact.ILP_MAX_GAP)
        chosen = outcome.rows if outcome.rows is not None and len(outcome.rows) < len(chosen) else chosen
        bound, how = max(bound, outcome.bound), f"{how}, ILP: {outcome.note}"
    if cost is not None:
        chosen = _cheapest(incidence, chosen, candidates, cost, method)
    return Covering([tuple(int(v) for v in candidates[i]) for i in chosen], bound, how)


def _fixed_size(rows: np.ndarray, space: TupleSpace, required: np.ndarray, check: RowCheck | None, floor: int,
                moves: int, how: str) -> tuple[np.ndarray, str]:
    """The fixed-size search's rows where it ran and found fewer, and the certificate's words for what it did."""
    if moves == 0 or len(rows) <= floor:
        return rows, how
    shrunk = fixedsize.shrink(rows, space, required, check, floor, moves)
    if shrunk.capped:
        return rows, f"{how}, fixed-size search stopped by its {fixedsize.WALL_CAP_S:g} s safety net (discarded)"
    rows = np.unique(shrunk.rows, axis=0)  # a repeated row covers nothing new
    return rows, f"{how}, fixed-size search ({len(rows)} rows, {shrunk.moves:,} moves)"


def _covers(rows: np.ndarray, space: TupleSpace, required: np.ndarray) -> bool:
    """Whether ``rows`` (all allowed) contain every required tuple: how a seed is checked before it is used."""
    covered = np.zeros(space.size, dtype=bool)
    covered[space.ids(rows).ravel()] = True
    return bool((covered | ~required).all())


def _cheapest(incidence: np.ndarray, chosen: list[int], candidates: np.ndarray, cost: Callable[[Row], float],
              method: Method) -> list[int]:
    """The cost passes at the same row count: the local swap pass, then (not for greedy) the root-node cost ILP."""
    costs = row_costs(candidates, cost)
    chosen = exact.cheapen(incidence, chosen, costs)
    return chosen if method == "greedy" else exact.cheapest_cover(incidence, chosen, costs)


def _check_costs(rows: np.ndarray, cost: Callable[[Row], float]) -> None:
    """Reject a negative or non-finite cost of an array's rows (IPOG prices rows, never the whole product)."""
    row_costs(rows, cost)


def row_costs(candidates: np.ndarray, cost: Callable[[Row], float]) -> np.ndarray:
    """``cost`` of every candidate row; a negative or non-finite cost names the row at fault."""
    costs = np.array([cost(tuple(int(level) for level in row)) for row in candidates], dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(costs) | (costs < 0))
    if len(bad):
        row = tuple(int(level) for level in candidates[bad[0]])
        raise ValueError(f"row cost must be finite and >= 0, got {costs[bad[0]]!r} for row {row}")
    return costs


def _missing_ids(rows: Sequence[Row], space: TupleSpace, allowed: Callable[[Row], bool]) -> np.ndarray:
    """Required tuple ids that no allowed row of ``rows`` contains."""
    required = required_mask(space, allowed)
    runnable = np.array([row for row in rows if allowed(row)], dtype=np.int64).reshape(-1, len(space.domains))
    covered = np.zeros(space.size, dtype=bool)
    covered[space.ids(runnable).ravel()] = True
    return np.flatnonzero(required & ~covered)


def covering_array(domains: Sequence[int], t: int, allowed: Callable[[Row], bool], *, method: Method = "auto",
                   cost: Callable[[Row], float] | None = None, stronger: Sequence[tuple[Sequence[int], int]] = (),
                   moves: int = fixedsize.DEFAULT_MOVES) -> list[Row]:
    """The rows of ``solve``: a t-wise covering array of the allowed rows, sorted."""
    return solve(domains, t, allowed, method=method, cost=cost, stronger=stronger, moves=moves).rows


def check_args(domains: Sequence[int], t: int) -> None:
    """Reject empty domains and strengths outside 1..len(domains), naming the value at fault."""
    bad = [d for d in domains if not isinstance(d, int) or isinstance(d, bool) or d < 1]
    if bad:
        raise ValueError(f"domain sizes must be positive ints, got {bad[0]!r} in {list(domains)}")
    if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= len(domains):
        raise ValueError(f"strength t={t!r} is out of range 1..{len(domains)} for domains {list(domains)}")
