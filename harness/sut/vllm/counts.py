"""What vLLM's scheduler does that its metrics do not count, counted inside the harness's child (``child.py``), where
the engine core runs in the child's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): cached blocks evicted to be
reused, and verify steps padded with placeholder drafts no proposer made. It imports nothing (the child loads it by
path, as a sibling); each counter is a list the wrapped method adds to, read between serves.
"""
from __future__ import annotations

from typing import Any


def count_evictions(llm: Any) -> list[int] | None:
    """A counter of the cached blocks vLLM evicts to reuse them (``BlockPool._maybe_evict_cached_block`` returning
    True, ``vllm/v1/core/block_pool.py``: vLLM counts none itself); None where the engine core is in another process."""
    try:
        pool = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
    except AttributeError:
        return None
    evicted, evict = [0], pool._maybe_evict_cached_block

    def counted(block: Any) -> bool:
        done = evict(block)
        evicted[0] += bool(done)
        return done

    pool._maybe_evict_cached_block = counted
    return evicted


def count_placeholders(llm: Any) -> list[int] | None:
    """The verify steps vLLM's scheduler fills with placeholder drafts, ``[-1] * k`` that no proposer made, and their
    tokens: the padding of a waiting request with one token left to compute (after a prefix-cache hit or a PD
    handoff; ``v1/core/sched/scheduler.py``, "Pad new decode requests to uniform spec decoding size",
    vllm-project/vllm#45237), which vLLM's counters count as a draft (open fix vllm-project/vllm#50518). None where
    the engine core is in another process, or schedules asynchronously (its drafts are placeholders until the worker
    fills them)."""
    try:
        scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    except AttributeError:
        return None
    if scheduler.scheduler_config.async_scheduling:
        return None
    counted, schedule = [0, 0], scheduler.schedule

    def counting(*args: Any, **kwargs: Any) -> Any:
        out = schedule(*args, **kwargs)
        for drafts in out.scheduled_spec_decode_tokens.values():
            if drafts and all(token == -1 for token in drafts):
                counted[0] += 1
                counted[1] += len(drafts)
        return out

    scheduler.schedule = counting
    return counted
