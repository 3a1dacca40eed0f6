"""cache=host: write policies, a bounded L2, bitwise load-back of every pool a page spans, per-tier cached_tokens."""
from __future__ import annotations

import copy

import pytest
import torch

from fixtures.workloads import CachedExpectation, load_workload
from harness.oracles.cached_tokens import judge as cached_tokens_oracle
from harness.run.serve import run_workload
from reference_impl.cache.host_cache import HostCache, WriteBackHostCache
from reference_impl.cache.radix import MatchResult
from reference_impl.config import DENSE, HYBRID
from reference_impl.memory.host import PageMover
from reference_impl.memory.static import StaticPools
from tests.harness.oracles.test_oracles import output, view


def cache_with_pool(
    cls: type, model=DENSE, pages: int = 8, host_pages: int | None = None
) -> tuple[HostCache, StaticPools]:
    pools = StaticPools(model, page_size=2, num_pages=pages, num_state_slots=4)
    free_state = (lambda slot: pools.free_state_slots([slot])) if model.is_hybrid else None
    cache = cls(2, pools.free_pages, free_state)
    cache.attach(PageMover(pools, 2, len(model.attention_layers), [], len(model.mamba_layers)), host_pages)
    return cache, pools


def hit(cache: HostCache, tokens: list[int]) -> MatchResult:
    """Match, then commit the load-back, as the engine does once the request fits."""
    return cache.load_back(tokens, cache.match_prefix(tokens))


def fill(pools: StaticPools, pages: list[int], value: float) -> None:
    for layer in range(pools._k.shape[0]):
        k, v = pools.kv_views(layer)
        for i, page in enumerate(pages):
            k[page] = value + i
            v[page] = -value - i


@pytest.mark.parametrize("cls, saved_on_insert", [(HostCache, 2), (WriteBackHostCache, 0)])
def test_write_policy_decides_when_l2_gets_a_copy(cls: type, saved_on_insert: int) -> None:
    cache, pools = cache_with_pool(cls)
    pages = pools.alloc_pages(2)
    cache.insert([1, 2, 3, 4], pages)
    assert len(cache.host) == saved_on_insert
    cache.evict(2)
    assert len(cache.host) == 2 and cache.cached_pages() == 0


@pytest.mark.parametrize("cls", [HostCache, WriteBackHostCache])
def test_evicted_pages_load_back_bitwise(cls: type) -> None:
    cache, pools = cache_with_pool(cls)
    pages = pools.alloc_pages(2)
    fill(pools, pages, 3.0)
    before = [pools.kv_views(0)[0][p].clone() for p in pages]
    cache.insert([1, 2, 3, 4], pages)
    cache.evict(2)
    fill(pools, list(range(8)), 0.0)
    match = hit(cache, [1, 2, 3, 4, 5])
    assert match.matched_tokens == 4 and match.host_tokens == 4
    assert all(torch.equal(pools.kv_views(0)[0][p], b) for p, b in zip(match.pages, before))
    cache.check_integrity()
    assert pools.num_free_pages + cache.cached_pages() == 8


def test_hybrid_load_back_restores_the_snapshot() -> None:
    cache, pools = cache_with_pool(HostCache, HYBRID)
    pages, slot = pools.alloc_pages(2), pools.alloc_state_slot()
    conv, ssm = pools.state_views(0)
    conv[slot], ssm[slot] = 7.0, 8.0
    cache.insert([1, 2, 3, 4], pages, {4: slot})
    cache.evict(2)
    match = hit(cache, [1, 2, 3, 4, 5])
    assert match.host_tokens == 4 and match.state_slot is not None
    assert torch.all(pools.state_views(0)[0][match.state_slot] == 7.0)
    assert torch.all(pools.state_views(0)[1][match.state_slot] == 8.0)


def test_load_back_fails_cleanly_when_l1_has_no_room() -> None:
    cache, pools = cache_with_pool(HostCache, pages=2)
    pages = pools.alloc_pages(2)
    cache.insert([1, 2, 3, 4], pages)
    cache.evict(2)
    held = pools.alloc_pages(2)
    assert hit(cache, [1, 2, 3, 4, 5]).matched_tokens == 0
    pools.free_pages(held)
    assert pools.num_free_pages == 2


def test_a_match_plans_the_load_back_and_moves_nothing() -> None:
    cache, pools = cache_with_pool(HostCache)
    cache.insert([1, 2, 3, 4], pools.alloc_pages(2))
    cache.evict(2)
    free = pools.num_free_pages
    match = cache.match_prefix([1, 2, 3, 4, 5])
    assert match.matched_tokens == 0 and match.pending is not None
    assert pools.num_free_pages == free and cache.cached_pages() == 0  # a request that then does not fit costs nothing
    assert cache.load_back([1, 2, 3, 4, 5], match).host_tokens == 4


def test_a_plan_whose_l1_pages_went_before_the_commit_keeps_l1s_hit() -> None:
    cache, pools = cache_with_pool(HostCache, HYBRID)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    cache.insert(tokens, pools.alloc_pages(4), {4: pools.alloc_state_slot(), 8: pools.alloc_state_slot()})
    cache.evict(4)  # pages and both snapshots now in L2 only
    cache.insert(tokens, pools.alloc_pages(4), {4: pools.alloc_state_slot()})  # back in L1, no snapshot at 8
    match = cache.match_prefix(tokens + [9])
    assert match.matched_tokens == 4 and match.pending.end == 8  # L1 pages to 8, L2's snapshot at 8
    cache.lock(match.node)
    cache.evict(2)  # the unlocked pages 4..8 the plan counted on go, as the engine's reserve may make them
    assert cache.load_back(tokens + [9], match) is match
    cache.unlock(match.node)
    cache.check_integrity()


def test_l2_pressure_loses_the_oldest_evicted_prefix() -> None:
    cache, pools = cache_with_pool(HostCache, pages=4, host_pages=2)
    cache.insert([1, 2, 3, 4], pools.alloc_pages(2))
    cache.evict(2)
    cache.insert([5, 6, 7, 8], pools.alloc_pages(2))  # L2 drops [1..4] to keep [5..8]
    assert hit(cache, [1, 2, 3, 4, 5]).matched_tokens == 0
    cache.evict(2)
    assert hit(cache, [5, 6, 7, 8, 9]).host_tokens == 4
    cache.check_integrity()


@pytest.mark.parametrize("model, spec, pool, cache", [
    ("dense", "draft", "unified", "host"),
    ("hybrid", "mtp", "static", "host"),
    ("hybrid", "draft", "unified", "reference_impl.cache.host_cache:WriteBackHostCache"),
])
def test_warm_pass_from_l2_matches_the_cold_pass_bitwise(model: str, spec: str, pool: str, cache: str) -> None:
    levels = {"cache": cache, "model": model, "spec": spec, "pool": pool, "page_size": 16}
    workload = load_workload("spill_host")
    run = run_workload(levels, workload, frozenset())
    cold, warm = ({o.rid: o for o in run.passes[p].outputs} for p in ("cold", "warm"))
    assert all(warm[r].tokens == cold[r].tokens and warm[r].logprobs == cold[r].logprobs for r in cold)
    tails = workload.tails
    assert {(warm[r].cached_device, warm[r].cached_host) for r in tails} == {(32, 16)}  # head in L1, tail from L2
    assert not run.passes["warm"].audit


def test_cached_tokens_oracle_checks_the_tier_split() -> None:
    out = output("a", [1, 2], cached=48)
    out.cached_device, out.cached_host = 32, 16
    expected = {"a": CachedExpectation(48, 48, 16, host=16)}
    assert cached_tokens_oracle([view([out], expected_cached=expected)]).status == "pass"
    wrong_sum = copy.deepcopy(out)
    wrong_sum.cached_device = 48
    verdict = cached_tokens_oracle([view([wrong_sum], expected_cached=expected)])
    assert verdict.status == "fail" and "48 + host 16" in verdict.detail[0]["got"]
    from_l1 = copy.deepcopy(out)
    from_l1.cached_host, from_l1.cached_device = 0, 48
    verdict = cached_tokens_oracle([view([from_l1], expected_cached=expected)])
    assert verdict.status == "fail" and verdict.detail[0]["expected"] == "48 (host 16)" and verdict.detail[0]["got"] == "48"
    free_split = {"a": CachedExpectation(0, 48, 16, host=None, storage=None)}
    assert cached_tokens_oracle([view([from_l1], expected_cached=free_split)]).status == "pass"
