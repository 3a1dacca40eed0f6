"""The serve stage: a workload run cold then warm on one system of a cell's engine (and, where the cell asks,
its isolation passes and each request alone), within the cell's deadline."""
from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from fixtures.workloads import Workload
from harness.oracles.view import PASSES
from harness.sut import opened
from harness.sut.base import CellEngine, PassResult, Session, SystemUnderTest, Totals, Traits
from harness.sut.interrupt import holding

#: how soon a deadline that came while a process group started or stopped tries again.
DEADLINE_RETRY_S = 0.05
#: extra passes of an isolation workload in a storage cell: (pass, tenant suffix) on the cell's store.
ISOLATION_PASSES = (("tenant", "-other"), ("instance", ""))
OnStep = Callable[[str], None]


class CellTimeout(Exception):
    """The cell ran past its matrix's ``timeout_s``."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise CellTimeout in the main thread after ``seconds``; elsewhere, no limit (signals need it)."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def expire(signum: int, frame: object) -> None:
        if holding():  # a process group is starting or stopping: let it finish, then expire
            signal.setitimer(signal.ITIMER_REAL, DEADLINE_RETRY_S)
            return
        raise CellTimeout(f"cell exceeded its timeout of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(slots=True, kw_only=True)
class WorkloadRun:
    """A workload run cold then warm (and its isolation passes) on one system, and each request alone."""

    workload: Workload
    traits: Traits
    passes: dict[str, PassResult]
    solo: PassResult | None  # deterministic mode: every request run alone (batch size 1)
    totals: Totals
    seconds: float


def run_workload(
    levels: Mapping[str, object], workload: Workload, faults: frozenset[str], device: str = "cpu",
    on_step: OnStep | None = None, *, engine: str = "reference", engine_args: Mapping[str, object] | None = None,
) -> WorkloadRun:
    """Run ``workload`` on an engine brought up for it alone (a golden run, a test)."""
    with opened(engine, levels, faults, device, engine_args or {}) as cell_engine:
        return serve_workload(cell_engine, workload, on_step)


def serve_workload(engine: CellEngine, workload: Workload, on_step: OnStep | None = None) -> WorkloadRun:
    """Run ``workload`` cold then warm on a fresh system of ``engine``; in deterministic mode also each request alone.

    ``on_step`` hears each pass as it starts (``system_prompt/warm``): the progress line shows it.
    """
    step = on_step or (lambda what: None)
    started = time.perf_counter()
    session = engine.session(workload)
    try:
        system = session.open()
        try:
            passes = {name: _serve(system, workload, name, step) for name in PASSES}
            traits, totals = system.traits, system.totals()
        finally:
            system.close()
        if workload.isolation and "storage" in traits.cache.tiers:
            passes.update(_isolation_passes(session, workload, step))
        solo = _alone(session, workload, step) if traits.deterministic else None
    finally:
        session.close()
    return WorkloadRun(workload=workload, traits=traits, passes=passes, solo=solo, totals=totals,
                       seconds=time.perf_counter() - started)


def _serve(system: SystemUnderTest, workload: Workload, name: str, step: OnStep) -> PassResult:
    """One pass of ``workload``: its rounds one after the other."""
    step(f"{workload.name}/{name}")
    return system.serve(workload.rounds())


def _alone(session: Session, workload: Workload, step: OnStep) -> PassResult:
    """Every request alone, on one plain engine: a reference that shares no batching or PD mechanism with the cell."""
    step(f"{workload.name}/alone")
    alone = session.open(alone=True)
    try:
        return alone.serve([workload.requests])
    finally:
        alone.close()


def _isolation_passes(session: Session, workload: Workload, step: OnStep) -> dict[str, PassResult]:
    """The prompts again on the same store: from a second tenant (must hit nothing), then from a second
    instance of the cell's tenant, with an empty L1 and L2 (must hit everything the store holds)."""
    passes = {}
    for name, suffix in ISOLATION_PASSES:
        system = session.open(tenant_suffix=suffix)
        try:
            passes[name] = _serve(system, workload, name, step)
        finally:
            system.close()
    return passes
