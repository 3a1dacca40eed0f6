"""Runner: build the engine of a cell, run its workloads cold then warm, judge it, never crash."""
from __future__ import annotations

import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch

from fixtures.spec_expect import accept_band
from fixtures.workloads import CachedExpectation, Workload, load_workload
from harness.matrix.levels import engine_levels
from harness.matrix.model import Cell, MatrixSpec
from harness.results.rows import CellResult
from harness.run.oracles import PASSES, PassView, judge
from harness.sut.base import PassResult, Session, SystemUnderTest, Totals, Traits
from harness.sut.reference import ReferenceSession
from reference_impl.request import TIERS, RequestOutput
from reference_impl.spec.verify import outputs_accept_stats


class CellTimeout(Exception):
    """The cell ran past its matrix's ``timeout_s``."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise CellTimeout in the main thread after ``seconds``; elsewhere, no limit (signals need it)."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def expire(signum: int, frame: object) -> None:
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
    solo: list[RequestOutput] | None  # deterministic mode: every request run alone (batch size 1)
    totals: Totals
    seconds: float


def run_workload(
    levels: Mapping[str, object], workload: Workload, faults: frozenset[str], device: str = "cpu",
    on_step: Callable[[str], None] | None = None,
) -> WorkloadRun:
    """Run ``workload`` cold then warm on a fresh system; in deterministic mode also each request alone.

    ``on_step`` hears each pass as it starts (``system_prompt/warm``): the progress line shows it.
    """
    step = on_step or (lambda what: None)
    started = time.perf_counter()
    session = ReferenceSession(levels, workload, faults, device)
    try:
        system = session.open()
        try:
            passes = {name: _serve(system, workload, name, step) for name in PASSES}
            traits, totals = system.traits, system.totals()
        finally:
            system.close()
        if workload.isolation and "storage" in traits.tiers:
            passes.update(_isolation_passes(session, workload, step))
        solo = None
        if traits.deterministic:
            step(f"{workload.name}/alone")
            # alone, on one plain engine: a reference that shares no PD mechanism with the cell
            alone = session.open(alone=True)
            try:
                solo = alone.serve([workload.requests]).outputs
            finally:
                alone.close()
    finally:
        session.close()
    return WorkloadRun(workload=workload, traits=traits, passes=passes, solo=solo, totals=totals,
                       seconds=time.perf_counter() - started)


def _serve(system: SystemUnderTest, workload: Workload, name: str, step: Callable[[str], None]) -> PassResult:
    """One pass of ``workload``: its rounds one after the other."""
    step(f"{workload.name}/{name}")
    return system.serve(workload.rounds())


#: extra passes of an isolation workload in a storage cell: (pass, tenant suffix) on the cell's store.
ISOLATION_PASSES = (("tenant", "-other"), ("instance", ""))


def _isolation_passes(session: Session, workload: Workload, step: Callable[[str], None]) -> dict[str, PassResult]:
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


class GoldenRuns:
    """Golden runs, computed once per (golden levels, workload) on one device and reused by every cell.

    ``put`` hands in a run computed elsewhere (a worker process of ``harness run -j``), counted as computed.
    """

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self._runs: dict[tuple, WorkloadRun] = {}
        self.computed = 0
        self.reused = 0

    @staticmethod
    def key(levels: Mapping[str, object], workload: str) -> tuple:
        """The identity of a golden run: every engine level (defaults filled in) and the workload's name."""
        return tuple(sorted(engine_levels(levels).items(), key=lambda kv: kv[0])), workload

    def __contains__(self, key: tuple) -> bool:
        return key in self._runs

    def get(self, levels: Mapping[str, object], workload: Workload) -> WorkloadRun:
        key = self.key(levels, workload.name)
        if key in self._runs:
            self.reused += 1
        else:
            self._runs[key] = run_workload(levels, workload, frozenset(), self.device)
            self.computed += 1
        return self._runs[key]

    def put(self, key: tuple, run: WorkloadRun) -> None:
        """Keep a golden run computed elsewhere."""
        self._runs[key] = run
        self.computed += 1

    def runs(self, keys: list[tuple]) -> dict[tuple, WorkloadRun]:
        """The runs of ``keys``, to hand to a worker process."""
        return {key: self._runs[key] for key in keys}


def _expected(run: WorkloadRun, name: str) -> dict[str, CachedExpectation]:
    """The workload's cached-token expectation for one pass of ``run``.

    The cold and warm passes get the workload's bounds. An isolation workload's second tenant must hit
    nothing at all, its second engine what the warm pass hits (from whichever tier). A cell that injects
    transport failures (PD) retries a request whose transfer failed, and the retry may hit the pages its
    first attempt computed: any pass may then reach what all prompts imply. A request aborted in the cold
    pass may have cached only part of its prompt: the warm pass must reach at least what the completed
    requests' prompts imply.
    """
    traits = run.traits
    if not traits.cache_enabled or name == "tenant":
        return {r.rid: CachedExpectation(0, 0, traits.page_size) for r in run.workload.requests}
    args = dict(page_size=traits.page_size, state_interval=traits.state_interval, hybrid=traits.hybrid,
                chunk_size=traits.chunk_size, tiers=traits.tiers)
    # the cache model (exact for a sequential workload, dense, no proposer) knows one engine's cold and warm pass
    model = dict(exact=traits.model_cache and traits.spec == "none" and name in PASSES, decodes=not traits.pd)
    if not traits.aborts_allowed:
        expected = run.workload.expected_cached(**args, **model, warm=name != "cold")
        if name == "instance":
            return {rid: replace(e, host=None, storage=None) for rid, e in expected.items()}
        return expected
    ceiling = run.workload.expected_cached(**args, warm=True)
    completed = {o.rid for o in run.passes["cold"].outputs if o.finish_reason == "length"}
    floor = run.workload.expected_cached(**args, warm=True, cached_from=completed) if name != "cold" else None
    return {rid: CachedExpectation(floor[rid].lo if floor else 0, e.hi, e.page_size, None, None)
            for rid, e in ceiling.items()}


def _views(run: WorkloadRun, golden: WorkloadRun, spec_golden: WorkloadRun | None) -> list[PassView]:
    traits, requests = run.traits, run.workload.requests
    views = []
    for name, record in run.passes.items():
        reference, reference_name = (run.solo, "solo") if name == "cold" else (run.passes["cold"].outputs, "cold")
        views.append(PassView(
            workload=run.workload.name, name=name, outputs=record.outputs, golden=golden.passes["cold"].outputs,
            requested={r.rid: r.max_new_tokens for r in requests}, expected_cached=_expected(run, name),
            nan_events=record.nan_events, audit=record.audit, dtype=traits.dtype,
            deterministic=traits.deterministic, hybrid=traits.hybrid, reference=reference,
            reference_name=reference_name,
            spec_reference=spec_golden.passes["cold"].outputs if spec_golden else None,
            max_accept_length=traits.num_draft_tokens + 1, aborts_allowed=traits.aborts_allowed, spec=traits.spec,
            prompts={r.rid: r.prompt for r in requests},
            accept_band=accept_band(run.workload.name, traits.model, traits.spec, traits.num_draft_tokens),
            counters=record.counters or None, page_size=traits.page_size, pd_ledger=record.pd,
        ))
    return views


def _metrics(runs: list[WorkloadRun], own_runs: list[WorkloadRun], wall: float, golden_seconds: float) -> dict[str, object]:
    engine = sum(r.seconds for r in own_runs)
    generated = sum(len(o.tokens) for r in own_runs for p in r.passes.values() for o in p.outputs)
    return {
        "wall_seconds": round(wall, 4),
        "engine_seconds": round(engine, 4),
        "golden_seconds": round(golden_seconds, 4),
        "harness_seconds": round(max(wall - engine - golden_seconds, 0.0), 4),
        "tokens_per_s": round(generated / engine, 1) if engine else None,
        "cached_tokens_warm": sum(o.cached_tokens for r in runs for o in r.passes["warm"].outputs),
        "cached_tokens_warm_by_tier": {
            tier: sum(o.cached_by_tier()[tier] for r in runs for o in r.passes["warm"].outputs) for tier in TIERS
        },
        "cached_tokens_cold": sum(o.cached_tokens for r in runs for o in r.passes["cold"].outputs),
        "preemptions": sum(r.totals.stats["preemptions"] for r in runs),
        **_spec_metrics(runs),
        **_pd_metrics(runs),
        "golden_reused": len(own_runs) < len(runs),
    }


def _pd_metrics(runs: list[WorkloadRun]) -> dict[str, object]:
    """PD cells: what crossed (summed over workloads), the move gate's refusals and each side's verify scratch."""
    counters = [r.totals.pd for r in runs if r.totals.pd is not None]
    if not counters:
        return {}
    summed = {key: sum(c[key] for c in counters) for key, value in counters[0].items() if isinstance(value, int)}
    scratch = {side: max(c["verify_scratch_bytes"][side] for c in counters) for side in ("prefill", "decode")}
    return {"pd": {**summed, "verify_scratch_bytes": scratch}}


def _spec_metrics(runs: list[WorkloadRun]) -> dict[str, object]:
    """Accept length over both passes of every workload, decode tokens per target forward, draft-state hits."""
    outputs = [o for r in runs for p in r.passes.values() for o in p.outputs]
    stats = outputs_accept_stats(outputs)
    forwards = sum(r.totals.stats["decode_forwards"] for r in runs)
    return {
        "mean_accept_length": stats.to_json()["mean_accept_length"],
        "accept": stats.to_json(),
        "decode_tokens_per_forward": round(sum(r.totals.stats["emitted_tokens"] for r in runs) / forwards, 4) if forwards else None,
        "draft_full_hits": sum(r.totals.stats["draft_full_hits"] for r in runs),
        "draft_partial_hits": sum(r.totals.stats["draft_partial_hits"] for r in runs),
    }


def spec_golden_levels(levels: Mapping[str, object], golden_levels: Mapping[str, object]) -> dict[str, object] | None:
    """The accept_length oracle's reference: golden levels with the cell's spec algorithm; None without spec."""
    full = engine_levels(levels)
    if full["spec"] == "none":
        return None
    return {**golden_levels, "spec": full["spec"], "num_draft_tokens": full["num_draft_tokens"]}


@dataclass(frozen=True, slots=True)
class CellPlan:
    """What running one cell needs, in plain picklable values (a MatrixSpec's mapping proxies do not pickle)."""

    cell_id: str
    matrix: str
    levels: dict[str, object]
    golden_levels: dict[str, object]
    spec_levels: dict[str, object] | None  # the accept_length reference's levels; None without spec
    workloads: tuple[str, ...]
    timeout_s: float
    faults: frozenset[str]

    def golden_keys(self) -> list[tuple]:
        """The golden runs this cell reads, one lookup each, in the order ``run_plan`` reads them."""
        keys = []
        for name in self.workloads:
            keys.append(GoldenRuns.key(self.golden_levels, name))
            if self.spec_levels is not None:
                keys.append(GoldenRuns.key(self.spec_levels, name))
        return keys


def plan_cell(spec: MatrixSpec, cell: Cell, faults: frozenset[str]) -> CellPlan:
    """The plan of ``cell``: its levels, its golden cell's, its workloads (``[[workloads]]``) and timeout."""
    levels = cell.as_dict()
    golden_levels = {**spec.golden, **spec.golden_of(cell).as_dict()}
    return CellPlan(cell.cell_id, spec.name, levels, golden_levels, spec_golden_levels(levels, golden_levels),
                    spec.workloads_for(cell), spec.timeout_s, frozenset(faults))


def run_cell(spec: MatrixSpec, cell: Cell, *, faults: frozenset[str], goldens: GoldenRuns,
             on_step: Callable[[str], None] | None = None) -> CellResult:
    """Run and judge one cell on the goldens' device; an exception or a timeout becomes ``error``."""
    return run_plan(plan_cell(spec, cell, faults), goldens, on_step)


def run_plan(plan: CellPlan, goldens: GoldenRuns, on_step: Callable[[str], None] | None = None) -> CellResult:
    """Run and judge one planned cell; an exception or a timeout becomes ``error``."""
    levels, faults = plan.levels, plan.faults
    cell_is_golden = not faults and engine_levels(levels) == engine_levels(plan.golden_levels)
    cell_is_spec_golden = (not faults and plan.spec_levels is not None
                           and engine_levels(levels) == engine_levels(plan.spec_levels))
    result = CellResult(cell_id=plan.cell_id, matrix=plan.matrix, factors=levels, status="pass", faults=sorted(faults))
    started = time.perf_counter()
    golden_seconds = 0.0
    try:
        with deadline(plan.timeout_s):
            runs, own_runs, views = [], [], []
            for name in plan.workloads:
                workload = load_workload(name)
                before = time.perf_counter()
                if on_step:
                    on_step(f"{name}/golden")
                golden = goldens.get(plan.golden_levels, workload)
                spec_golden = goldens.get(plan.spec_levels, workload) if plan.spec_levels else None
                golden_seconds += time.perf_counter() - before
                reuse = golden if cell_is_golden else spec_golden if cell_is_spec_golden else None
                run = reuse or run_workload(levels, workload, faults, goldens.device, on_step)
                runs.append(run)
                if run is not reuse:
                    own_runs.append(run)
                views.extend(_views(run, golden, spec_golden))
            result.oracles = judge(views)
    except Exception as exc:  # a crashing cell is a finding, not the end of the run
        return error_result(result, "".join(traceback.format_exception(exc)).strip(), time.perf_counter() - started)
    result.status = "fail" if any(v.status == "fail" for v in result.oracles.values()) else "pass"
    result.metrics = {**_metrics(runs, own_runs, time.perf_counter() - started, golden_seconds),
                      "workloads": list(plan.workloads)}
    return result


def error_result(result: CellResult, error: str, wall: float) -> CellResult:
    """``result`` turned into an ``error`` row carrying ``error`` (a traceback or what killed the cell)."""
    result.status = "error"
    result.error = error
    result.oracles = {}
    result.metrics = {"wall_seconds": round(wall, 4)}
    return result


def configure_torch() -> None:
    """One intra-op thread: the reference tensors are tiny, and parallel workers own a core each."""
    torch.set_num_threads(1)
