"""A real engine's cell, split: vLLM's start, its requests, the golden runs and the harness around them.

Runs a vLLM matrix (default ``vllm_smoke``; ``python benchmarks/bench_vllm.py vllm`` for the 3-wise one) and
prints one line per cell, then the totals and the harness's share of the wall. Skips, saying why, without
``.venv-vllm`` (``make vllm-env``). Target (a benchmark, not a test): the harness under 10% of a cell's wall.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.matrix.file import load_matrix  # noqa: E402
from harness.matrix.model import generate  # noqa: E402
from harness.run.runner import GoldenRuns, configure_torch, run_cell  # noqa: E402
from harness.sut.vllm import vllm_python  # noqa: E402

COLUMNS = ("wall_seconds", "engine_start_seconds", "engine_requests_seconds", "engine_seconds", "golden_seconds",
           "harness_seconds")


def main(matrix: str = "vllm_smoke") -> int:
    if not vllm_python().exists():
        print(f"skipped: no vLLM environment at {vllm_python()} (make vllm-env)")
        return 0
    configure_torch()
    spec = load_matrix(matrix, matrices_dir=ROOT / "matrices")
    cells, goldens = generate(spec), GoldenRuns()
    started = time.perf_counter()
    print(f"{matrix}: {len(cells)} cells; seconds: wall, vLLM start, vLLM requests, engine (start + requests + "
          f"the child's I/O), golden, harness")
    totals = dict.fromkeys(COLUMNS, 0.0)
    for cell in cells:
        result = run_cell(spec, cell, faults=frozenset(), goldens=goldens)
        row = [float(result.metrics.get(column) or 0.0) for column in COLUMNS]
        for column, value in zip(COLUMNS, row):
            totals[column] += value
        print(f"  {result.status:5} {' '.join(f'{v:6.1f}' for v in row)}  {cell.cell_id}", flush=True)
    wall = time.perf_counter() - started
    print(f"total {wall:.1f}s wall ({os.getloadavg()[0]:.2f} load average at the end); "
          + ", ".join(f"{column} {value:.1f}" for column, value in totals.items()))
    print(f"harness share of the cells' wall: {totals['harness_seconds'] / max(totals['wall_seconds'], 1e-9):.1%}; "
          f"golden runs {goldens.computed} computed, {goldens.reused} reused")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))
