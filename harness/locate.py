"""``harness locate``: run the few extra cells that settle which combination makes a run's cells fail.

For a failing cell whose failure more than one candidate combination could explain
(``reports.locate``), change one factor at a time (to its golden level where it has one,
else to the first other level the constraints allow) and run that cell: a factor whose
change makes the failure go away is part of the cause. That is at most one extra cell per
factor of the failing cell (k cells for k factors, exact for a deterministic fault); the
extra rows join the run's rows and the analysis is repeated, so every candidate that an
extra passing cell contains drops out.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from harness.matrix import Cell, MatrixSpec
from reports.locate import FailureClass, analyze

#: failing cells probed per failure class at most (each costs up to k extra cells).
MAX_PROBED = 3
_ABSENT = object()


@dataclass(slots=True)
class LocateResult:
    """The analysis after the extra cells, and those cells' rows (each with ``probe``: of, changed)."""

    classes: list[FailureClass]
    probes: list[dict]


def cell_of(spec: MatrixSpec, row: Mapping) -> Cell:
    """A row's cell, with the matrix's factor order."""
    return Cell(tuple((factor, row["factors"][factor]) for factor, _ in spec.factors))


def one_factor_changes(spec: MatrixSpec, cell: Cell) -> Iterator[tuple[str, Cell]]:
    """For each factor with other levels: ``cell`` with that factor changed (golden level first), if allowed."""
    for i, (factor, levels) in enumerate(spec.factors):
        current = cell.factors[i][1]
        golden = spec.golden.get(factor, _ABSENT)
        order = [golden] if golden in levels and golden != current else []
        order += [level for level in levels if level != current and level not in order]
        for level in order:
            changed = Cell((*cell.factors[:i], (factor, level), *cell.factors[i + 1:]))
            if spec.allows(changed.as_dict()):
                yield factor, changed
                break


def _unsettled(cls: FailureClass) -> list[str]:
    """Failing cells that no pinned combination explains yet, in row order (unexplained ones included)."""
    pinned = {cell for f in cls.findings if f.pinned for cell in f.cells}
    return [cell for cell in cls.failing if cell not in pinned]


def locate(spec: MatrixSpec, rows: Sequence[dict], run_one: Callable[[Cell], dict], probes: Sequence[dict] = (),
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
        for factor, changed in one_factor_changes(spec, cell_of(spec, known[cell_id])):
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
