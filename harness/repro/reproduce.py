"""``harness repro``: a failing, error or xfail cell of a finished run → a finding folder with a standalone script.

1. The cell's failure is run again on each of its workloads until one shows the same check (``Check``).
2. The toggle: the located culprit's factors first, then the cell's other factors off their golden level, each run
   at its golden level until one makes the check pass (``finding.toggle_candidates``).
3. The workload shrinks while the check fails with the cell's levels and passes with the toggle (``Shrinker``):
   the interestingness test keeps the one setting the cause, so a cut that breaks the failure or the toggle's cure
   (another bug, a spurious expectation) is thrown away. A boundary draw the row recorded is tried first, and it
   comes shrunk already (Hypothesis shrank it on the engine, ``harness.run.boundary``): it is kept as it is.
4. The engine's writer writes ``repro.py``; ``REPORT.md`` and ``finding.json`` go beside it; the script is run at
   once with the engine's interpreter, to show it exits 1.
Every run counts against one budget: the re-runs of steps 1 and 2, and each candidate of step 3.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from fixtures.workloads import Workload, load_workload
from harness import oracles, sut
from harness.matrix.model import Cell
from harness.repro.ddmin import Budget, BudgetSpent
from harness.repro.finding import (
    ReproError, Reproducer, Toggle, asked_toggle, located, pick_check, pick_row, toggle_candidates, writer_of,
)
from harness.repro.shrink import Shrinker, Shrunk, Size
from harness.run.boundary import recorded
from harness.run.locate import cell_of
from harness.run.plan import CellPlan, plan_cell
from harness.run.session import MatrixRun
from harness.run.trial import Check, Engines, Outcome, ReferenceFailed, References, Trial
from harness.sut.script.checks import JUDGES

Say = Callable[[str], None]


@dataclasses.dataclass(slots=True)
class Setup:
    """The trials of one repro: the cell's (``failing``) and the toggled one's, sharing engines and references."""

    run: MatrixRun
    engines: Engines
    references: References
    budget: Budget

    def trial(self, cell: Cell) -> Trial:
        """``cell``'s trial, judged without the matrix's declared failures (an xfail's failure must show)."""
        plan = dataclasses.replace(plan_cell(self.run.matrix, cell, self.run.faults), known=(), expected=None)
        return Trial(plan, self.engines, self.references)

    def outcome(self, trial: Trial, workload: Workload) -> Outcome | None:
        """``trial``'s outcome on ``workload`` (one run of the budget unless already run); None when its reference
        run raised (the candidate says nothing)."""
        if workload not in trial.outcomes:
            self.budget.take()
        try:
            return trial.run(workload)
        except ReferenceFailed:
            return None


def _workload_order(plan: CellPlan, row: Mapping, check: Check) -> list[str]:
    """The cell's workloads, those its row names in this check's findings first."""
    named = [f.get("workload") for f in row["oracles"].get(check.oracle, {}).get("detail", []) if isinstance(f, dict)
             and (check.check is None or f.get("check") == check.check)]
    return list(dict.fromkeys([*(n for n in named if n in plan.workloads), *plan.workloads]))


def _candidates(plan: CellPlan, row: Mapping, check: Check) -> list[Workload]:
    """The workloads to show the failure again on: the boundary draw the cell's row shrunk (``harness.run.boundary``),
    then its fixed workloads, those its findings name first."""
    drawn = recorded(row)
    return [*([drawn.shrunk] if drawn else []), *(load_workload(n) for n in _workload_order(plan, row, check))]


def baseline(setup: Setup, failing: Trial, row: Mapping, check: Check, say: Say) -> tuple[Workload, Check]:
    """The first workload on which the cell fails ``check`` again (its ``check`` field filled in from the run
    where the row had none, an xfail's); ``ReproError`` when none does."""
    seen = []
    for workload in _candidates(failing.plan, row, check):
        name = workload.name
        outcome = setup.outcome(failing, workload)
        seen.append(f"{name}: {', '.join(outcome.failing()) or 'pass'}" if outcome else f"{name}: reference raised")
        if outcome is not None and check.check is None and check.oracle != "error":
            named = [f["check"] for f in check.findings(outcome) if "check" in f]
            check = Check(check.oracle, named[0]) if named else check
        if outcome is not None and check.failed(outcome):
            say(f"reproduced: {check.text()} on {name}")
            return workload, check
    raise ReproError(f"cell {row['cell_id']}: {check.text()} did not fail again ({'; '.join(seen)}); a flaky "
                     f"failure, or the engine or matrix changed since the run")


def find_toggle(setup: Setup, row: Mapping, check: Check, workload: Workload, probes: Sequence[Mapping],
                rows: Sequence[Mapping], say: Say, asked: Toggle | None = None) -> tuple[Toggle, Trial]:
    """The first candidate setting whose golden level makes ``check`` pass on ``workload`` (the ``asked`` one alone,
    where given), and its trial."""
    matrix = setup.run.matrix
    cell = cell_of(matrix, row)
    if asked is not None:
        candidates = [asked]
    else:
        combination = located(rows, probes, row, check)
        if combination is not None:
            say(f"located: {combination.text()}")
        candidates = toggle_candidates(matrix, cell.as_dict(), combination)
    tried = []
    for toggle in candidates:
        changed = Cell(tuple((f, toggle.golden if f == toggle.factor else level) for f, level in cell.factors))
        trial = setup.trial(changed)
        outcome = setup.outcome(trial, workload)
        tried.append(f"{toggle.text()}: {', '.join(outcome.failing()) or 'pass'}" if outcome else toggle.text())
        if outcome is not None and check.cured(outcome):
            say(f"toggle: {toggle.text()} ({'asked' if toggle.asked else 'golden'}) makes {check.text()} pass")
            return toggle, trial
    which = "the toggle asked for" if asked is not None else "no one factor at its golden level"
    raise ReproError(f"cell {row['cell_id']}: {which} makes {check.text()} pass on "
                     f"{workload.name} ({'; '.join(tried) or 'every factor is at its golden level'})")


def _shrink(workload: Workload, row: Mapping, fails: Callable[[Workload], bool], setup: Setup) -> Shrunk:
    """The workload the script sends: a boundary draw as Hypothesis shrank it on the engine (its size before, after and
    the runs it spent, from the row), a fixed workload shrunk here by delta debugging (``Shrinker``)."""
    drawn = recorded(row)
    if drawn is not None and workload == drawn.shrunk:
        found = row["metrics"]["boundary"]
        return Shrunk(workload, Size.of(drawn.original), Size.of(workload), drawn.runs,
                      max(drawn.runs, int((found.get("settings") or {}).get("shrink_runs", drawn.runs))))
    return Shrinker(workload, fails, setup.budget).run()


def reproduce(run: MatrixRun, rows: Sequence[Mapping], probes: Sequence[Mapping], header: Mapping, *,
              report_dir: Path, cell_id: str | None = None, oracle: str | None = None, check: str | None = None,
              toggle_to: str | None = None, budget: int = 60,
              say: Say = print) -> Reproducer:
    """Re-run, toggle and shrink the failure of ``cell_id`` (default: the run's first failing, error or xfail cell)
    within ``budget`` runs, ``oracle``'s ``check`` and the toggle ``toggle_to`` (``FACTOR=LEVEL``) where given;
    raises ``ReproError`` when it does not reproduce or no toggle cures it."""
    row = pick_row(rows, cell_id)
    check = pick_check(row, oracle, check)
    # before any run: a toggle the engine does not take, and a program without a script writer, are refused at once
    asked = None if toggle_to is None else asked_toggle(run.matrix, cell_of(run.matrix, row).as_dict(), toggle_to)
    writer_of(sut.engine(run.matrix.engine).program_name(run.matrix.engine_args))
    if check.oracle not in JUDGES:
        raise ReproError(f"cell {row['cell_id']}: a script cannot judge {check.oracle} yet (it judges "
                         f"{', '.join(JUDGES)}); --oracle NAME picks another failing oracle")
    declared = oracles.oracles().get(check.oracle)  # None for the error check: a script judges what raised
    judged = None if declared is None else declared.script_checks
    if judged is not None and check.check not in (None, *judged):
        raise ReproError(f"cell {row['cell_id']}: a script judges {check.oracle}'s {', '.join(sorted(judged))} alone, "
                         f"not {check.check}")
    say(f"cell {row['cell_id']} ({row['status']}): {check.text()}")
    engines = Engines(run.device)
    setup = Setup(run, engines, References(engines), Budget(budget))
    try:
        failing = setup.trial(cell_of(run.matrix, row))
        try:
            workload, check = baseline(setup, failing, row, check, say)
            toggle, toggled = find_toggle(setup, row, check, workload, probes, rows, say, asked)
        except BudgetSpent as exc:
            raise ReproError(f"cell {row['cell_id']}: {exc} before the failure was reproduced and toggled "
                             f"(--budget RUNS)") from None

        def outcomes(candidate: Workload) -> tuple[Outcome | None, Outcome | None]:
            """The cell's outcome, then the toggled cell's (run only where the cell's shows the check)."""
            try:
                first = failing.run(candidate)
                return first, (toggled.run(candidate) if check.failed(first) else None)
            except ReferenceFailed:
                return None, None

        def fails(candidate: Workload) -> bool:
            first, second = outcomes(candidate)
            return first is not None and second is not None and check.cured(second)

        shrunk = _shrink(workload, row, fails, setup)
        say(f"shrink: {shrunk.text()}")
        final = outcomes(shrunk.workload)  # already run, unless nothing shrank (then once more, past the budget)
        if final[0] is None or final[1] is None or not check.failed(final[0]) or not check.cured(final[1]):
            raise ReproError(f"cell {row['cell_id']}: the shrunk workload no longer shows {check.text()} with "
                             f"{toggle.factor}={toggle.level} alone")
        return Reproducer(row, header, failing.plan, toggle, toggled.plan.levels, check, shrunk, *final, run.device,
                          report_dir)
    finally:
        engines.close()
