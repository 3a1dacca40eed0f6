"""One cell's path, stage by stage: plan → golden → serve → judge → row. Each stage is a module of its own; this
one only puts them in order, within the cell's deadline, and turns anything raised into an ``error`` row."""
from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace

import torch

from fixtures.workloads import load_workload
from harness import sut
from harness.matrix.model import Cell, Matrix
from harness.results.rows import CellResult
from harness.run.boundary import Explored, cell_seams, explore
from harness.run.golden import GoldenRuns
from harness.run.judge import judge, pass_views
from harness.run.plan import CellPlan, plan_cell
from harness.run.row import cell_row, error_result
from harness.run.serve import WorkloadRun, deadline, serve_workload
from harness.run.trial import Engines

OnStep = Callable[[str], None]


@dataclass(slots=True)
class _Served:
    """What the cell's runs were and where its seconds went (the row's metrics)."""

    runs: list[WorkloadRun] = field(default_factory=list)
    own_runs: list[WorkloadRun] = field(default_factory=list)
    references: list[dict[str, WorkloadRun]] = field(default_factory=list)
    golden_seconds: float = 0.0


def run_cell(matrix: Matrix, cell: Cell, *, faults: frozenset[str], goldens: GoldenRuns,
             on_step: OnStep | None = None, examples_db: str | None = None) -> CellResult:
    """Plan, run and judge one cell on the goldens' device (its boundary draws kept in ``examples_db``); an
    exception or a timeout becomes ``error``."""
    return run_plan(replace(plan_cell(matrix, cell, faults), examples_db=examples_db), goldens, on_step)


def run_plan(plan: CellPlan, goldens: GoldenRuns, on_step: OnStep | None = None) -> CellResult:
    """Run and judge one planned cell, its engine brought up once for all its workloads; an exception or a
    timeout becomes ``error``; a declared known failure settles the status (``xfail``, ``xpass``)."""
    step = on_step or (lambda what: None)
    started = time.perf_counter()
    engines, explored = Engines(goldens.device), None
    try:
        with deadline(plan.timeout_s), ExitStack() as stack:
            stack.callback(engines.close)
            served = _serve_cell(plan, goldens, engines, step)
            views = [view for run, references in zip(served.runs, served.references)
                     for view in pass_views(run, references, plan.tolerances, plan.known)]
            if plan.boundary is not None:
                traits = served.runs[-1].traits if served.runs else None
                explored = explore(plan, engines, cell_seams(plan, traits), step, views)
                views += explored.views(plan)
            verdicts = judge(views)
    except Exception as exc:  # a crashing cell is a finding, not the end of the run
        return error_result(plan.result(), "".join(traceback.format_exception(exc)).strip(),
                            time.perf_counter() - started)
    wall = time.perf_counter() - started
    if explored is not None and explored.shrunk is not None and explored.shrunk.error is not None:
        return _with_boundary(error_result(plan.result(), explored.shrunk.error, wall), explored)
    return _with_boundary(cell_row(plan, verdicts, served.runs, served.own_runs, wall, served.golden_seconds), explored)


def _with_boundary(result: CellResult, explored: Explored | None) -> CellResult:
    """The row with what its boundary stage drew (``metrics.boundary``), where the cell drew."""
    if explored is not None:
        result.metrics["boundary"] = explored.to_json()
    return result


def _serve_cell(plan: CellPlan, goldens: GoldenRuns, engines: Engines, step: OnStep) -> _Served:
    """The golden and serve stages: each workload's reference runs (computed or reused), then the cell's own run
    on its engine (held in ``engines``, which the boundary stage serves on next), brought up at the first workload
    that needs it; a cell that is a golden configuration reuses that golden run."""
    served, own = _Served(), plan.served_as()
    before = time.perf_counter()
    for config in plan.goldens.values():  # an engine out of process starts once per golden configuration
        if not sut.engine(config.engine).in_process:
            goldens.prefetch([config.key(name) for name in plan.workloads])
    served.golden_seconds += time.perf_counter() - before
    for name in plan.workloads:
        workload = load_workload(name)
        before = time.perf_counter()
        step(f"{name}/golden")
        references = {ref: goldens.get(config.key(name), workload) for ref, config in plan.goldens.items()}
        served.golden_seconds += time.perf_counter() - before
        run = references[own] if own is not None else None
        if run is None:
            cell_engine = engines.get(plan.engine, plan.levels, plan.faults, plan.engine_args)
            run = serve_workload(cell_engine, workload, step)
            served.own_runs.append(run)
        served.runs.append(run)
        served.references.append(references)
    return served


def configure_torch() -> None:
    """One intra-op thread: the reference tensors are tiny, and parallel workers own a core each."""
    torch.set_num_threads(1)
