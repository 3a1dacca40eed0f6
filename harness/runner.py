"""Runner: build the engine of a cell, run its workloads cold then warm, judge it, never crash."""
from __future__ import annotations

import signal
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch

from fixtures.spec_expect import accept_band
from fixtures.workloads import CachedExpectation, Workload, load_workload
from harness.engine_setup import STATE_INTERVAL, build_engine_config, engine_levels, make_engine
from harness.matrix import Cell, MatrixSpec
from harness.oracles import PASSES, PassView, Verdict, judge
from reference_impl.cache.radix import NoCache
from reference_impl.cache.stores import FileStore
from reference_impl.config import EngineConfig
from reference_impl.engine.llm_engine import Engine, EngineStats
from reference_impl.pd.disagg import DisaggEngine
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


@dataclass(slots=True)
class PassRecord:
    """One pass of one workload: outputs as returned, NaN events, idle audit."""

    outputs: list[RequestOutput]
    nan_events: list
    audit: list[str]
    counters: dict[str, int] = field(default_factory=dict)  # the engine's decode counters over this pass alone


@dataclass(slots=True)
class WorkloadRun:
    """A workload run cold then warm on one engine."""

    workload: Workload
    passes: dict[str, PassRecord]
    solo: list[RequestOutput] | None  # deterministic mode: every request run alone (batch size 1)
    stats: EngineStats
    dtype: torch.dtype
    cache_enabled: bool
    hybrid: bool
    deterministic: bool
    page_size: int
    num_draft_tokens: int
    chunk_size: int  # the Mamba2 SSD chunk, which with the page size sets the snapshot grid
    seconds: float
    tiers: tuple[str, ...] = ()  # the cache's tiers below L1 ("host", "storage")
    pd: dict | None = None       # PD cells: what crossed between the engines (DisaggEngine.counters)
    aborts_allowed: bool = False  # PD cells that inject transport failures may report requests aborted
    spec: str = "none"            # the proposer level
    model: str = ""               # the model level (names the accept band)


def run_workload(
    levels: Mapping[str, object], workload: Workload, faults: frozenset[str], device: str = "cpu",
    on_step: Callable[[str], None] | None = None,
) -> WorkloadRun:
    """Run ``workload`` cold then warm on a fresh engine; in deterministic mode also each request alone.

    ``on_step`` hears each pass as it starts (``system_prompt/warm``): the progress line shows it.
    """
    step = on_step or (lambda what: None)
    # A store namespace of its own: a shared Redis must not carry one run's prefixes into another's cold pass.
    config = replace(build_engine_config(levels, workload, faults, device), tenant=f"run-{uuid.uuid4().hex}")
    started = time.perf_counter()
    with _store_for(config, workload) as config:
        engine = make_engine(config)
        try:
            passes = {name: _serve(engine, workload, name, step) for name in PASSES}
            stats, tiers = engine.stats, engine.cache.lower_tiers
            pd = engine.counters() if isinstance(engine, DisaggEngine) else None
        finally:
            engine.close()
        if workload.isolation and "storage" in tiers:
            passes.update(_isolation_passes(config, workload, step))
    solo = None
    if config.deterministic:
        step(f"{workload.name}/alone")
        # alone, on one plain engine: a reference that shares no PD mechanism with the cell
        solo = Engine(replace(config, max_running=1, pd=None, tenant=f"solo-{config.tenant}")).generate(workload.requests)
    return WorkloadRun(
        workload, passes, solo, stats, config.dtype, config.cache is not NoCache,
        config.model.is_hybrid, config.deterministic, config.page_size, config.num_draft_tokens,
        config.model.mamba.chunk_size,
        time.perf_counter() - started,
        tiers,
        pd,
        config.pd_fail_rate > 0,
        str(engine_levels(levels)["spec"]),
        config.model.name,
    )


def _serve(engine: Engine | DisaggEngine, workload: Workload, name: str, step: Callable[[str], None]) -> PassRecord:
    """One pass of ``workload``: its rounds one after the other, then the idle engine's audit."""
    step(f"{workload.name}/{name}")
    seen, before = len(engine.nan_events), replace(engine.stats)
    outputs = [out for group in workload.rounds() for out in engine.generate(group)]
    return PassRecord(outputs, engine.nan_events[seen:], engine.audit(), _counted(before, engine.stats))


@contextmanager
def _store_for(config: EngineConfig, workload: Workload) -> Iterator[EngineConfig]:
    """The cell's config; for an isolation workload on the file store, one directory every engine of the run shares."""
    if not workload.isolation or config.store_location is not None or config.store is not FileStore:
        yield config
        return
    with tempfile.TemporaryDirectory(prefix="kvmatrix-shared-store-") as location:
        yield replace(config, store_location=location)


#: extra passes of an isolation workload in a storage cell: (pass, tenant suffix) on the cell's store.
ISOLATION_PASSES = (("tenant", "-other"), ("instance", ""))


def _isolation_passes(config: EngineConfig, workload: Workload, step: Callable[[str], None]) -> dict[str, PassRecord]:
    """The prompts again on the same store: from a second tenant (must hit nothing), then from a second
    engine of the cell's tenant, with an empty L1 and L2 (must hit everything the store holds)."""
    passes = {}
    for name, suffix in ISOLATION_PASSES:
        engine = make_engine(replace(config, tenant=config.tenant + suffix))
        try:
            passes[name] = _serve(engine, workload, name, step)
        finally:
            engine.close()
    return passes


#: the EngineStats counters the accept_length oracle recounts the accept accounting from.
DECODE_COUNTERS = ("decode_forwards", "emitted_tokens", "verify_steps", "verify_emitted")


def _counted(before: EngineStats, after: EngineStats) -> dict[str, int]:
    """What the engine counted between two snapshots of its stats."""
    return {name: getattr(after, name) - getattr(before, name) for name in DECODE_COUNTERS}


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


@dataclass(slots=True)
class CellResult:
    """The record of one cell, as written to results.jsonl."""

    cell_id: str
    matrix: str
    factors: dict[str, object]
    status: str
    oracles: dict[str, Verdict] = field(default_factory=dict)
    metrics: dict[str, object] = field(default_factory=dict)
    faults: list[str] = field(default_factory=list)
    error: str | None = None

    def to_json(self) -> dict:
        return {
            "cell_id": self.cell_id, "matrix": self.matrix, "factors": self.factors, "status": self.status,
            "oracles": {name: v.to_json() for name, v in self.oracles.items()},
            "metrics": self.metrics, "faults": self.faults, "error": self.error,
        }


def _expected(run: WorkloadRun, name: str) -> dict[str, CachedExpectation]:
    """The workload's cached-token expectation for one pass of ``run``.

    The cold and warm passes get the workload's bounds. An isolation workload's second tenant must hit
    nothing at all, its second engine what the warm pass hits (from whichever tier). A cell that injects
    transport failures (PD) retries a request whose transfer failed, and the retry may hit the pages its
    first attempt computed: any pass may then reach what all prompts imply. A request aborted in the cold
    pass may have cached only part of its prompt: the warm pass must reach at least what the completed
    requests' prompts imply.
    """
    if not run.cache_enabled or name == "tenant":
        return {r.rid: CachedExpectation(0, 0, run.page_size) for r in run.workload.requests}
    args = dict(page_size=run.page_size, state_interval=STATE_INTERVAL, hybrid=run.hybrid,
                chunk_size=run.chunk_size, tiers=run.tiers)
    if not run.aborts_allowed:
        expected = run.workload.expected_cached(**args, warm=name != "cold")
        if name == "instance":
            return {rid: replace(e, host=None, storage=None) for rid, e in expected.items()}
        return expected
    ceiling = run.workload.expected_cached(**args, warm=True)
    completed = {o.rid for o in run.passes["cold"].outputs if o.finish_reason == "length"}
    floor = run.workload.expected_cached(**args, warm=True, cached_from=completed) if name != "cold" else None
    return {rid: CachedExpectation(floor[rid].lo if floor else 0, e.hi, e.page_size, None, None)
            for rid, e in ceiling.items()}


def _views(run: WorkloadRun, golden: WorkloadRun, spec_golden: WorkloadRun | None) -> list[PassView]:
    views = []
    for name, record in run.passes.items():
        reference, reference_name = (run.solo, "solo") if name == "cold" else (run.passes["cold"].outputs, "cold")
        views.append(PassView(
            run.workload.name, name, record.outputs, golden.passes["cold"].outputs,
            {r.rid: r.max_new_tokens for r in run.workload.requests}, _expected(run, name),
            record.nan_events, record.audit, run.dtype, run.deterministic, run.hybrid, reference, reference_name,
            spec_golden.passes["cold"].outputs if spec_golden else None, run.num_draft_tokens + 1,
            run.aborts_allowed, run.spec, {r.rid: r.prompt for r in run.workload.requests},
            accept_band(run.workload.name, run.model, run.spec, run.num_draft_tokens), record.counters or None,
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
        "preemptions": sum(r.stats.preemptions for r in runs),
        **_spec_metrics(runs),
        **_pd_metrics(runs),
        "golden_reused": len(own_runs) < len(runs),
    }


def _pd_metrics(runs: list[WorkloadRun]) -> dict[str, object]:
    """PD cells: what crossed (summed over workloads), the move gate's refusals and each side's verify scratch."""
    counters = [r.pd for r in runs if r.pd is not None]
    if not counters:
        return {}
    summed = {key: sum(c[key] for c in counters) for key, value in counters[0].items() if isinstance(value, int)}
    scratch = {side: max(c["verify_scratch_bytes"][side] for c in counters) for side in ("prefill", "decode")}
    return {"pd": {**summed, "verify_scratch_bytes": scratch}}


def _spec_metrics(runs: list[WorkloadRun]) -> dict[str, object]:
    """Accept length over both passes of every workload, decode tokens per target forward, draft-state hits."""
    outputs = [o for r in runs for p in r.passes.values() for o in p.outputs]
    stats = outputs_accept_stats(outputs)
    forwards = sum(r.stats.decode_forwards for r in runs)
    return {
        "mean_accept_length": stats.to_json()["mean_accept_length"],
        "accept": stats.to_json(),
        "decode_tokens_per_forward": round(sum(r.stats.emitted_tokens for r in runs) / forwards, 4) if forwards else None,
        "draft_full_hits": sum(r.stats.draft_full_hits for r in runs),
        "draft_partial_hits": sum(r.stats.draft_partial_hits for r in runs),
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
    result = CellResult(plan.cell_id, plan.matrix, levels, "pass", faults=sorted(faults))
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
