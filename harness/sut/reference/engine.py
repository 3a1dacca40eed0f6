"""The reference data plane as a system under test: cell levels → EngineConfig (pools sized per workload) → engine.

One plain engine, or a prefill engine and a decode server behind the cell's PD transport; both
answer ``harness.sut.base.SystemUnderTest`` in the cell's own process.
"""
from __future__ import annotations

import tempfile
import uuid
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import replace

from fixtures.workloads import Workload
from harness.sut.base import CacheTraits, PassResult, SpecTraits, Totals, Traits
from harness.sut.reference import LEVELS
from harness.sut.rules import PagedPrefixCache
from reference_impl import registry
from reference_impl.cache.radix import NoCache
from reference_impl.cache.store.backends import FileStore
from reference_impl.config import EngineConfig
from reference_impl.engine.llm_engine import Engine, EngineStats
from reference_impl.pd.disagg import DisaggEngine
from reference_impl.request import RequestSpec

STATE_SLOTS = 256
STATE_INTERVAL = 32


def build_engine_config(
    levels: Mapping[str, object], workload: Workload, faults: frozenset[str], device: str = "cpu"
) -> EngineConfig:
    """Resolve every factor through the registry and size the pools for ``workload`` on ``device``."""
    full = LEVELS.full(levels)
    resolved = {factor: registry.resolve(factor, level) for factor, level in full.items()}
    page_size = resolved.pop("page_size")
    return EngineConfig(
        **resolved,
        page_size=page_size,
        num_pages=workload.num_pages(page_size),
        host_pages=workload.host_pages(page_size),
        num_state_slots=workload.state_slots or STATE_SLOTS,
        state_interval=STATE_INTERVAL,
        faults=faults,
        device=device,
    )


def make_engine(config: EngineConfig) -> Engine | DisaggEngine:
    """One engine, or a prefill engine and a decode server behind the cell's PD transport."""
    return DisaggEngine(config) if config.pd is not None else Engine(config)


#: the EngineStats counters the accept_length oracle recounts the accept accounting from.
DECODE_COUNTERS = ("decode_forwards", "emitted_tokens", "verify_steps", "verify_emitted")
#: the whole-run EngineStats counters a cell's metrics report.
TOTAL_COUNTERS = ("preemptions", "decode_forwards", "emitted_tokens", "draft_full_hits", "draft_partial_hits")
#: the reference's cache rule: its radix cache (reference_impl/cache/radix.py: whole pages of finished prompts, a
#: match of the prompt less its last token, LRU eviction of unlocked leaves) and its tiers, whose hits under pool
#: pressure the independent cache model (fixtures/workloads/cache_model.py) predicts exactly.
CACHE_RULE = PagedPrefixCache(model=True, name="the reference's radix cache (reference_impl/cache/radix.py) and its "
                                                "cache model (fixtures/workloads/cache_model.py)")


class ReferenceSystem:
    """One reference engine (plain or PD) behind the system-under-test protocol."""

    def __init__(self, config: EngineConfig, levels: Mapping[str, object]) -> None:
        self.engine = make_engine(config)
        self.traits = Traits(
            dtype=config.dtype, model=config.model.name, hybrid=config.model.is_hybrid,
            deterministic=config.deterministic,
            spec=SpecTraits(method=str(LEVELS.full(levels)["spec"]), k=config.num_draft_tokens),
            cache=CacheTraits(enabled=config.cache is not NoCache, page_size=config.page_size,
                              chunk_size=config.model.mamba.chunk_size, state_interval=config.state_interval,
                              tiers=tuple(self.engine.cache.lower_tiers), rule=CACHE_RULE),
            aborts_allowed=config.pd_fail_rate > 0, pd=config.pd is not None,
        )

    def serve(self, rounds: Sequence[Sequence[RequestSpec]]) -> PassResult:
        """The rounds one after the other, then the idle engine's audit."""
        seen, before = len(self.engine.nan_events), replace(self.engine.stats)
        outputs = [out for group in rounds for out in self.engine.generate(group)]
        ledger = self.engine.take_ledger().to_json() if isinstance(self.engine, DisaggEngine) else None
        return PassResult(outputs=outputs, nan_events=self.engine.nan_events[seen:], audit=self.engine.audit(),
                          counters=_counted(before, self.engine.stats, DECODE_COUNTERS), pd=ledger)

    def totals(self) -> Totals:
        pd = self.engine.counters() if isinstance(self.engine, DisaggEngine) else None
        return Totals(stats={name: getattr(self.engine.stats, name) for name in TOTAL_COUNTERS}, pd=pd)

    def close(self) -> None:
        self.engine.close()


def _counted(before: EngineStats, after: EngineStats, names: Sequence[str]) -> dict[str, int]:
    """What the engine counted between two snapshots of its stats."""
    return {name: getattr(after, name) - getattr(before, name) for name in names}


class ReferenceEngine:
    """The reference engine of one cell: nothing to bring up, a fresh configuration per workload."""

    def __init__(self, levels: Mapping[str, object], faults: frozenset[str], device: str) -> None:
        self.levels, self.faults, self.device = levels, faults, device

    def session(self, workload: Workload) -> ReferenceSession:
        return ReferenceSession(self.levels, workload, self.faults, self.device)

    def close(self) -> None:
        pass


class ReferenceSession:
    """The reference systems of one cell and workload: one config, a store namespace of the session's own.

    A shared Redis must not carry one run's prefixes into another's cold pass, hence the fresh tenant; an
    isolation workload on the file store gets one directory that every engine of the session shares.
    """

    def __init__(self, levels: Mapping[str, object], workload: Workload, faults: frozenset[str], device: str) -> None:
        self.levels = levels
        self._resources = ExitStack()
        config = replace(build_engine_config(levels, workload, faults, device), tenant=f"run-{uuid.uuid4().hex}")
        if workload.isolation and config.store_location is None and config.store is FileStore:
            location = self._resources.enter_context(tempfile.TemporaryDirectory(prefix="kvmatrix-shared-store-"))
            config = replace(config, store_location=location)
        self.config = config

    def open(self, *, tenant_suffix: str = "", alone: bool = False) -> ReferenceSystem:
        config = replace(self.config, tenant=self.config.tenant + tenant_suffix)
        if alone:
            config = replace(config, max_running=1, pd=None, tenant=f"solo-{config.tenant}")
        return ReferenceSystem(config, self.levels)

    def close(self) -> None:
        self._resources.close()
