"""Cell levels → EngineConfig: the factor defaults and the per-workload pool sizing."""
from __future__ import annotations

from collections.abc import Mapping

from fixtures.workloads import Workload
from reference_impl import registry
from reference_impl.config import EngineConfig
from reference_impl.engine.llm_engine import Engine
from reference_impl.pd.disagg import DisaggEngine

#: level of every engine factor a matrix leaves out.
DEFAULT_LEVELS: dict[str, object] = {
    "model": "dense",
    "scheduler": "fcfs",
    "cache": "off",
    "pool": "static",
    "backend": "torch",
    "page_size": 1,
    "prefill_budget": 128,
    "deterministic": "on",
    "poison": "off",
    "spec": "none",
    "num_draft_tokens": 3,
    "store": "file",
    "pd": "off",
    "pd_staging": "off",
    "decode_tp": 1,
    "pd_fail_rate": 0.0,
}

STATE_SLOTS = 256
STATE_INTERVAL = 32


def engine_levels(levels: Mapping[str, object]) -> dict[str, object]:
    """The full level assignment: defaults overridden by ``levels``."""
    return {**DEFAULT_LEVELS, **levels}


def build_engine_config(
    levels: Mapping[str, object], workload: Workload, faults: frozenset[str], device: str = "cpu"
) -> EngineConfig:
    """Resolve every factor through the registry and size the pools for ``workload`` on ``device``."""
    full = engine_levels(levels)
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
