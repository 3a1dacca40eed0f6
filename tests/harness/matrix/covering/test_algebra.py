"""The algebraic seeds (CPHF over a Galois field): the field tables are a field, the moment-curve seed is an
orthogonal array, a seed over a bigger field merges levels and still covers, and one that covers replaces the
construction. Coverage is checked by brute force (``brute_tuples``), never with the generator's own checker."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from harness.matrix import covering
from harness.matrix.covering import algebra
from tests.harness.matrix.covering.test_fixedsize import every_tuple
from tests.harness.matrix.covering.test_solve import brute_tuples


@pytest.mark.parametrize("q", [2, 3, 4, 5, 7, 8, 9])
def test_galois_field_tables_are_a_field(q: int) -> None:
    add, mul = algebra.galois_field(q)
    elements = np.arange(q)
    assert all(sorted(add[a].tolist()) == list(range(q)) for a in range(q)), "addition is not a group"
    assert all(sorted(mul[a, 1:].tolist()) == list(range(1, q)) for a in range(1, q)), "a nonzero has no inverse"
    assert (mul[:, 0] == 0).all() and (add[:, 0] == elements).all() and (mul[:, 1] == elements).all()
    a, b, c = np.meshgrid(elements, elements, elements, indexing="ij")
    assert (mul[a, add[b, c]] == add[mul[a, b], mul[a, c]]).all(), "not distributive"
    assert (add == add.T).all() and (mul == mul.T).all()


@pytest.mark.parametrize(("q", "t"), [(3, 3), (4, 3), (5, 3), (4, 2), (2, 3)])
def test_the_moment_curve_seed_is_an_orthogonal_array(q: int, t: int) -> None:
    """q + 1 factors of q levels: q^t rows, every t-tuple exactly once (Reed-Solomon)."""
    domains = [q] * (q + 1 if t <= q else t + 1)
    rows = algebra.cphf_seed(domains, t, below=10 ** 6)
    assert rows is not None and rows.shape == (q ** t, len(domains))
    for combo in itertools.combinations(range(len(domains)), t):
        assert len({tuple(row) for row in rows[:, list(combo)].tolist()}) == q ** t, combo


def test_two_blocks_over_gf3_cover_thirteen_factors_in_53_rows() -> None:
    rows = algebra.cphf_seed([3] * 13, 3, below=60)
    assert rows is not None and rows.shape == (53, 13)
    assert brute_tuples(rows.tolist(), 3) == every_tuple([3] * 13, 3)


@pytest.mark.parametrize(("domains", "t"), [([3, 3, 3, 2], 3), ([4, 3, 2, 3, 4], 2), ([5, 4, 4, 3, 2, 2], 2)])
def test_a_seed_over_a_bigger_field_merges_levels_and_still_covers(domains: list[int], t: int) -> None:
    rows = algebra.cphf_seed(domains, t, below=10 ** 6)
    assert rows is not None and (rows < np.array(domains)).all()
    assert brute_tuples(rows.tolist(), t) == every_tuple(domains, t)


def test_an_algebraic_seed_that_covers_replaces_the_construction() -> None:
    """5^6 at t=2 through IPOG: IPOG and post-optimisation stop at 30 rows; the Reed-Solomon seed gives the 25 of the counting
    bound, proven optimal."""
    result = covering.solve([5] * 6, 2, covering.Forbidden([5] * 6), method="ipog")
    assert len(result.rows) == 25 and result.optimal and "CPHF seed over GF(5)" in result.how
