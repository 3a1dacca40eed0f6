"""Runner: build the engine of a cell, run its workloads cold then warm, judge it, never crash."""
from __future__ import annotations

import json
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace

import torch

from fixtures.spec_expect import accept_band
from fixtures.workloads import CachedExpectation, Workload, load_workload
from harness.matrix.levels import CROSS_MODELS, REFERENCE, engine_levels
from harness.matrix.model import Cell, MatrixSpec
from harness.results.rows import CellResult
from harness.run.oracles import PASSES, PassView, judge
from harness.sut import opened
from harness.sut.base import CellEngine, PassResult, Session, SystemUnderTest, Totals, Traits
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
    on_step: Callable[[str], None] | None = None, *, engine: str = "reference",
    engine_args: Mapping[str, object] | None = None,
) -> WorkloadRun:
    """Run ``workload`` on an engine brought up for it alone (a golden run, a test)."""
    with opened(engine, levels, faults, device, engine_args or {}) as cell_engine:
        return serve_workload(cell_engine, workload, on_step)


def serve_workload(engine: CellEngine, workload: Workload, on_step: Callable[[str], None] | None = None) -> WorkloadRun:
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
    def key(levels: Mapping[str, object], workload: str, engine: str = "reference",
            engine_args: Mapping[str, object] | None = None) -> tuple:
        """The identity of a golden run: the engine and its ``[engine_args]``, every level (defaults filled in),
        and the workload's name."""
        full = tuple(sorted(engine_levels(levels, engine).items(), key=lambda kv: kv[0]))
        return engine, json.dumps(dict(engine_args or {}), sort_keys=True), full, workload

    def __contains__(self, key: tuple) -> bool:
        return key in self._runs

    def get(self, levels: Mapping[str, object], workload: Workload, engine: str = "reference",
            engine_args: Mapping[str, object] | None = None) -> WorkloadRun:
        key = self.key(levels, workload.name, engine, engine_args)
        if key in self._runs:
            self.reused += 1
        else:
            self._runs[key] = self.compute(key, self.device, workload)
            self.computed += 1
        return self._runs[key]

    def prefetch(self, levels: Mapping[str, object], workloads: Sequence[str], engine: str = "reference",
                 engine_args: Mapping[str, object] | None = None) -> None:
        """Compute the golden runs of ``workloads`` not yet here on one engine brought up once: a real engine
        starts in seconds and serves a workload in a fraction of that (``get`` then counts them as reused)."""
        missing = [name for name in workloads if self.key(levels, name, engine, engine_args) not in self._runs]
        if len(missing) < 2:
            return
        with opened(engine, levels, frozenset(), self.device, engine_args or {}) as cell_engine:
            for name in missing:
                self.put(self.key(levels, name, engine, engine_args), serve_workload(cell_engine, load_workload(name)))

    @staticmethod
    def compute(key: tuple, device: str, workload: Workload | None = None) -> WorkloadRun:
        """The golden run ``key`` names, on ``device``: no fault, on an engine of its own."""
        engine, engine_args, levels, name = key
        return run_workload(dict(levels), workload or load_workload(name), frozenset(), device, engine=engine,
                            engine_args=json.loads(engine_args))

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


def _views(run: WorkloadRun, golden: WorkloadRun, spec_golden: WorkloadRun | None,
           tolerances: Mapping[str, float], cross: WorkloadRun | None = None) -> list[PassView]:
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
            counters=record.counters or None, logprob_tolerance=tolerances.get("logprobs"),
            tie_tolerance=tolerances.get("tie"), audited=traits.audited, pass_counted=traits.pass_counted,
            spec_reference_counters=spec_golden.passes["cold"].counters if spec_golden else None,
            cross_reference=cross.passes["cold"].outputs if cross else None, page_size=traits.page_size,
            pd_ledger=record.pd,
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
        "preemptions": _stat(runs, "preemptions"),
        **_spec_metrics(runs),
        **_pd_metrics(runs),
        "golden_reused": len(own_runs) < len(runs),
        **_server_logs(own_runs),
        **{f"engine_{what}_seconds": round(sum(r.totals.seconds.get(what, 0.0) for r in own_runs), 4)
           for what in sorted({what for r in own_runs for what in r.totals.seconds})},
    }


def _server_logs(runs: list[WorkloadRun]) -> dict[str, object]:
    """A server cell: the output files its servers wrote, each once (absent for an engine that keeps none)."""
    logs = list(dict.fromkeys(log for r in runs for log in r.totals.logs))
    return {"server_logs": logs} if logs else {}


def _pd_metrics(runs: list[WorkloadRun]) -> dict[str, object]:
    """PD cells: what crossed (summed over workloads), the move gate's refusals and each side's verify scratch."""
    counters = [r.totals.pd for r in runs if r.totals.pd is not None]
    if not counters:
        return {}
    summed = {key: sum(c[key] for c in counters) for key, value in counters[0].items() if isinstance(value, int)}
    scratch = {side: max(c["verify_scratch_bytes"][side] for c in counters) for side in ("prefill", "decode")}
    return {"pd": {**summed, "verify_scratch_bytes": scratch}}


def _stat(runs: list[WorkloadRun], name: str) -> int | None:
    """An engine counter summed over the runs; None when the engine does not count it (a real engine)."""
    counted = [r.totals.stats[name] for r in runs if name in r.totals.stats]
    return sum(counted) if counted else None


def _spec_metrics(runs: list[WorkloadRun]) -> dict[str, object]:
    """Accept length over both passes of every workload, decode tokens per target forward, draft-state hits.

    A pass-counted engine's mean is 1 + accepted / drafts over all its passes (vLLM's definition)."""
    if runs and runs[0].traits.pass_counted:
        counters = [p.counters for r in runs for p in r.passes.values()]
        drafts, accepted = (sum(c.get(key, 0) for c in counters) for key in ("drafts", "accepted_tokens"))
        mean = round(1 + accepted / drafts, 4) if drafts else None
        return {"mean_accept_length": mean, "accept": {"drafts": drafts, "accepted_tokens": accepted,
                                                       "draft_tokens": sum(c.get("draft_tokens", 0) for c in counters)}}
    stats = outputs_accept_stats([o for r in runs for p in r.passes.values() for o in p.outputs])
    forwards, emitted = _stat(runs, "decode_forwards"), _stat(runs, "emitted_tokens")
    return {
        "mean_accept_length": stats.to_json()["mean_accept_length"],
        "accept": stats.to_json(),
        "decode_tokens_per_forward": round(emitted / forwards, 4) if forwards else None,
        "draft_full_hits": _stat(runs, "draft_full_hits"),
        "draft_partial_hits": _stat(runs, "draft_partial_hits"),
    }


def spec_golden_levels(levels: Mapping[str, object], golden_levels: Mapping[str, object],
                       engine: str = "reference") -> dict[str, object] | None:
    """The accept_length oracle's reference: golden levels with the cell's spec algorithm; None without spec."""
    full = engine_levels(levels, engine)
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
    engine: str = "reference"
    engine_args: dict[str, object] = field(default_factory=dict)
    expected: dict | None = None    # the ``[[expected]]`` entries the cell matches, merged (MatrixSpec.expected_for)
    tolerances: dict[str, float] = field(default_factory=dict)  # ``[[tolerances]]`` it matches: logprobs, tie
    cross_levels: dict[str, object] | None = None  # the reference golden serving the same weights (cross_engine)

    def golden_keys(self) -> list[tuple]:
        """The golden runs this cell reads, one lookup each, in the order ``run_plan`` reads them."""
        keys = []
        for name in self.workloads:
            keys.append(GoldenRuns.key(self.golden_levels, name, self.engine, self.engine_args))
            if self.spec_levels is not None:
                keys.append(GoldenRuns.key(self.spec_levels, name, self.engine, self.engine_args))
            if self.cross_levels is not None:
                keys.append(GoldenRuns.key(self.cross_levels, name))
        return keys

    def result(self) -> CellResult:
        """The cell's row before it runs: a pass until something says otherwise."""
        return CellResult(cell_id=self.cell_id, matrix=self.matrix, factors=self.levels, status="pass",
                          faults=sorted(self.faults), expected=self.expected)


def plan_cell(spec: MatrixSpec, cell: Cell, faults: frozenset[str]) -> CellPlan:
    """The plan of ``cell``: its levels, its golden cell's, its workloads (``[[workloads]]``) and timeout."""
    levels = cell.as_dict()
    golden_levels = {**spec.golden, **spec.golden_of(cell).as_dict()}
    expected = spec.expected_for(cell)
    tolerances = {}
    for entry in spec.tolerances_for(cell):  # the loosest declared tolerance of each kind applies
        for kind in ("logprobs", "tie"):
            value = getattr(entry, kind)
            if value is not None:
                tolerances[kind] = max(value, tolerances.get(kind, 0.0))
    cross = CROSS_MODELS.get(str(engine_levels(levels, spec.engine)["model"])) if spec.engine != "reference" else None
    return CellPlan(cell.cell_id, spec.name, levels, golden_levels,
                    spec_golden_levels(levels, golden_levels, spec.engine), spec.workloads_for(cell), spec.timeout_s,
                    frozenset(faults), spec.engine, dict(spec.engine_args),
                    expected, tolerances,
                    {**REFERENCE.golden, "model": cross} if cross else None)


def run_cell(spec: MatrixSpec, cell: Cell, *, faults: frozenset[str], goldens: GoldenRuns,
             on_step: Callable[[str], None] | None = None) -> CellResult:
    """Run and judge one cell on the goldens' device; an exception or a timeout becomes ``error``."""
    return run_plan(plan_cell(spec, cell, faults), goldens, on_step)


def run_plan(plan: CellPlan, goldens: GoldenRuns, on_step: Callable[[str], None] | None = None) -> CellResult:
    """Run and judge one planned cell, its engine brought up once for all its workloads; an exception or a
    timeout becomes ``error``; a declared known failure settles the status (``xfail``, ``xpass``)."""
    levels, faults, engine = plan.levels, plan.faults, plan.engine
    full = engine_levels(levels, engine)
    cell_is_golden = not faults and full == engine_levels(plan.golden_levels, engine)
    cell_is_spec_golden = (not faults and plan.spec_levels is not None
                           and full == engine_levels(plan.spec_levels, engine))
    result = plan.result()
    started = time.perf_counter()
    golden_seconds = 0.0
    try:
        with deadline(plan.timeout_s), ExitStack() as stack:
            runs, own_runs, views = [], [], []
            cell_engine = None
            if engine != "reference":  # out of process: one start per golden configuration, not per workload
                before = time.perf_counter()
                for golden_levels in (plan.golden_levels, plan.spec_levels):
                    if golden_levels is not None:
                        goldens.prefetch(golden_levels, plan.workloads, engine, plan.engine_args)
                golden_seconds += time.perf_counter() - before
            for name in plan.workloads:
                workload = load_workload(name)
                before = time.perf_counter()
                if on_step:
                    on_step(f"{name}/golden")
                golden = goldens.get(plan.golden_levels, workload, engine, plan.engine_args)
                spec_golden = (goldens.get(plan.spec_levels, workload, engine, plan.engine_args)
                               if plan.spec_levels else None)
                cross = goldens.get(plan.cross_levels, workload) if plan.cross_levels else None
                golden_seconds += time.perf_counter() - before
                run = golden if cell_is_golden else spec_golden if cell_is_spec_golden else None
                if run is None:
                    if cell_engine is None:
                        cell_engine = stack.enter_context(opened(engine, levels, faults, goldens.device, plan.engine_args))
                    run = serve_workload(cell_engine, workload, on_step)
                    own_runs.append(run)
                runs.append(run)
                views.extend(_views(run, golden, spec_golden, plan.tolerances, cross))
            result.oracles = judge(views)
    except Exception as exc:  # a crashing cell is a finding, not the end of the run
        return error_result(result, "".join(traceback.format_exception(exc)).strip(), time.perf_counter() - started)
    result.status = "fail" if any(v.status == "fail" for v in result.oracles.values()) else "pass"
    result.metrics = {**_metrics(runs, own_runs, time.perf_counter() - started, golden_seconds),
                      "workloads": list(plan.workloads)}
    if plan.tolerances:
        result.metrics["tolerances"] = dict(plan.tolerances)
    return result.settle()


def error_result(result: CellResult, error: str, wall: float) -> CellResult:
    """``result`` turned into an ``error`` row carrying ``error`` (a traceback or what killed the cell)."""
    result.status = "error"
    result.error = error
    result.oracles = {}
    result.metrics = {"wall_seconds": round(wall, 4)}
    return result.settle()


def configure_torch() -> None:
    """One intra-op thread: the reference tensors are tiny, and parallel workers own a core each."""
    torch.set_num_threads(1)
