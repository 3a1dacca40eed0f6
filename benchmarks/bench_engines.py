"""A real engine's cell, split: its start, its requests, the golden runs and the harness around them.

Runs real-engine matrices (default: ``vllm_smoke``, ``vllm_server_smoke``, ``llamacpp_smoke``; name others, e.g.
``python benchmarks/bench_engines.py vllm llamacpp``) and prints one line per cell, then the totals and the
harness's share of the wall; ``--results DIR`` prints the same from a finished ``harness run``'s results.jsonl.
A matrix whose engine is not here (no ``.venv-vllm``, no llama-server) is skipped, saying why. Target (a
benchmark, not a test): the harness under 10% of a cell's wall.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.matrix.file import load_matrix  # noqa: E402
from harness.matrix.model import Matrix, generate  # noqa: E402
from harness.run.golden import GoldenRuns  # noqa: E402
from harness.run.cell import configure_torch, run_cell  # noqa: E402
from harness import sut  # noqa: E402

DEFAULT = ("vllm_smoke", "vllm_server_smoke", "llamacpp_smoke")
COLUMNS = ("wall_seconds", "engine_start_seconds", "engine_requests_seconds", "engine_seconds", "golden_seconds",
           "harness_seconds")


def missing(matrix: Matrix) -> str | None:
    """Why ``matrix``'s engine cannot run here, or None."""
    return sut.engine(matrix.engine).launch_problem(matrix.engine_args)


def report(name: str, rows: Iterable[Mapping], wall: float, goldens: str = "") -> None:
    """One line per cell (its status and the seconds of COLUMNS), then the totals and the harness's share."""
    print(f"{name}: seconds per cell: wall, engine start, engine requests, engine (start + requests + I/O), golden, "
          f"harness")
    totals = dict.fromkeys(COLUMNS, 0.0)
    for row in rows:
        values = [float(row["metrics"].get(column) or 0.0) for column in COLUMNS]
        for column, value in zip(COLUMNS, values):
            totals[column] += value
        print(f"  {row['status']:5} {' '.join(f'{v:6.1f}' for v in values)}  {row['cell_id']}", flush=True)
    print(f"total {wall:.1f}s wall ({os.getloadavg()[0]:.2f} load average at the end); "
          + ", ".join(f"{column} {value:.1f}" for column, value in totals.items()))
    print(f"harness share of the cells' wall: {totals['harness_seconds'] / max(totals['wall_seconds'], 1e-9):.1%}"
          + (f"; {goldens}" if goldens else ""))


def run(matrix: str) -> None:
    matrix = load_matrix(matrix, matrices_dir=ROOT / "matrices")
    reason = missing(matrix)
    if reason:
        print(f"{matrix}: skipped: {reason}")
        return
    cells, goldens = generate(matrix), GoldenRuns()
    started = time.perf_counter()
    rows = [run_cell(matrix, cell, faults=frozenset(), goldens=goldens).to_json() for cell in cells]
    report(matrix, rows, time.perf_counter() - started,
           f"golden runs {goldens.computed} computed, {goldens.reused} reused")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--results"]:
        path = Path(argv[1]) / "results.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        report(str(path), rows, sum(float(r["metrics"].get("wall_seconds") or 0.0) for r in rows))
        return 0
    configure_torch()
    for matrix in argv or DEFAULT:
        run(matrix)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
