"""What the child counts inside vLLM's scheduler: placeholder drafts (the padding no proposer made) told apart from a
proposer's, nothing where the engine core is elsewhere or schedules asynchronously, evictions only when one happened.
A stand-in engine core: the functions read attributes alone (the real engine:
tests/harness/sut/vllm/test_spec_padding.py)."""
from __future__ import annotations

from types import SimpleNamespace

from harness.sut.vllm.counts import count_evictions, count_placeholders


def engine(steps: list[dict[str, list[int]]], async_scheduling: bool = False) -> SimpleNamespace:
    """An LLM whose scheduler's ``schedule`` returns ``steps`` in turn (request id → scheduled drafts)."""
    outputs = iter(steps)
    scheduler = SimpleNamespace(
        scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
        schedule=lambda: SimpleNamespace(scheduled_spec_decode_tokens=next(outputs)),
        kv_cache_manager=SimpleNamespace(block_pool=SimpleNamespace(_maybe_evict_cached_block=lambda block: block)))
    core = SimpleNamespace(scheduler=scheduler)
    return SimpleNamespace(llm_engine=SimpleNamespace(engine_core=SimpleNamespace(engine_core=core)))


def test_placeholder_drafts_are_counted_apart_from_a_proposers() -> None:
    llm = engine([{"a": [-1, -1, -1], "b": [7, 9, 4]}, {}, {"a": [5, -1, 2], "c": []}, {"b": [-1, -1, -1]}])
    counted = count_placeholders(llm)
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    for _ in range(4):
        scheduler.schedule()
    assert counted == [2, 6]  # a's first step and b's last: every draft -1; a drafted -1 among real tokens is not


def test_nothing_is_counted_where_it_cannot_be_seen() -> None:
    assert count_placeholders(SimpleNamespace(llm_engine=SimpleNamespace())) is None  # the core in another process
    assert count_placeholders(engine([], async_scheduling=True)) is None  # every draft a placeholder until filled


def test_an_eviction_is_counted_when_the_pool_evicts() -> None:
    llm = engine([])
    counted = count_evictions(llm)
    pool = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
    assert [pool._maybe_evict_cached_block(done) for done in (True, False, True)] == [True, False, True]
    assert counted == [2]
