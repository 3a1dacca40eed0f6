"""Covering arrays: every allowed t-tuple covered, only allowed rows, deterministic, honest certificates.

Coverage is checked here by brute force (``brute_tuples`` over ``brute_allowed_rows``), never
with the generator's own checker."""
from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.matrix import covering
from harness.matrix.covering import exact

#: the factor set FIELD-NOTES measured: the exact ILP reaches the bound (16 at t=2, 48 at t=3).
REFERENCE = [3, 2, 4, 2, 2, 4, 2]
Forbid = list[dict[int, int]]
Row = tuple[int, ...]


def forbidding(forbidden: Forbid) -> Callable[[tuple[int, ...]], bool]:
    """Opaque row predicate: a row is forbidden when it matches every (factor, level) of some entry."""
    return lambda row: not any(all(row[f] == level for f, level in entry.items()) for entry in forbidden)


def clauses(domains: Sequence[int], forbidden: Forbid) -> covering.Forbidden:
    """The same constraints as forbidden clauses, which IPOG can judge on partial rows."""
    return covering.Forbidden(domains, [{f: [level] for f, level in entry.items()} for entry in forbidden])


def brute_tuples(rows: Sequence[Sequence[int]], t: int) -> set[tuple[tuple[int, int], ...]]:
    """The t-tuples contained in ``rows``, computed independently of the module under test."""
    return {tuple((f, row[f]) for f in combo)
            for row in rows for combo in itertools.combinations(range(len(row)), t)}


def brute_allowed_rows(domains: Sequence[int], allowed: Callable[[tuple[int, ...]], bool]) -> list[Row]:
    """Every allowed full row, by plain enumeration."""
    return [row for row in itertools.product(*map(range, domains)) if allowed(row)]


@st.composite
def spaces(draw: st.DrawFn) -> tuple[list[int], int, Forbid]:
    """2–6 factors of 1–4 levels, a strength 1..3, and up to four forbidden partial rows."""
    domains = draw(st.lists(st.integers(1, 4), min_size=2, max_size=6))
    t = draw(st.integers(1, min(3, len(domains))))
    entry = st.sets(st.integers(0, len(domains) - 1), min_size=1, max_size=min(3, len(domains))).flatmap(
        lambda factors: st.fixed_dictionaries({f: st.integers(0, domains[f] - 1) for f in sorted(factors)})
    )
    return domains, t, draw(st.lists(entry, max_size=4))


def check_array(domains: list[int], t: int, forbidden: Forbid, method: covering.Method) -> None:
    """The properties every covering array must have; the array is built twice to check determinism."""
    allowed = clauses(domains, forbidden) if method == "ipog" else forbidding(forbidden)
    result = covering.solve(domains, t, allowed, method=method)
    rows = result.rows
    candidates = brute_allowed_rows(domains, allowed)
    assert all(row in candidates for row in rows), "a forbidden or out-of-range row was returned"
    assert rows == sorted(set(rows)), "rows must be sorted and distinct"
    uncovered = brute_tuples(candidates, t) - brute_tuples(rows, t)
    assert not uncovered, f"allowed tuples not covered: {sorted(uncovered)[:5]}"
    if not forbidden:
        assert len(rows) >= math.prod(sorted(domains, reverse=True)[:t])
    assert result.bound <= len(rows), "the certificate's lower bound exceeds a real array"
    assert covering.covering_array(domains, t, allowed, method=method) == rows, "not deterministic"


@settings(max_examples=25, deadline=None)
@given(spaces())
def test_auto_covers_every_allowed_tuple(space: tuple[list[int], int, Forbid]) -> None:
    check_array(*space, method="auto")


@settings(max_examples=150, deadline=None)
@given(spaces())
def test_greedy_covers_every_allowed_tuple(space: tuple[list[int], int, Forbid]) -> None:
    check_array(*space, method="greedy")


@settings(max_examples=25, deadline=None)
@given(spaces().filter(lambda space: math.prod(space[0]) <= 64))
def test_ilp_covers_every_allowed_tuple(space: tuple[list[int], int, Forbid]) -> None:
    check_array(*space, method="ilp")


@pytest.mark.slow  # about 3 minutes of one core under load: make test runs it, make quick leaves it out
@settings(max_examples=60, deadline=None)
@given(spaces())
def test_ipog_covers_every_allowed_tuple(space: tuple[list[int], int, Forbid]) -> None:
    check_array(*space, method="ipog")


@pytest.mark.parametrize(("t", "bound"), [(2, 16), (3, 48)])
def test_reference_set_reaches_lower_bound(t: int, bound: int) -> None:
    """Speed is measured in benchmarks/bench_covering.py, never asserted here."""
    rows = covering.covering_array(REFERENCE, t, lambda row: True)
    assert covering.product_bound(REFERENCE, t) == bound
    assert len(rows) == bound


@pytest.mark.parametrize(("domains", "t"), [(REFERENCE, 3), ([2] * 12, 2)], ids=["exact", "ipog"])
def test_rows_are_identical_across_processes_and_hash_seeds(domains: list[int], t: int) -> None:
    """HiGHS and the seeded searches give the same rows in a fresh interpreter (no clock or hash order in them)."""
    clause = "{0: [1], 2: [1]}"
    code = ("from harness.matrix import covering; "
            f"print(covering.covering_array({domains}, {t}, covering.Forbidden({domains}, [{clause}])))")
    root = Path(__file__).resolve().parents[4]
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    fresh = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True, env=env)
    here = covering.covering_array(domains, t, covering.Forbidden(domains, [{0: [1], 2: [1]}]))
    assert fresh.stdout == f"{here}\n"


def test_lower_bound_is_product_of_largest_domains() -> None:
    assert [covering.product_bound(REFERENCE, t) for t in (1, 2, 3, 4)] == [4, 16, 48, 96]
    assert covering.product_bound([1, 1, 5], 2) == 5


@pytest.mark.parametrize(("domains", "t"), [([2, 3], 0), ([2, 3], 3), ([2, 0], 1), ([], 1), ([2, 2], True)])
def test_bad_arguments_name_the_value(domains: list[int], t: int) -> None:
    with pytest.raises(ValueError, match=r"t=|domain"):
        covering.covering_array(domains, t, lambda row: True)


def test_unknown_method_is_rejected() -> None:
    with pytest.raises(ValueError, match="'exact'"):
        covering.covering_array([2, 2], 2, lambda row: True, method="exact")  # type: ignore[arg-type]


def test_missing_tuples_finds_what_a_dropped_row_held() -> None:
    rows = covering.covering_array(REFERENCE, 2, lambda row: True)
    dropped, kept = rows[0], rows[1:]
    missing = covering.missing_tuples(kept, REFERENCE, 2, lambda row: True)
    assert missing, "a 16-row array at the bound has no redundant row"
    assert all(all(dropped[f] == level for f, level in ttuple) for ttuple in missing)
    assert covering.missing_tuples(rows, REFERENCE, 2, lambda row: True) == []


def test_forbidden_rows_never_count_as_coverage() -> None:
    allowed = forbidding([{0: 1, 1: 1}])
    every_level = [((0, 0),), ((0, 1),), ((1, 0),), ((1, 1),)]
    assert covering.missing_tuples([(1, 1)], [2, 2], 1, allowed) == every_level


def test_a_tuple_is_allowed_only_if_an_allowed_row_contains_it() -> None:
    """(factor 0 = 0) is forbidden by no single constraint, yet no allowed row contains it."""
    allowed = forbidding([{0: 0, 1: 0}, {0: 0, 1: 1}])
    assert covering.allowed_tuples([2, 2], 1, allowed) == [((0, 1),), ((1, 0),), ((1, 1),)]
    assert covering.covering_array([2, 2], 1, allowed) == [(1, 0), (1, 1)]


def test_everything_forbidden_gives_no_rows() -> None:
    assert covering.covering_array([2, 2], 2, lambda row: False) == []


def test_a_construction_that_misses_is_never_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exact, "greedy_cover", lambda incidence: [0])
    with pytest.raises(covering.CoverageError, match="misses"):
        covering.covering_array([2, 2], 2, lambda row: True, method="greedy")


def test_a_space_too_large_to_enumerate_is_built_by_ipog() -> None:
    """4^11 rows (4.2M) exceed the enumeration budget: clauses let IPOG build it without the product."""
    domains = [4] * 11
    assert math.prod(domains) > covering.MAX_ENUMERATED_ROWS
    result = covering.solve(domains, 2, covering.Forbidden(domains))
    every_pair = {((a, x), (b, y)) for a, b in itertools.combinations(range(11), 2) for x in range(4) for y in range(4)}
    assert every_pair <= brute_tuples(result.rows, 2)
    assert result.bound == 16 and not result.optimal and "IPOG" in result.how


def test_an_opaque_predicate_too_large_to_enumerate_is_refused_not_hung() -> None:
    with pytest.raises(ValueError, match="enumeration budget"):
        covering.covering_array([4] * 11, 2, lambda row: True)


@pytest.mark.parametrize(("domains", "t", "forbidden"), [
    ([3, 2, 4, 2, 2, 4, 2, 3, 2], 3, [{0: 0, 2: 3}, {1: 1, 5: 0}, {3: 1, 4: 1, 6: 1}, {7: 2, 8: 1}]),
    ([2] * 8, 4, []),
    ([4, 3, 3, 2, 2, 2, 2, 2, 2, 2], 2, [{0: 3, 1: 2}, {2: 0, 3: 1, 4: 1}]),
])
def test_ipog_with_clauses_matches_brute_force(domains: list[int], t: int, forbidden: Forbid) -> None:
    """IPOG (forced) on spaces small enough to check by enumeration, with clauses on partial rows."""
    allowed = clauses(domains, forbidden)
    rows = covering.covering_array(domains, t, allowed, method="ipog")
    candidates = brute_allowed_rows(domains, allowed)
    assert set(rows) <= set(candidates) and rows == sorted(set(rows))
    assert not brute_tuples(candidates, t) - brute_tuples(rows, t)


@pytest.mark.parametrize("clause", [{3: [0]}, {0: [2]}, {0: []}])
def test_a_clause_outside_the_domains_is_refused(clause: dict[int, list[int]]) -> None:
    with pytest.raises(ValueError, match="clause"):
        covering.Forbidden([2, 2, 2], [clause])


def test_partial_rows_extend_exactly_when_some_allowed_row_agrees() -> None:
    """``Forbidden.extendable`` against enumeration: (f0=0, f1=0) is allowed by no clause alone, yet forbidden."""
    domains = [2, 2, 3]
    allowed = covering.Forbidden(domains, [{0: [0], 2: [0, 1]}, {1: [0], 2: [2]}])
    full = brute_allowed_rows(domains, allowed)
    for partial in itertools.product(*([-1, *range(d)] for d in domains)):
        agrees = any(all(p in (-1, v) for p, v in zip(partial, row)) for row in full)
        assert allowed.extendable(partial) == agrees, partial
    assert not allowed.extendable((0, 0, -1))


@pytest.mark.parametrize(("domains", "t", "forbidden", "rows", "optimal"), [
    (REFERENCE, 3, [{0: 0, 2: 3}, {1: 1, 5: 0}, {3: 1, 4: 1, 6: 1}], 44, True),  # the ILP proves it
    ([3, 2, 3, 2, 2], 3, [{0: 0, 1: 1}, {0: 1, 1: 1}], 21, True),  # tiers' shape: 21 proven, counting bound 18
    ([2] * 12, 2, [], 7, False),  # optimal (Kleitman-Spencer), but no bound here proves it
])
def test_certificate_claims_optimal_only_when_proven(
    domains: list[int], t: int, forbidden: Forbid, rows: int, optimal: bool
) -> None:
    result = covering.solve(domains, t, clauses(domains, forbidden))
    assert len(result.rows) == rows and result.optimal is optimal
    assert result.bound <= rows and (result.bound == rows) is optimal


@pytest.mark.parametrize("method", ["auto", "ipog"])
def test_mixed_strength_covers_a_stronger_group_inside_a_pairwise_array(method: covering.Method) -> None:
    """Every triple of the group's levels, every pair of the rest, in fewer rows than 3-wise everywhere."""
    domains, group = [3, 3, 2, 2, 2, 2, 2], (2, 3, 5, 6)
    allowed = covering.Forbidden(domains, [{2: [0], 3: [1], 5: [1]}])
    rows = covering.covering_array(domains, 2, allowed, method=method, stronger=[(group, 3)])
    candidates = brute_allowed_rows(domains, allowed)
    assert set(rows) <= set(candidates)
    assert not brute_tuples(candidates, 2) - brute_tuples(rows, 2)
    triples = {tuple((f, row[f]) for f in combo) for combo in itertools.combinations(group, 3) for row in candidates}
    assert triples <= {tuple((f, row[f]) for f in combo) for combo in itertools.combinations(group, 3) for row in rows}
    assert len(rows) < len(covering.covering_array(domains, 3, allowed, method=method))


def test_a_stronger_group_outside_the_factors_is_refused() -> None:
    with pytest.raises(ValueError, match=r"stronger group \[1, 7\]"):
        covering.solve([2, 2, 2], 2, covering.Forbidden([2, 2, 2]), stronger=[((1, 7), 2)])


#: the smoke matrix's shape: model, cache, scheduler, page_size, pool, backend, spec.
SMOKE = [2, 3, 2, 2, 2, 2, 4]
BACKEND, PAGE_SIZE = 5, 3


def smoke_allowed(row: Row) -> bool:
    """Triton (backend 1) is forbidden at page_size 1 (index 0), as in matrices/smoke.toml."""
    return not (row[BACKEND] == 1 and row[PAGE_SIZE] == 0)


def dear_level(factor: int, level: int, price: float = 50.0) -> Callable[[Row], float]:
    """Row cost: ``price`` when ``row[factor] == level``, else 1."""
    return lambda row: price if row[factor] == level else 1.0


@pytest.mark.parametrize(("domains", "t", "forbidden"), [
    (REFERENCE, 2, []), (REFERENCE, 2, [{0: 0, 2: 3}, {1: 1, 5: 0}]), (REFERENCE, 3, []),
    ([2, 3, 3], 2, []), ([4, 4, 3, 2], 2, [{0: 3, 1: 3}]), ([2, 2, 2, 4, 4], 3, []),
])
def test_cost_never_adds_rows_and_keeps_coverage(domains: list[int], t: int, forbidden: Forbid) -> None:
    allowed = forbidding(forbidden)
    plain = covering.covering_array(domains, t, allowed)
    for factor in (0, len(domains) - 1):  # every factor costs minutes at t=3; the ends differ in search order
        cost = dear_level(factor, domains[factor] - 1)
        rows = covering.covering_array(domains, t, allowed, cost=cost)
        assert len(rows) <= len(plain), f"a cost on factor {factor} added rows"
        assert sum(map(cost, rows)) <= sum(map(cost, plain)), f"a cost on factor {factor} made the array dearer"
        assert covering.missing_tuples(rows, domains, t, allowed) == []
        assert covering.covering_array(domains, t, allowed, cost=cost) == rows, "not deterministic"


@settings(max_examples=20, deadline=None)  # each example solves up to three ILPs
@given(spaces(), st.data())
def test_cost_keeps_every_property_of_the_array(space: tuple[list[int], int, Forbid], data: st.DataObject) -> None:
    domains, t, forbidden = space
    factor = data.draw(st.integers(0, len(domains) - 1))
    cost = dear_level(factor, data.draw(st.integers(0, domains[factor] - 1)), data.draw(st.floats(0, 100)))
    allowed = forbidding(forbidden)
    rows = covering.covering_array(domains, t, allowed, cost=cost)
    assert all(allowed(row) for row in rows) and rows == sorted(set(rows))
    assert not brute_tuples(brute_allowed_rows(domains, allowed), t) - brute_tuples(rows, t)
    assert len(rows) <= len(covering.covering_array(domains, t, allowed))
    assert covering.covering_array(domains, t, allowed, cost=cost) == rows


@pytest.mark.parametrize(("domains", "factor", "level", "fewest"), [
    ([2, 3, 3], 0, 0, 3),  # level 0 of factor 0 meets each of factor 1's 3 levels: 3 rows, a diagonal does it
    ([3, 3, 2, 2], 2, 0, 3),
    (SMOKE, 0, 0, 4),  # model=dense on the smoke shape meets spec's 4 levels (7 rows without the cost pass)
    ([2, 3, 3], 0, 1, 3),  # the local pass stops at 4: two rows must change together (the cost ILP does it)
])
def test_a_dear_level_takes_the_fewest_rows_coverage_allows(
    domains: list[int], factor: int, level: int, fewest: int
) -> None:
    allowed = smoke_allowed if domains == SMOKE else (lambda row: True)
    plain = covering.covering_array(domains, 2, allowed)
    rows = covering.covering_array(domains, 2, allowed, cost=dear_level(factor, level))
    assert len(rows) == len(plain)
    assert sum(row[factor] == level for row in rows) == fewest


@pytest.mark.parametrize("method", ["auto", "ilp"])  # plain greedy stops at 13 rows here
def test_smoke_shape_puts_triton_in_four_rows(method: covering.Method) -> None:
    """Triton must meet each of spec's 4 levels, one per row: 4 Triton rows is the minimum, at 12 rows."""
    rows = covering.covering_array(SMOKE, 2, smoke_allowed, method=method, cost=dear_level(BACKEND, 1))
    assert len(rows) == covering.product_bound(SMOKE, 2) == 12
    assert sum(row[BACKEND] == 1 for row in rows) == 4
    assert covering.missing_tuples(rows, SMOKE, 2, smoke_allowed) == []


@pytest.mark.parametrize(("domains", "factor", "fewest"), [
    ([3, 3, 2, 2, 2], 4, 3),  # IPOG alone puts the dear level in 4 rows
    (SMOKE, BACKEND, 4),  # the smoke shape built by IPOG: 5 Triton rows without the cost pass
])
def test_ipog_cost_pass_moves_cells_to_cheaper_levels(domains: list[int], factor: int, fewest: int) -> None:
    allowed = covering.Forbidden(domains)
    plain = covering.covering_array(domains, 2, allowed, method="ipog")
    cost = dear_level(factor, 1)
    rows = covering.covering_array(domains, 2, allowed, method="ipog", cost=cost)
    assert len(rows) == len(plain) and sum(row[factor] == 1 for row in rows) == fewest
    assert sum(map(cost, rows)) < sum(map(cost, plain))
    assert not brute_tuples(brute_allowed_rows(domains, allowed), 2) - brute_tuples(rows, 2)


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan])
def test_a_bad_cost_names_the_row(bad: float) -> None:
    with pytest.raises(ValueError, match=r"row cost must be finite and >= 0, got .* for row \(0, 0\)"):
        covering.covering_array([2, 2], 2, lambda row: True, cost=lambda row: bad)
