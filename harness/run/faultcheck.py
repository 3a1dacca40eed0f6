"""Fault checks: inject one fault, run a matrix, compare the failing cells with the fault's triggers.

A fault is caught exactly when the cells that fail are the cells whose factor levels trigger
it, and on each of those the oracle the fault names has failed (or the cell errored, for a
fault whose symptom is a crash). This is the test of the oracles themselves, and the raw
material of the kill matrix (fault × generation mode → detected, cells, seconds).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from harness.matrix.model import Cell, Matrix, generate
from harness.run.parallel import execute
from harness.results.rows import CellResult, error_type
from harness.run.golden import GoldenRuns
from harness.run.plan import plan_cell
from harness.sut.reference import LEVELS
from reference_impl.faults import FAULTS, Fault


@dataclass(frozen=True, slots=True)
class FaultCheck:
    """How one injected fault showed on one matrix."""

    fault: str
    cells: int
    triggered: frozenset[str]
    failed: frozenset[str]
    seen_by_oracle: frozenset[str]
    seconds: float

    @property
    def missed(self) -> frozenset[str]:
        """Trigger cells that passed: the matrix is blind to the fault there."""
        return self.triggered - self.failed

    @property
    def spurious(self) -> frozenset[str]:
        """Failing cells the fault cannot reach: an oracle cries wolf, or the fault leaks."""
        return self.failed - self.triggered

    @property
    def wrong_oracle(self) -> frozenset[str]:
        """Trigger cells that failed, but not through the oracle the fault names."""
        return (self.triggered & self.failed) - self.seen_by_oracle

    @property
    def exact(self) -> bool:
        return not (self.missed or self.spurious or self.wrong_oracle)

    @property
    def detected(self) -> bool:
        return bool(self.triggered & self.seen_by_oracle)


def _seen(result: CellResult, fault: Fault) -> bool:
    """Whether the cell shows the damage the way ``fault`` says: its oracle failed, or it raised its exception."""
    if fault.oracle == "error":
        return result.status == "error" and error_type(result.error) == fault.exception
    verdict = result.oracles.get(fault.oracle)
    return verdict is not None and verdict.status == "fail"


def check_fault(matrix: Matrix, fault_name: str, goldens: GoldenRuns | None = None) -> FaultCheck:
    """Run every cell of ``matrix`` with ``fault_name`` injected and sort the cells."""
    (check,) = check_fault_set(matrix, [fault_name], goldens, jobs=1)
    return check


def check_fault_set(matrix: Matrix, fault_names: Sequence[str], goldens: GoldenRuns | None = None, *,
                 jobs: int = 1) -> list[FaultCheck]:
    """``check_fault`` for each fault; with ``jobs`` > 1 every (fault, cell) runs side by side in worker processes.

    A check's seconds are its wall time when run alone, else the sum of its cells' wall seconds.
    """
    goldens = goldens if goldens is not None else GoldenRuns()
    cells = generate(matrix)
    plans = [plan_cell(matrix, cell, frozenset({name})) for name in fault_names for cell in cells]
    results: list[CellResult | None] = [None] * len(plans)
    started = time.perf_counter()

    def keep(i: int, result: CellResult) -> None:
        results[i] = result

    execute(plans, goldens, jobs=min(jobs, len(plans)), on_step=lambda i, what: None, on_result=keep)
    checks = []
    for n, name in enumerate(fault_names):
        mine = results[n * len(cells):(n + 1) * len(cells)]
        seconds = (time.perf_counter() - started if jobs <= 1 and len(fault_names) == 1
                   else sum(r.metrics.get("wall_seconds", 0.0) for r in mine))
        checks.append(_sort(name, cells, mine, seconds))
    return checks


def _sort(fault_name: str, cells: Sequence[Cell], results: Sequence[CellResult], seconds: float) -> FaultCheck:
    """Which cells the fault triggers, which failed, and which failed through its oracle."""
    fault = FAULTS[fault_name]
    triggered, failed, seen = set(), set(), set()
    for cell, result in zip(cells, results):
        if fault.triggered_by(LEVELS.full(cell.as_dict())):
            triggered.add(cell.cell_id)
        if result.status in ("fail", "error"):
            failed.add(cell.cell_id)
        if _seen(result, fault):
            seen.add(cell.cell_id)
    return FaultCheck(fault_name, len(cells), frozenset(triggered), frozenset(failed), frozenset(seen), seconds)
