"""``harness locate``: run the few extra cells that settle which combination makes a run's cells fail.

For a failing cell whose failure more than one candidate combination could explain
(``harness.results.locate``), change one factor at a time (to the allowed level whose cells failed
least so far, the golden level first among equals) and run that cell: a factor whose change
makes the failure go away is part of the cause. That is at most one extra cell per
factor of the failing cell (k cells for k factors, exact for a deterministic fault); the
extra rows join the run's rows and the analysis is repeated, so every candidate that an
extra passing cell contains drops out.
"""
from __future__ import annotations

import json

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from harness.matrix.model import Cell, Matrix
from harness.results.frame import FACTOR, factor_columns, frame
from harness.results.locate import FailureClass, analyze, outcome

#: failing cells probed per failure class at most (each costs up to k extra cells): a trigger with two
#: factors of two levels each (spec∈{draft, mtp} & cache∈{host, storage}) needs four.
MAX_PROBED = 8
_ABSENT = object()


@dataclass(slots=True)
class LocateResult:
    """The analysis after the extra cells, and those cells' rows (each with ``probe``: of, changed)."""

    classes: list[FailureClass]
    probes: list[dict]


def cell_of(matrix: Matrix, row: Mapping) -> Cell:
    """A row's cell, with the matrix's factor order."""
    return Cell(tuple((factor, row["factors"][factor]) for factor, _ in matrix.factors))


def one_factor_changes(matrix: Matrix, cell: Cell,
                       failure_rate: Callable[[str, object], float] = lambda factor, level: 0.0
                       ) -> Iterator[tuple[str, Cell]]:
    """For each factor with other levels: ``cell`` with that factor changed, if the constraints allow it.

    The new level is the one least associated with the failure so far (``failure_rate``), the golden
    level first among equals: changing ``pd=inproc`` to ``nixl`` would tell nothing when both trigger.
    """
    for i, (factor, levels) in enumerate(matrix.factors):
        current = cell.factors[i][1]
        golden = matrix.golden.get(factor, _ABSENT)
        others = [level for level in levels if level != current]
        others.sort(key=lambda level: (failure_rate(factor, level), level != golden, levels.index(level)))
        for level in others:
            changed = Cell((*cell.factors[:i], (factor, level), *cell.factors[i + 1:]))
            if matrix.allows(changed.as_dict()):
                yield factor, changed
                break


def failure_rates(rows: Sequence[Mapping], name: str) -> Callable[[str, object], float]:
    """(factor, level) → the share of cells at that level that fail class ``name`` (0 where none says)."""
    judged = [(i, result) for i, row in enumerate(rows) if (result := outcome(row, name)) is not None]
    table = frame([rows[i] for i, _ in judged])
    failed = pd.Series([result for _, result in judged], dtype=float)
    rates = {}
    for column in factor_columns(table):
        levels = table[column].map(json.dumps, na_action="ignore").to_numpy()
        rates.update({(column[len(FACTOR):], key): rate for key, rate in failed.groupby(levels).mean().items()})
    return lambda factor, level: rates.get((factor, json.dumps(level)), 0.0)


def _unsettled(cls: FailureClass) -> list[str]:
    """Failing cells that no pinned combination explains yet, in row order (unexplained ones included)."""
    pinned = {cell for f in cls.findings if f.pinned for cell in f.cells}
    return [cell for cell in cls.failing if cell not in pinned]


def locate(matrix: Matrix, rows: Sequence[dict], run_one: Callable[[Cell], dict], probes: Sequence[dict] = (),
           max_probed: int = MAX_PROBED) -> LocateResult:
    """Probe up to ``max_probed`` unsettled failing cells per failure class; ``run_one`` runs a cell to a row.

    Classes that only the extra cells show (a NaN that stops tokens from diverging, say) are settled too.
    """
    probes = list(probes)
    known = {r["cell_id"]: r for r in [*rows, *probes]}
    probed = {p["probe"]["of"] for p in probes}
    attempts: dict[str, int] = {}
    while True:
        todo = next(((cls.name, cell) for cls in analyze(rows, probes) if attempts.get(cls.name, 0) < max_probed
                     for cell in _unsettled(cls) if cell not in probed), None)
        if todo is None:
            return LocateResult(analyze(rows, probes), probes)
        name, cell_id = todo
        attempts[name] = attempts.get(name, 0) + 1
        probed.add(cell_id)
        rates = failure_rates([*rows, *probes], name)
        for factor, changed in one_factor_changes(matrix, cell_of(matrix, known[cell_id]), rates):
            reused = changed.cell_id in known
            row = known[changed.cell_id] if reused else run_one(changed)
            known[changed.cell_id] = row
            probes.append({**row, "probe": {"of": cell_id, "changed": factor, "reused": reused}})


def located_text(result: LocateResult, ran: Sequence[dict]) -> str:
    """What ``harness locate`` prints: each failure class with its combination(s), then the extra cells run."""
    lines = []
    for cls in result.classes:
        state = "pinned down" if cls.pinned else "not pinned down"
        lines.append(f"{cls.name}: {len(cls.failing)} failing cell(s), {state}")
        for finding in cls.findings[:5]:
            kind = "located" if finding.pinned else "candidate"
            lines.append(f"  {kind}: {finding.combination.text()} ({len(finding.cells)} cell(s), e.g. {finding.representative})")
        if len(cls.findings) > 5:
            lines.append(f"  … {len(cls.findings) - 5} more candidate(s)")
        for cell in cls.unexplained:
            lines.append(f"  unexplained by up to 3 levels: {cell}")
    reused = [row for row in ran if row["probe"].get("reused")]
    lines.append(f"extra cells run: {len(ran) - len(reused)} (and {len(reused)} cell(s) already run reused as probes)")
    for row in ran:
        failing = [n for n, v in row["oracles"].items() if v["verdict"] == "fail"]
        lines.append(f"  {row['cell_id']} ({row['probe']['changed']} changed, from {row['probe']['of']}"
                     f"{', reused' if row['probe'].get('reused') else ''}): "
                     f"{row['status']}{' (' + ', '.join(failing) + ')' if failing else ''}")
    return "\n".join(lines)
