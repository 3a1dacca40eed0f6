"""Smoke-matrix throughput: cells per minute, golden reuse, time outside the engine, peak memory.

Targets (a benchmark, not a test): the smoke matrix in under 5 minutes on 2 CPU cores with
peak memory under 4 GiB, and a cell spending under 10% of its time outside the engine.
"""
from __future__ import annotations

import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.matrix.model import generate  # noqa: E402
from harness.matrix.file import load_matrix  # noqa: E402
from harness.results.store import ResultsStore, RunInfo  # noqa: E402
from harness.run.golden import GoldenRuns  # noqa: E402
from harness.run.cell import configure_torch, run_cell  # noqa: E402


def main(matrix: str = "smoke") -> None:
    configure_torch()
    matrix = load_matrix(matrix, matrices_dir=ROOT / "matrices")
    cells = generate(matrix)
    goldens = GoldenRuns()
    store = ResultsStore(Path(tempfile.mkdtemp(prefix="kvmatrix-bench-")), RunInfo(matrix.name, matrix.mode, None, [], len(cells)))
    store.start(resume=False, planned={c.cell_id for c in cells})
    started = time.perf_counter()
    results, writing = [], 0.0
    for cell in cells:
        results.append(run_cell(matrix, cell, faults=frozenset(), goldens=goldens))
        before = time.perf_counter()
        store.add(results[-1])  # results.jsonl, summary.json and index.html, as a real run writes them
        writing += time.perf_counter() - before
    wall = time.perf_counter() - started
    engine = sum(r.metrics.get("engine_seconds", 0.0) + r.metrics.get("golden_seconds", 0.0) for r in results)
    harness = sum(r.metrics.get("harness_seconds", 0.0) for r in results) + writing
    statuses = {s: sum(r.status == s for r in results) for s in ("pass", "fail", "error")}
    lookups = goldens.computed + goldens.reused
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"matrix {matrix}: {len(cells)} cells in {wall:.1f} s -> {len(cells) / wall * 60:.1f} cells/min  {statuses}")
    print(f"  golden runs: {goldens.computed} computed, {goldens.reused} reused (reuse ratio {goldens.reused / lookups:.2f})")
    print(f"  time in engine (cell + golden runs): {engine:.1f} s; outside the engine (oracles, results files): {harness:.2f} s "
          f"= {harness / wall:.1%} of wall (target < 10%)")
    print(f"  peak RSS: {peak_gib:.2f} GiB (target < 4 GiB); wall vs 5-minute target: {wall / 300:.2f}x")


if __name__ == "__main__":
    main(*sys.argv[1:])
