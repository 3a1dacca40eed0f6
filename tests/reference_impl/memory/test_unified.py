"""Unified pool: random alloc / write / free / compact sequences keep every live byte, plus layout checks."""
from __future__ import annotations

from functools import partial

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from fixtures.workloads import load_workload
from reference_impl.config import DENSE, HYBRID, ModelConfig
from reference_impl.memory.static import PoolIntegrityError, StaticPools
from reference_impl.memory.unified import LAZY_HOLE_FRACTION, EagerUnifiedPool, UnifiedPool, UnmappedIdError

NUM_PAGES, NUM_SLOTS = 6, 4
SEEDS = st.integers(0, 2**16)


def physical_page(pool: UnifiedPool, page: int) -> int:
    """The physical page behind virtual ``page``, read through the public token-slot translation."""
    return int(pool.to_physical(torch.tensor([page * pool.page_size]))) // pool.page_size


def make_machine(model: ModelConfig, compaction: str, page_size: int) -> type[RuleBasedStateMachine]:
    """A state machine over one pool geometry; poison is drawn per run."""
    n_attn, n_mamba = len(model.attention_layers), len(model.mamba_layers)
    kv_shape = (n_attn, 2, page_size, model.num_kv_heads, model.head_dim)
    state_shapes = (model.mamba.conv_state_shape(), model.mamba.ssm_state_shape())

    class UnifiedPoolMachine(RuleBasedStateMachine):
        """Model: live virtual page → expected envelope; live virtual slot → expected state per layer (None: unwritten)."""

        @initialize(poison=st.booleans())
        def build(self, poison: bool) -> None:
            self.poison = poison
            self.pool = UnifiedPool(model, page_size=page_size, num_pages=NUM_PAGES, num_state_slots=NUM_SLOTS,
                                    compaction=compaction, poison=poison)
            self.pages: dict[int, torch.Tensor] = {}
            self.slots: dict[int, list[tuple[torch.Tensor, torch.Tensor] | None]] = {}
            self.issued: set[int] = set()

        @rule(n=st.integers(0, 3), fill=st.booleans(), seed=SEEDS)
        def alloc_pages(self, n: int, fill: bool, seed: int) -> None:
            free = self.pool.num_free_pages
            got = self.pool.alloc_pages(n)
            if n > free:
                assert got is None and self.pool.num_free_pages == free
                return
            assert got is not None and len(set(got)) == n and not set(got) & set(self.pages)
            for page in got:
                self.pages[page] = torch.zeros(kv_shape)  # issued pages read zero
            self.issued.update(got)
            if fill and got:
                slots = [p * page_size + o for p in got for o in range(page_size)]
                for layer in range(n_attn):
                    self._write_kv(layer, slots, seed + layer)

        @precondition(lambda self: self.pages)
        @rule(data=st.data(), seed=SEEDS)
        def write_kv(self, data: st.DataObject, seed: int) -> None:
            live = [p * page_size + o for p in sorted(self.pages) for o in range(page_size)]
            slots = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=5, unique=True))
            padded = data.draw(st.permutations([*slots, *[-1] * data.draw(st.integers(0, 2))]))
            self._write_kv(data.draw(st.integers(0, n_attn - 1)), padded, seed)

        def _write_kv(self, layer: int, slots: list[int], seed: int) -> None:
            """Random K/V for virtual token ``slots`` (-1: padding) through the handoff, as the model does."""
            gen = torch.Generator().manual_seed(seed)
            k, v = (torch.randn(len(slots), *kv_shape[3:], generator=gen) for _ in range(2))
            self.pool.write_kv(layer, self.pool.to_physical(torch.tensor(slots)), k, v)
            for i, slot in enumerate(slots):
                if slot >= 0:
                    self.pages[slot // page_size][layer, :, slot % page_size] = torch.stack([k[i], v[i]])

        @rule(fill=st.booleans(), seed=SEEDS)
        def alloc_slot(self, fill: bool, seed: int) -> None:
            slot = self.pool.alloc_state_slot()
            assert (slot is None) == (len(self.slots) == NUM_SLOTS)
            if slot is not None:
                assert slot not in self.slots
                self.slots[slot] = [None] * n_mamba
                if fill:
                    for layer in range(n_mamba):
                        self._write_state(layer, [slot], seed + layer)

        @precondition(lambda self: self.slots and n_mamba)
        @rule(data=st.data(), seed=SEEDS)
        def write_state(self, data: st.DataObject, seed: int) -> None:
            how = data.draw(st.sampled_from(["views", "zero_state", "copy_state"]))
            src, dst = (data.draw(st.sampled_from(sorted(self.slots))) for _ in range(2))
            if how == "zero_state":
                self.pool.zero_state(dst)
                self.slots[dst] = [tuple(torch.zeros(s) for s in state_shapes) for _ in range(n_mamba)]
            elif how == "copy_state":
                self.pool.copy_state(src, dst)
                self.slots[dst] = list(self.slots[src])
            else:
                slots = data.draw(st.lists(st.sampled_from(sorted(self.slots)), min_size=1, max_size=3, unique=True))
                self._write_state(data.draw(st.integers(0, n_mamba - 1)), slots, seed)

        def _write_state(self, layer: int, slots: list[int], seed: int) -> None:
            """Random conv/SSM states for virtual ``slots``, batched through the handoff as a decode step does."""
            gen = torch.Generator().manual_seed(seed)
            new = [torch.randn(len(slots), *shape, generator=gen) for shape in state_shapes]
            for view, values in zip(self.pool.state_views(layer), new):
                view[self.pool.to_physical_state(slots)] = values
            for i, slot in enumerate(slots):
                self.slots[slot][layer] = (new[0][i], new[1][i])

        @precondition(lambda self: self.pages)
        @rule(data=st.data())
        def free_pages(self, data: st.DataObject) -> None:
            pages = data.draw(st.lists(st.sampled_from(sorted(self.pages)), min_size=1, max_size=2, unique=True))
            dead = sorted(set(range(NUM_PAGES)) - set(self.pages))
            if dead and data.draw(st.sampled_from([False, False, False, True])):
                page = data.draw(st.sampled_from(dead))
                with pytest.raises(PoolIntegrityError, match=f"page {page} freed"):
                    self.pool.free_pages([*pages, page])  # refused whole: not even the live ones are freed
                return
            self.pool.free_pages(pages)
            for page in pages:
                del self.pages[page]

        @precondition(lambda self: self.slots)
        @rule(data=st.data())
        def free_slots(self, data: st.DataObject) -> None:
            slots = data.draw(st.lists(st.sampled_from(sorted(self.slots)), min_size=1, max_size=2, unique=True))
            self.pool.free_state_slots(slots)
            for slot in slots:
                del self.slots[slot]

        @precondition(lambda self: self.pages or self.slots)
        @rule()
        def compact(self) -> None:
            self.pool.compact()

        @rule(page=st.integers(0, NUM_PAGES - 1), offset=st.integers(0, page_size - 1))
        def translate(self, page: int, offset: int) -> None:
            slots = torch.tensor([-1, page * page_size + offset, -1])
            if page not in self.issued:
                with pytest.raises(UnmappedIdError, match=f"virtual page {page}"):
                    self.pool.to_physical(slots)
                return
            phys = self.pool.to_physical(slots)
            assert phys[0] == phys[2] == -1 and int(phys[1]) % page_size == offset
            if page in self.pages:
                k_view, v_view = self.pool.kv_views(0)
                p = int(phys[1]) // page_size
                assert torch.equal(torch.stack([k_view[p, offset], v_view[p, offset]]), self.pages[page][0, :, offset])

        @invariant()
        def pool_matches_model(self) -> None:
            self.pool.check_integrity()
            assert self.pool.num_free_pages == NUM_PAGES - len(self.pages)
            assert self.pool.num_free_state_slots == NUM_SLOTS - len(self.slots)
            live_physical = {physical_page(self.pool, page): page for page in self.pages}
            for p, page in live_physical.items():
                for layer in range(n_attn):
                    got = torch.stack([view[p] for view in self.pool.kv_views(layer)])
                    assert torch.equal(got, self.pages[page][layer]), f"virtual page {page} (physical {p}) layer {layer}"
            if compaction == "eager":
                assert set(live_physical) == set(range(NUM_PAGES - len(self.pages), NUM_PAGES)), "live pages not dense"
            if self.poison:
                for p in set(range(NUM_PAGES)) - set(live_physical):
                    assert all(bool(view[p].isnan().all()) for layer in range(n_attn) for view in self.pool.kv_views(layer))

        @invariant()
        def states_match_model(self) -> None:
            for slot, layers in self.slots.items():
                (p,) = self.pool.to_physical_state([slot])
                for layer, expected in enumerate(layers):
                    if expected is not None:
                        got = [view[p] for view in self.pool.state_views(layer)]
                        assert all(map(torch.equal, got, expected)), f"virtual slot {slot} (physical {p}) layer {layer}"
            if self.poison and n_mamba:
                live = set(self.pool.to_physical_state(sorted(self.slots)))
                for p in set(range(NUM_SLOTS)) - live:
                    assert all(bool(v[p].isnan().all()) for layer in range(n_mamba) for v in self.pool.state_views(layer))

    return UnifiedPoolMachine


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("compaction", ["eager", "lazy"])
@pytest.mark.parametrize("model", [DENSE, HYBRID], ids=["dense", "hybrid"])
def test_random_operations_keep_every_live_byte(model: ModelConfig, compaction: str, page_size: int) -> None:
    run_state_machine_as_test(
        make_machine(model, compaction, page_size),
        settings=settings(max_examples=30, stateful_step_count=50, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )


def hybrid_pool(**kwargs: object) -> UnifiedPool:
    return UnifiedPool(HYBRID, **{"page_size": 16, "num_pages": 8, "num_state_slots": 4, **kwargs})


@pytest.mark.parametrize("num_pages", [2, 8])
def test_physical_differs_from_virtual_from_the_first_alloc(num_pages: int) -> None:
    pool = hybrid_pool(num_pages=num_pages)
    assert pool.alloc_pages(1) == [0] and physical_page(pool, 0) != 0
    pages = [0, *pool.alloc_pages(num_pages - 1)]
    assert all(physical_page(pool, page) != page for page in pages)  # an even-sized pool has no fixed point
    slot = pool.alloc_state_slot()
    assert pool.to_physical_state([slot]) != [slot]


def test_issued_pages_read_zero_even_after_poison_and_reuse() -> None:
    pool = hybrid_pool(poison=True)
    pages = pool.alloc_pages(8)
    assert all(bool((view == 0).all()) for layer in range(2) for view in pool.kv_views(layer))
    k = torch.randn(16, 2, 16)
    pool.write_kv(1, pool.to_physical(torch.arange(16) + 16 * pages[3]), k, k)
    pool.free_pages([pages[3]])
    (again,) = pool.alloc_pages(1)
    p = physical_page(pool, again)
    assert all(bool((view[p] == 0).all()) for layer in range(2) for view in pool.kv_views(layer))


@pytest.mark.parametrize("fault", [False, True])
def test_no_zero_on_issue_fault_leaves_poison_in_the_tail(fault: bool) -> None:
    pool = hybrid_pool(poison=True, faults=frozenset({"unified_no_zero_on_issue"} if fault else ()))
    (page,) = pool.alloc_pages(1)
    k = torch.randn(1, 2, 16)
    pool.write_kv(0, pool.to_physical(torch.tensor([page * 16])), k, k)
    k_view, v_view = pool.kv_views(0)
    p = physical_page(pool, page)
    assert torch.equal(k_view[p, 0], k[0])
    tail = torch.cat([k_view[p, 1:], v_view[p, 1:]])
    assert bool(tail.isnan().all()) if fault else bool((tail == 0).all())


def test_views_are_strided_views_into_the_one_byte_buffer() -> None:
    pool = hybrid_pool()
    start, end = pool.buffer.data_ptr(), pool.buffer.data_ptr() + pool.buffer.numel()
    views = [v for layer in range(2) for v in (*pool.kv_views(layer), *pool.state_views(layer))]
    for view in views:
        last = view.data_ptr() + sum((n - 1) * s for n, s in zip(view.shape, view.stride())) * view.element_size()
        assert start <= view.data_ptr() and last < end
        assert view.untyped_storage().data_ptr() == start
    k_view, _ = pool.kv_views(1)
    k_view[5, 3, 1, 7] = 2.5
    _, ssm = pool.state_views(1)
    ssm[2, 4, 5, 6] = -1.5
    lay, typed = pool.layout, pool.buffer.view(torch.float32)
    assert typed[5 * lay.envelope + lay.kv_offset(1, 0) + (3 * 2 + 1) * 16 + 7] == 2.5  # the documented formula
    assert typed[lay.state_base + 2 * lay.slot + lay.state_offset(1, 1) + (4 * 16 + 5) * 16 + 6] == -1.5


def test_eager_compaction_keeps_live_pages_dense_and_lazy_waits() -> None:
    eager, lazy = hybrid_pool(compaction="eager"), hybrid_pool(compaction="lazy")
    for pool in (eager, lazy):
        pool.alloc_pages(8)
        pool.free_pages([0, 2, 5])
    assert sorted(physical_page(eager, p) for p in (1, 3, 4, 6, 7)) == [3, 4, 5, 6, 7]
    assert sorted(physical_page(lazy, p) for p in (1, 3, 4, 6, 7)) == [0, 1, 3, 4, 6]
    assert lazy.compact() == 2 and eager.compact() == 0
    assert sorted(physical_page(lazy, p) for p in (1, 3, 4, 6, 7)) == [3, 4, 5, 6, 7]


def test_lazy_compaction_runs_at_alloc_once_holes_pass_the_threshold() -> None:
    pool = hybrid_pool(num_pages=8)
    pool.alloc_pages(8)
    holes = int(LAZY_HOLE_FRACTION * 8) + 1
    pool.free_pages(range(holes))  # the first pages sit at the top: freeing them leaves holes below the span
    assert pool.pages.holes() == holes
    pool.alloc_pages(0)
    assert pool.pages.holes() == 0


def test_bad_arguments_name_the_input() -> None:
    with pytest.raises(ValueError, match="compaction='sometimes'"):
        hybrid_pool(compaction="sometimes")
    pool = hybrid_pool()
    with pytest.raises(UnmappedIdError, match="token slot 128"):
        pool.to_physical(torch.tensor([128]))
    with pytest.raises(UnmappedIdError, match="state slot 9"):
        pool.to_physical_state([9])


@pytest.mark.parametrize("unified", [UnifiedPool, EagerUnifiedPool])
def test_engine_on_the_unified_pool_matches_the_static_pool(make_engine, unified: type) -> None:
    """Hybrid, prefix cache, tight pool (eviction and preemption): same tokens, clean audit, no NaN under poison."""
    wl = load_workload("spec_preempt")
    tokens = []
    for pool in (StaticPools, partial(unified, poison=True)):
        engine = make_engine(wl, model="hybrid", page_size=16, cache="device", overrides={"pool": pool, "num_pages": 8})
        outs = [o for _ in range(2) for o in engine.generate(wl.requests)]
        assert engine.audit() == [] and not engine.nan_events
        assert engine.cache.evicted_pages > 0 and engine.stats.preemptions > 0  # the pool really is tight
        tokens.append({(o.rid, o.cached_tokens): o.tokens for o in outs})
    assert tokens[0] == tokens[1]
