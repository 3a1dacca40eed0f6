"""Benchmark: our covering arrays against plain IPOG, PICT, allpairspy, the lower bound and the best known.

Run as ``python benchmarks/bench_covering.py`` from the repository root. For each space: rows
and seconds per generator, "missing" = allowed t-tuples a generator's rows do not cover
(checked with ``harness.matrix.covering.missing_tuples``), the proven lower bound of our
certificate, and the best known size for uniform spaces (Colbourn's covering array tables).
Each space gives the fixed-size search a move budget, as a matrix file does with ``[matrix]
search_moves``: the default where it already reaches the best known, more where more moves
still pay (3^7 at t=4; 3^15 at t=3: 57 rows from the S3 orbit seed, 56 after 10,000 moves, 54 after 200,000).

PICT runs when a ``pict`` binary is on PATH (or named by $PICT); without one its figures
are printed from ``RECORDED_PICT`` and marked "rec." (measured with PICT built from
microsoft/pict at commit c3dad2b: the ``pypict`` package does not build here). A last line
prices the smoke matrix's shape with and without its ``[cost]`` table.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

from harness.matrix import covering  # noqa: E402
from harness.matrix.covering.ipog import ipog  # noqa: E402

Row = tuple[int, ...]
Clauses = list[dict[int, int]]
#: the research factor set (FIELD-NOTES) and its three forbidden partial rows, factor → level.
RESEARCH = [3, 2, 4, 2, 2, 4, 2]
FORBIDDEN: Clauses = [{0: 0, 2: 3}, {1: 1, 5: 0}, {3: 1, 4: 1, 6: 1}]
#: a 20-factor mixed space (nightly-sized and beyond), and forbidden partial rows for it.
MIXED_20 = [4] * 5 + [3] * 8 + [2] * 7
MIXED_FORBIDDEN: Clauses = [{0: 0, 5: 1}, {1: 3, 13: 1}, {6: 2, 7: 2, 14: 0}, {18: 1, 19: 1}]


@dataclass(frozen=True)
class Space:
    """One benchmark space; ``best`` is the best known size and where it comes from, when published."""

    name: str
    domains: list[int]
    t: int
    forbidden: Clauses = field(default_factory=list)
    best: tuple[int, str] | None = None
    moves: int = covering.DEFAULT_MOVES


SPACES = [
    Space("research 3,2,4,2,2,4,2", RESEARCH, 2, FORBIDDEN),
    Space("research 3,2,4,2,2,4,2", RESEARCH, 3, FORBIDDEN),
    Space("2^12", [2] * 12, 2, best=(7, "exact, Kleitman-Spencer")),
    Space("2^11", [2] * 11, 3, best=(12, "Colbourn tables")),
    Space("4^10", [4] * 10, 2, best=(24, "Colbourn tables")),
    Space("3^15", [3] * 15, 3, best=(51, "Colbourn tables"), moves=200_000),
    Space("2^12", [2] * 12, 4, best=(24, "Colbourn tables")),
    Space("3^7", [3] * 7, 4, best=(123, "Colbourn tables"), moves=300_000),
    Space("4^5 3^8 2^7", MIXED_20, 3, moves=20_000),
    Space("4^5 3^8 2^7", MIXED_20, 3, MIXED_FORBIDDEN, moves=20_000),
]
#: PICT's rows and seconds where no binary is at hand, keyed (space name, t, forbidden rows).
RECORDED_PICT = {
    ("research 3,2,4,2,2,4,2", 2, 3): (17, 0.00), ("research 3,2,4,2,2,4,2", 3, 3): (49, 0.00),
    ("2^12", 2, 0): (8, 0.01), ("2^11", 3, 0): (19, 0.00), ("4^10", 2, 0): (31, 0.00), ("3^15", 3, 0): (82, 0.01),
    ("2^12", 4, 0): (49, 0.01), ("3^7", 4, 0): (167, 0.00),
    ("4^5 3^8 2^7", 3, 0): (122, 0.08), ("4^5 3^8 2^7", 3, 4): (120, 0.06),
}


def timed(build: Callable[[], list[Row]]) -> tuple[list[Row], float]:
    """Rows from ``build`` and the seconds it took."""
    start = time.perf_counter()
    rows = build()
    return rows, time.perf_counter() - start


def constraints(space: Space) -> covering.Forbidden:
    """The space's forbidden partial rows as clauses."""
    return covering.Forbidden(space.domains, [{f: [level] for f, level in entry.items()} for entry in space.forbidden])


def plain_ipog(space: Space) -> list[Row]:
    """Research-style IPOG: horizontal and vertical growth, largest domain first, no post-optimisation."""
    order = sorted(range(len(space.domains)), key=lambda f: -space.domains[f])
    back = {f: i for i, f in enumerate(order)}
    inner = covering.Forbidden([space.domains[f] for f in order],
                               [{back[f]: [level] for f, level in entry.items()} for entry in space.forbidden])
    interactions = covering.interactions_at(len(order), space.t)
    required = covering.required_mask(covering.TupleSpace(inner.domains, interactions), inner)
    rows = ipog(inner.domains, interactions, required, inner)
    return [tuple(int(row[back[f]]) for f in range(len(order))) for row in rows]


def pict_rows(space: Space) -> list[Row] | None:
    """PICT's rows for the space, or None without a ``pict`` binary."""
    binary = os.environ.get("PICT") or shutil.which("pict")
    if not binary:
        return None
    lines = [f"P{i}: " + ", ".join(map(str, range(d))) for i, d in enumerate(space.domains)]
    for entry in space.forbidden:
        *head, (last, level) = sorted(entry.items())
        condition = " AND ".join(f"[P{f}] = {v}" for f, v in head)
        lines.append(f"IF {condition} THEN [P{last}] <> {level};" if head else f"[P{last}] <> {level};")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as model:
        model.write("\n".join(lines) + "\n")
    out = subprocess.run([binary, model.name, f"/o:{space.t}"], capture_output=True, text=True, check=True).stdout
    os.unlink(model.name)
    return [tuple(int(v) for v in line.split("\t")) for line in out.strip().splitlines()[1:]]


def allpairspy_rows(space: Space) -> list[Row] | None:
    """allpairspy's rows (its filter sees prefixes), or None when not installed."""
    try:
        from allpairspy import AllPairs
    except ImportError:
        return None
    allowed = constraints(space)
    return [tuple(row) for row in AllPairs([list(range(d)) for d in space.domains], n=space.t,
                                           filter_func=lambda row: allowed.extendable([*row, *[-1] * (len(space.domains) - len(row))]))]


def cells_for(space: Space, rows: list[Row] | None, seconds: float, recorded: bool = False) -> list[str]:
    """rows (with the missing count when any), seconds."""
    if rows is None:
        return ["-", "-"]
    missing = len(covering.missing_tuples(rows, space.domains, space.t, constraints(space)))
    mark = " rec." if recorded else ""
    return [f"{len(rows)}{f' ({missing} missing)' if missing else ''}{mark}", f"{seconds:.2f}"]


def bench_row(space: Space) -> list[str]:
    """One table row: ours with its certificate, then plain IPOG, PICT and allpairspy."""
    result, ours_s = timed(lambda: covering.solve(space.domains, space.t, constraints(space), moves=space.moves))
    best = f"{space.best[0]} ({space.best[1]})" if space.best else "-"
    ratio = f"{len(result.rows) / space.best[0]:.2f}" if space.best else "-"
    pict, pict_s = timed(lambda: pict_rows(space))
    key = (space.name, space.t, len(space.forbidden))
    if pict is None and key in RECORDED_PICT:
        pict_n, pict_s = RECORDED_PICT[key]
        pict_cells = [f"{pict_n} rec.", f"{pict_s:.2f}"]
    else:
        pict_cells = cells_for(space, pict, pict_s)
    return [space.name, str(space.t), str(len(space.forbidden)), str(result.bound), best,
            *cells_for(space, result.rows, ours_s), f"{space.moves:,}", "yes" if result.optimal else "no", ratio,
            *cells_for(space, *timed(lambda: plain_ipog(space))), *pict_cells,
            *cells_for(space, *timed(lambda: allpairspy_rows(space)))]


#: matrices/smoke.toml: model, cache, scheduler, page_size, pool, backend, spec; Triton
#: (backend 1) is forbidden at page_size 1 and its ``[cost]`` is 50 (unlisted levels 1).
SMOKE = [2, 3, 2, 2, 2, 2, 4]
TRITON_COST = 50.0


def smoke_cost_line() -> str:
    """Rows, Triton rows and total cost of the 2-wise smoke shape without and with its cost table."""
    allowed = covering.Forbidden(SMOKE, [{5: [1], 3: [0]}])
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
    header = ["space", "t", "forbidden", "lower bound", "best known", "ours rows", "ours s", "search moves", "proven optimal",
              "ours/best", "IPOG rows", "IPOG s", "PICT rows", "PICT s", "allpairspy rows", "allpairspy s"]
    table = [bench_row(space) for space in SPACES]
    widths = [max(len(row[i]) for row in [header, *table]) for i in range(len(header))]
    print(f"research forbidden partial rows (factor: level) {FORBIDDEN}")
    for row in [header, ["-" * w for w in widths], *table]:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths)), flush=True)
    print(smoke_cost_line())


if __name__ == "__main__":
    main()
