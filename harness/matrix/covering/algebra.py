"""Algebraic seeds: covering arrays from linear algebra over a finite field, for near-uniform spaces.

Over GF(q), a t × k matrix H gives the q^t rows x·H (x ∈ GF(q)^t); those rows hold every
t-tuple on a set of t columns exactly when the columns of H there are linearly independent
(an orthogonal array on them). A *covering perfect hash family* CPHF(n; k, q, t) is n such
matrices, each column a point of the projective space PG(t-1, q), such that every t columns
are independent in at least one of them; the union of their blocks is a covering array of
n(q^t - 1) + 1 rows or fewer (the zero row, and the constant rows where columns share a first
coordinate, repeat). With n = 1 and the moment curve (1, a, a², ...) plus (0, ..., 0, 1) it is
the Reed-Solomon orthogonal array OA(q^t; t, q + 1, q); otherwise the family comes from a
seeded tabu search over its cells. A factor with fewer than q levels takes its level modulo its
domain: merging levels keeps every tuple that was covered.

A seed is a starting point, never trusted: the caller checks its coverage and its rows against
the constraints (``solve``), and the fixed-size search starts from it.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

#: independence tables up to this many (point t-tuple × field vector) entries (PG(2, 5) at t=3: 3.7M).
MAX_TABLE = 4_000_000
#: tabu moves one family search may take, and how many searches may fail before the seed gives up.
FAMILY_MOVES = 1_500
MAX_FAILED_FAMILIES = 4
SEED = 20_261_202


def prime_power_at_least(n: int) -> int:
    """The smallest prime power q >= n (2 for n <= 2)."""
    q = max(n, 2)
    while len(_prime_factors(q)) != 1:
        q += 1
    return q


def _prime_factors(n: int) -> set[int]:
    """The distinct primes dividing n."""
    primes, d = set(), 2
    while d * d <= n:
        while n % d == 0:
            primes.add(d)
            n //= d
        d += 1
    return primes | ({n} if n > 1 else set())


def galois_field(q: int) -> tuple[np.ndarray, np.ndarray]:
    """Addition and multiplication tables of GF(q), elements 0..q-1 as base-p digit vectors of polynomials."""
    (p,) = _prime_factors(q)
    m = round(math.log(q, p))
    digits = np.array([[(e // p ** i) % p for i in range(m)] for e in range(q)], dtype=np.int64)
    weights = p ** np.arange(m)
    add = ((digits[:, None, :] + digits[None, :, :]) % p) @ weights
    if m == 1:
        return add, np.outer(np.arange(q), np.arange(q)) % q
    for tail in itertools.product(range(p), repeat=m):  # the first monic irreducible of degree m
        mul = _poly_products(digits, np.array(tail), p) @ weights
        if all(len(set(mul[x, 1:].tolist())) == q - 1 for x in range(1, q)):
            return add, mul
    raise AssertionError(f"no irreducible polynomial of degree {m} over GF({p})")


def _poly_products(digits: np.ndarray, tail: np.ndarray, p: int) -> np.ndarray:
    """Every product of two polynomials of degree < m, reduced modulo x^m + tail (coefficients low first)."""
    q, m = digits.shape
    prod = np.zeros((q, q, 2 * m - 1), dtype=np.int64)
    for i in range(m):
        prod[:, :, i:i + m] += digits[:, None, i:i + 1] * digits[None, :, :]
    for d in range(2 * m - 2, m - 1, -1):
        prod[:, :, d - m:d] -= prod[:, :, d:d + 1] * tail
    return prod[:, :, :m] % p


def projective_points(q: int, t: int) -> np.ndarray:
    """The points of PG(t-1, q): nonzero vectors of GF(q)^t whose first nonzero coordinate is 1, in lexicographic order."""
    vectors = itertools.product(range(q), repeat=t)
    return np.array([v for v in vectors if any(v) and v[next(i for i, x in enumerate(v) if x)] == 1], dtype=np.int64)


def block_values(q: int, t: int, points: np.ndarray) -> np.ndarray:
    """(points × q^t): x·h for every point h and every x ∈ GF(q)^t (x in lexicographic order)."""
    add, mul = galois_field(q)
    xs = np.array(list(itertools.product(range(q), repeat=t)), dtype=np.int64)
    values = np.zeros((len(points), len(xs)), dtype=np.int64)
    for i in range(t):
        values = add[values, mul[xs[None, :, i], points[:, i:i + 1]]]
    return values


def independent(values: np.ndarray, q: int, t: int) -> np.ndarray:
    """Boolean table over point t-tuples: whether their columns hold all q^t tuples (are linearly independent)."""
    n_points = len(values)
    combos = np.array(list(itertools.product(range(n_points), repeat=t)), dtype=np.int64)
    codes = sum(values[combos[:, i]] * q ** i for i in range(t))
    ordered = np.sort(codes, axis=1)
    return (np.diff(ordered, axis=1) > 0).all(axis=1).reshape((n_points,) * t)


def cphf_seed(domains: Sequence[int], t: int, below: int, moves: int = FAMILY_MOVES) -> np.ndarray | None:
    """Rows with fewer than ``below`` covering the unconstrained space's first k' factors (k' as large as found,
    all of them where a CPHF reaches that far), or None; the rest is the caller's to grow.

    Family sizes n = 1, 2, ... are tried while n blocks could still beat ``below``, and for each the
    longest prefix of factors first; n = 1 only where the Bush bound (k' <= q + t - 1) lets an
    orthogonal array exist. At most ``MAX_FAILED_FAMILIES`` searches may fail.
    """
    k, q = len(domains), prime_power_at_least(max(domains))
    if t < 2 or k < t:
        return None
    points = projective_points(q, t)
    if len(points) ** t * q ** t > MAX_TABLE:
        return None
    values, rng = block_values(q, t, points), np.random.default_rng(SEED)
    table = independent(values, q, t)
    best, failures = None, 0
    for n in itertools.count(1):
        if n * (q ** t - q) + q >= below or failures >= MAX_FAILED_FAMILIES:
            return best
        for width in range(k, t, -1):
            if (n == 1 and width > q + t - 1) or (best is not None and width <= best.shape[1]):
                continue
            cells = _family(table, width, t, n, _start(q, t, width, n, points, rng), moves, rng)
            if cells is None:
                failures += 1
                if failures >= MAX_FAILED_FAMILIES:
                    break
                continue
            rows = np.unique(np.concatenate([values[cells[r]].T for r in range(n)]), axis=0)
            rows = np.unique(rows % np.array(domains[:width]), axis=0)
            if len(rows) < below:
                best = rows
            break
        if best is not None and best.shape[1] == k:
            return best
    return best


def _start(q: int, t: int, k: int, n: int, points: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """First cells: the Reed-Solomon columns (1, a, a², ...) and (0, ..., 1) where they fit, random points elsewhere."""
    _, mul = galois_field(q)
    index = {tuple(point): i for i, point in enumerate(points.tolist())}
    curve = [tuple(int(x) for x in itertools.accumulate([1] * t, lambda acc, _: mul[acc, a])) for a in range(q)]
    columns = [index[point] for point in [*curve, (0,) * (t - 1) + (1,)]]
    cells = rng.integers(0, len(points), (n, k))
    cells[0, :min(k, len(columns))] = columns[:k]
    return cells


def _family(table: np.ndarray, k: int, t: int, n: int, cells: np.ndarray, moves: int,
            rng: np.random.Generator) -> np.ndarray | None:
    """Tabu search for cells under which every t columns are independent in some row; None if ``moves`` end first."""
    sets = np.array(list(itertools.combinations(range(k), t)), dtype=np.int64)
    containing = [np.flatnonzero((sets == c).any(axis=1)) for c in range(k)]
    n_points = table.shape[0]
    changed_at = np.full((n, k), -10, dtype=np.int64)
    for step in range(moves):
        covers = table[tuple(cells[:, sets[:, i]] for i in range(t))]  # (rows, t-sets)
        uncovered = np.flatnonzero(~covers.any(axis=0))
        if len(uncovered) == 0:
            return cells
        target = sets[uncovered[rng.integers(len(uncovered))]]
        best: list[tuple[int, int, int]] = []
        best_gain = None
        for r, c in itertools.product(range(n), target.tolist()):
            if changed_at[r, c] >= step - 2:
                continue
            chosen = containing[c]
            others = covers[np.arange(n) != r][:, chosen].any(axis=0)
            trial = np.repeat(cells[r:r + 1], n_points, axis=0)
            trial[:, c] = np.arange(n_points)
            covered = (table[tuple(trial[:, sets[chosen, i]] for i in range(t))] & ~others).sum(axis=1)
            gain = covered - covered[cells[r, c]]  # t-sets newly covered, comparable across cells
            gain[cells[r, c]] = -len(sets) - 1
            top = int(gain.max())
            if best_gain is None or top > best_gain:
                best, best_gain = [], top
            if top == best_gain:
                best += [(r, c, int(p)) for p in np.flatnonzero(gain == top)]
        if best:
            r, c, p = best[rng.integers(len(best))]
            cells[r, c], changed_at[r, c] = p, step
    return None
