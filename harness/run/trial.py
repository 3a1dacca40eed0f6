"""Running one cell's configuration on explicit workloads as the matrix runs it: the serve stage on the cell's
engine, its references (golden, spec_golden, cross_engine) on theirs, the judge stage over both. Every candidate
of a shrink is one such run; engines stay up between runs (a real engine starts in seconds, serves in less)."""
from __future__ import annotations

import json
import traceback
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from fixtures.workloads import Workload
from harness import sut
from harness.results.rows import Verdict, error_type
from harness.run.judge import judge, pass_views
from harness.run.plan import CellPlan, GoldenConfig
from harness.run.serve import WorkloadRun, deadline, serve_workload
from harness.sut.base import CellEngine


@dataclass(frozen=True, slots=True)
class Check:
    """The failure a reproducer keeps: an oracle and the ``check`` its findings name (None: any finding of it), or,
    for a cell that raised, ``error`` and the exception type."""

    oracle: str
    check: str | None = None

    def text(self) -> str:
        """``completeness``, ``accept_length (relative)``, ``error: IndexError``."""
        if self.oracle == "error":
            return f"error: {self.check}"
        return self.oracle if self.check is None else f"{self.oracle} ({self.check})"

    def failure_name(self) -> str:
        """The name a declaration's ``fails`` and the run's failure classes give it: ``error: IndexError``, or the
        oracle's name."""
        return f"error: {self.check}" if self.oracle == "error" else self.oracle

    def findings(self, outcome: Outcome) -> list[dict]:
        """The findings of ``outcome`` that are this check's."""
        verdict = outcome.verdicts.get(self.oracle)
        if self.oracle == "error" or verdict is None or verdict.status != "fail":
            return []
        return [f for f in verdict.detail if self.check is None or f.get("check") == self.check]

    def failed(self, outcome: Outcome) -> bool:
        if self.oracle == "error":
            return outcome.error is not None and error_type(outcome.error) == self.check
        return bool(self.findings(outcome))

    def cured(self, outcome: Outcome) -> bool:
        """Whether ``outcome`` is clean of this check: it does not fail it and raised nothing (a run that raised
        another exception says nothing of this check, so a toggle or a shrink step never counts it as a cure)."""
        return outcome.error is None and not self.failed(outcome)


@dataclass(slots=True)
class Outcome:
    """One run of a configuration on one workload: every oracle's verdict, or the traceback of what it raised."""

    verdicts: dict[str, Verdict] = field(default_factory=dict)
    run: WorkloadRun | None = None
    error: str | None = None

    def failing(self) -> list[str]:
        """What failed: the failing oracles, and ``error: Type`` for a run that raised."""
        failed = [name for name, verdict in self.verdicts.items() if verdict.status == "fail"]
        return failed + ([f"error: {error_type(self.error)}"] if self.error else [])


class ReferenceFailed(RuntimeError):
    """A reference run (no fault, the golden levels) raised: the candidate says nothing about the cell."""


class Engines:
    """The engines of the configurations a repro runs, each brought up once and held until ``close``; one that
    raised is closed and brought up afresh at its next run."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._open: dict[str, tuple[AbstractContextManager[CellEngine], CellEngine]] = {}

    @staticmethod
    def key(engine: str, levels: Mapping[str, object], faults: frozenset[str], args: Mapping[str, object]) -> str:
        return json.dumps([engine, dict(levels), sorted(faults), dict(args)], sort_keys=True, default=str)

    def get(self, engine: str, levels: Mapping[str, object], faults: frozenset[str],
            args: Mapping[str, object]) -> CellEngine:
        key = self.key(engine, levels, faults, args)
        if key not in self._open:
            manager = sut.opened(engine, levels, faults, self.device, args)
            self._open[key] = (manager, manager.__enter__())
        return self._open[key][1]

    def drop(self, engine: str, levels: Mapping[str, object], faults: frozenset[str],
             args: Mapping[str, object]) -> None:
        manager, _ = self._open.pop(self.key(engine, levels, faults, args), (None, None))
        if manager is not None:
            manager.__exit__(None, None, None)

    def close(self) -> None:
        while self._open:
            manager, _ = self._open.popitem()[1]
            manager.__exit__(None, None, None)


class References:
    """Reference runs (no fault) of each configuration and workload, computed once and shared by the trials."""

    def __init__(self, engines: Engines) -> None:
        self.engines = engines
        self._runs: dict[tuple[str, Workload], WorkloadRun] = {}

    def get(self, config: GoldenConfig, workload: Workload) -> WorkloadRun:
        key = (Engines.key(config.engine, config.levels, frozenset(), config.engine_args), workload)
        if key not in self._runs:
            engine = self.engines.get(config.engine, config.levels, frozenset(), config.engine_args)
            try:
                self._runs[key] = serve_workload(engine, workload)
            except Exception as exc:
                self.engines.drop(config.engine, config.levels, frozenset(), config.engine_args)
                raise ReferenceFailed(f"the reference run of {workload.name} on {dict(config.levels)} raised "
                                      f"{type(exc).__name__}: {exc}") from exc
        return self._runs[key]


class Trial:
    """One cell's configuration (its plan, judged without the matrix's declared failures) run on any workload;
    each workload's outcome is kept, so asking again costs nothing."""

    def __init__(self, plan: CellPlan, engines: Engines, references: References) -> None:
        self.plan, self.engines, self.references = plan, engines, references
        self.outcomes: dict[Workload, Outcome] = {}

    def run(self, workload: Workload) -> Outcome:
        """The cell's outcome on ``workload``; raises ``ReferenceFailed`` when a reference run raised."""
        if workload not in self.outcomes:
            self.outcomes[workload] = self._run(workload)
        return self.outcomes[workload]

    def _run(self, workload: Workload) -> Outcome:
        plan = self.plan
        with deadline(plan.timeout_s):
            references = {name: self.references.get(config, workload) for name, config in plan.goldens.items()}
            try:
                engine = self.engines.get(plan.engine, plan.levels, plan.faults, plan.engine_args)
                run = serve_workload(engine, workload)
            except Exception as exc:  # the failure a reproducer keeps may be this very exception
                self.engines.drop(plan.engine, plan.levels, plan.faults, plan.engine_args)
                return Outcome(error="".join(traceback.format_exception(exc)).strip())
        return Outcome(judge(pass_views(run, references, plan.tolerances, plan.known)), run)
