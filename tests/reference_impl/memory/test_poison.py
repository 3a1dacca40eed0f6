"""NaN poison: start-up fill, re-poison on free, zero on issue, the no-zero fault, and zero cost when off."""
from __future__ import annotations

from functools import partial

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fixtures.workloads import load_workload
from reference_impl.config import HYBRID
from reference_impl.memory.poison import NAN_PATTERNS, UnsupportedPoisonDtypeError, nan_fill, poison_
from reference_impl.memory.static import StaticPools
from reference_impl.memory.unified import UnifiedPool

POOLS = {"static": StaticPools, "unified": UnifiedPool}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
NO_ZERO = "unified_no_zero_on_issue"


class TensorOps(TorchDispatchMode):
    """Records every aten op run inside the block: how "no extra work" is measured."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch's signature)
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def make_pool(kind: str, **kwargs: object) -> StaticPools | UnifiedPool:
    return POOLS[kind](HYBRID, **{"page_size": 4, "num_pages": 6, "num_state_slots": 4, **kwargs})


def all_views(pool: StaticPools | UnifiedPool) -> list[torch.Tensor]:
    """Every K, V, conv and SSM view of the pool."""
    return [v for layer in range(2) for v in (*pool.kv_views(layer), *pool.state_views(layer))]


def physical(pool: StaticPools | UnifiedPool, page: int) -> int:
    return int(pool.to_physical(torch.tensor([page * pool.page_size]))) // pool.page_size


@pytest.mark.parametrize("dtype", list(NAN_PATTERNS))
def test_each_pattern_is_a_nan_of_its_dtype(dtype: torch.dtype) -> None:
    int_dtype, pattern = nan_fill(dtype)
    t = poison_(torch.zeros(3, dtype=dtype))
    assert bool(t.float().isnan().all())
    assert t.view(int_dtype).tolist() == [pattern] * 3
    assert nan_fill(torch.bfloat16)[1] == 0x7FC1  # SGLang's pattern, kept so dumps compare


def test_integer_dtypes_are_refused_by_name() -> None:
    with pytest.raises(UnsupportedPoisonDtypeError, match="torch.int32"):
        poison_(torch.zeros(2, dtype=torch.int32))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", POOLS)
def test_poison_fills_every_buffer_at_start_up(kind: str, dtype: torch.dtype) -> None:
    poisoned, clean = make_pool(kind, dtype=dtype, poison=True), make_pool(kind, dtype=dtype)
    assert all(bool(v.isnan().all()) for v in all_views(poisoned))
    assert all(bool((v == 0).all()) for v in all_views(clean))
    if kind == "unified":  # every byte, gaps included
        int_dtype, pattern = nan_fill(dtype)
        assert bool((poisoned.buffer.view(int_dtype) == pattern).all())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", POOLS)
def test_freed_pages_and_slots_are_poisoned_again(kind: str, dtype: torch.dtype) -> None:
    pool = make_pool(kind, dtype=dtype, poison=True)
    pages, slots = pool.alloc_pages(2), [pool.alloc_state_slot() for _ in range(2)]
    phys_pages, phys_slots = [physical(pool, p) for p in pages], pool.to_physical_state(slots)
    for view in all_views(pool):
        view.fill_(1.0)
    pool.free_pages(pages[:1])
    pool.free_state_slots(slots[:1])
    kv = [v for layer in range(2) for v in pool.kv_views(layer)]
    states = [v for layer in range(2) for v in pool.state_views(layer)]
    assert all(bool(v[phys_pages[0]].isnan().all()) for v in kv)  # a stale read of the freed page sees NaN
    assert all(bool(v[phys_slots[0]].isnan().all()) for v in states)
    assert all(bool((v[phys_pages[1]] == 1).all()) for v in kv)  # the live page is untouched
    assert all(bool((v[phys_slots[1]] == 1).all()) for v in states)


@pytest.mark.parametrize("kind", POOLS)
def test_freeing_nothing_is_fine_under_poison(kind: str) -> None:
    """The engine frees empty lists (a dense model's state slots, a request whose pages are all cached)."""
    pool = make_pool(kind, poison=True)
    pool.free_pages([])
    pool.free_state_slots([])
    pool.check_integrity()


@pytest.mark.parametrize("kind", POOLS)
def test_issued_pages_read_zero_under_poison(kind: str) -> None:
    pool = make_pool(kind, poison=True)
    first = pool.alloc_pages(6)
    for view in all_views(pool):
        view.fill_(1.0)
    pool.free_pages(first[2:4])
    again = pool.alloc_pages(2)
    kv = [v for layer in range(2) for v in pool.kv_views(layer)]
    for page in [*first[:2], *first[4:]]:
        assert all(bool((v[physical(pool, page)] == 1).all()) for v in kv), "issuing zeroed a page it did not issue"
    for page in again:
        assert all(bool((v[physical(pool, page)] == 0).all()) for v in kv)


def test_unified_pool_zeroes_issued_pages_without_poison_too() -> None:
    pool = make_pool("unified")
    pages = pool.alloc_pages(6)
    for view in all_views(pool):
        view.fill_(1.0)
    pool.free_pages(pages[:1])
    (page,) = pool.alloc_pages(1)
    assert all(bool((v[physical(pool, page)] == 0).all()) for layer in range(2) for v in pool.kv_views(layer))


@pytest.mark.parametrize("kind", POOLS)
def test_no_zero_fault_leaves_nan_only_in_the_unified_pool(kind: str) -> None:
    pool = make_pool(kind, poison=True, faults=frozenset({NO_ZERO}))
    (page,) = pool.alloc_pages(1)
    k = torch.ones(1, 2, 16)
    pool.write_kv(0, pool.to_physical(torch.tensor([page * 4])), k, k)  # one token of a four-token page
    k_view, v_view = pool.kv_views(0)
    p = physical(pool, page)
    assert bool((k_view[p, 0] == 1).all())
    tail = torch.cat([k_view[p, 1:], v_view[p, 1:]])
    assert bool(tail.isnan().all()) if kind == "unified" else bool((tail == 0).all())


@pytest.mark.parametrize("kind", POOLS)
def test_poison_off_does_no_tensor_work_on_alloc_and_free(kind: str) -> None:
    """Off: the alloc/free paths run no tensor op at all (the unified pool's zero-on-issue aside)."""
    recorded = {}
    for poison in (False, True):
        pool = make_pool(kind, poison=poison, faults=frozenset({NO_ZERO}))  # the fault keeps issue free of work
        with TensorOps() as ops:
            pages = pool.alloc_pages(3)
            pool.free_pages(pages[1:])
            pool.free_state_slots([pool.alloc_state_slot()])
        recorded[poison] = ops.ops
    assert recorded[False] == []
    assert any("index_fill_" in op for op in recorded[True])  # the recorder does see the poison work


@pytest.mark.parametrize("model", ["dense", "hybrid"])
@pytest.mark.parametrize("kind", POOLS)
def test_poison_changes_no_token_of_a_correct_engine(make_engine, kind: str, model: str) -> None:
    """Prefix cache, tight pool (eviction and preemption): poisoned pools serve exactly what clean ones do, with no NaN."""
    wl = load_workload("spec_preempt")
    tokens = []
    for poison in (False, True):
        pool = partial(POOLS[kind], poison=poison)
        engine = make_engine(wl, model=model, page_size=16, cache="device", overrides={"pool": pool, "num_pages": 8})
        outs = [o for _ in range(2) for o in engine.generate(wl.requests)]
        assert engine.audit() == [] and not engine.nan_events
        assert engine.cache.evicted_pages > 0 and engine.stats.preemptions > 0  # the pool really is tight
        tokens.append({(o.rid, o.cached_tokens): o.tokens for o in outs})
    assert tokens[0] == tokens[1]

