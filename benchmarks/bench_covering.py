"""Benchmark: our t-wise covering arrays against the lower bound and allpairspy (rows, gaps, seconds).

Run as ``python benchmarks/bench_covering.py`` from the repository root. The factor set is
the one FIELD-NOTES measured (domains 3,2,4,2,2,4,2); "missing" counts allowed t-tuples a
generator's rows do not cover, checked by ``harness.covering.missing_tuples``. A last
line prices the smoke matrix's shape with and without its ``[cost]`` table.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

from harness import covering  # noqa: E402

DOMAINS = [3, 2, 4, 2, 2, 4, 2]
#: forbidden partial rows, factor index → level index (the "couple of constraints" case).
FORBIDDEN = [{0: 0, 2: 3}, {1: 1, 5: 0}, {3: 1, 4: 1, 6: 1}]
Row = tuple[int, ...]


def forbids(entry: dict[int, int], row: Sequence[int]) -> bool:
    """Whether ``row`` (possibly a prefix) sets every factor of ``entry`` to its forbidden level."""
    return all(f < len(row) and row[f] == level for f, level in entry.items())


def allowed_by(forbidden: list[dict[int, int]]) -> Callable[[Sequence[int]], bool]:
    """Row (or prefix) predicate for a list of forbidden partial rows."""
    return lambda row: not any(forbids(entry, row) for entry in forbidden)


def timed(build: Callable[[], list[Row]]) -> tuple[list[Row], float]:
    """Rows from ``build`` and the seconds it took."""
    start = time.perf_counter()
    rows = build()
    return rows, time.perf_counter() - start


def allpairspy_rows(t: int, allowed: Callable[[Sequence[int]], bool]) -> list[Row] | None:
    """allpairspy's rows for the same space (its filter sees prefixes), or None when not installed."""
    try:
        from allpairspy import AllPairs
    except ImportError:
        return None
    return [tuple(row) for row in AllPairs([list(range(d)) for d in DOMAINS], filter_func=allowed, n=t)]


def bench_row(t: int, label: str, forbidden: list[dict[int, int]]) -> list[str]:
    """One table row: ours (auto and greedy only), the lower bound, and allpairspy."""
    allowed = allowed_by(forbidden)
    ours, ours_s = timed(lambda: covering.covering_array(DOMAINS, t, allowed))
    greedy = covering.covering_array(DOMAINS, t, allowed, method="greedy")
    bound = covering.lower_bound(DOMAINS, t)
    required = len(covering.allowed_tuples(DOMAINS, t, allowed))
    start = time.perf_counter()
    theirs = allpairspy_rows(t, allowed)
    theirs_s = time.perf_counter() - start
    if theirs is None:
        their_cells = ["allpairspy not installed", "-", "-"]
    else:
        missing = len(covering.missing_tuples(theirs, DOMAINS, t, allowed))
        their_cells = [str(len(theirs)), f"{missing}/{required}", f"{theirs_s:.3f}"]
    ours_missing = len(covering.missing_tuples(ours, DOMAINS, t, allowed))
    return [str(t), label, str(len(ours)), f"{ours_missing}/{required}", f"{ours_s:.3f}", str(bound),
            f"{len(ours) / bound:.2f}", str(len(greedy)), *their_cells]


#: matrices/smoke.toml: model, cache, scheduler, page_size, pool, backend, spec; Triton
#: (backend 1) is forbidden at page_size 1 and its ``[cost]`` is 50 (unlisted levels 1).
SMOKE = [2, 3, 2, 2, 2, 2, 4]
SMOKE_FORBIDDEN = [{5: 1, 3: 0}]
TRITON_COST = 50.0


def smoke_cost_line() -> str:
    """Rows, Triton rows and total cost of the 2-wise smoke shape without and with its cost table."""
    allowed = allowed_by(SMOKE_FORBIDDEN)
    weights = [[1.0] * d for d in SMOKE]
    weights[5][1] = TRITON_COST

    def cost(row: Row) -> float:
        return sum(w[level] for w, level in zip(weights, row))

    cells = []
    for label, priced in (("without [cost]", None), ("with [cost]", cost)):
        rows, seconds = timed(lambda priced=priced: covering.covering_array(SMOKE, 2, allowed, cost=priced))
        cells.append(f"{label}: {len(rows)} rows, {sum(row[5] for row in rows)} Triton, "
                     f"total cost {sum(map(cost, rows)):g} ({seconds:.3f} s)")
    return f"smoke shape {','.join(map(str, SMOKE))} t=2, triton = {TRITON_COST:g}: " + "; ".join(cells)


def main() -> None:
    """Print the comparison table, then the smoke shape's cost line."""
    header = ["t", "constraints", "ours rows", "ours missing", "ours s", "lower bound", "ours/LB",
              "greedy rows", "allpairspy rows", "allpairspy missing", "allpairspy s"]
    table = [bench_row(t, label, forbidden)
             for t in (2, 3)
             for label, forbidden in (("none", []), (f"{len(FORBIDDEN)} forbidden", FORBIDDEN))]
    widths = [max(len(row[i]) for row in [header, *table]) for i in range(len(header))]
    print(f"domains {','.join(map(str, DOMAINS))}; forbidden partial rows {FORBIDDEN}")
    for row in [header, ["-" * w for w in widths], *table]:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
    print(smoke_cost_line())


if __name__ == "__main__":
    main()
