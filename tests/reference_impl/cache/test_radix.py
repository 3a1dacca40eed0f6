"""Tests for the L1 radix prefix cache: a stateful model check, plus unit tests of each contract."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from reference_impl.cache.radix import CacheIntegrityError, MatchResult, NoCache, RadixCache

TOTAL_PAGES = 40
TOTAL_SLOTS = 16
#: Page contents the sequences are built from; few, and sharing leading tokens, so prefixes
#: collide both at page boundaries and inside a page (which must not match).
VOCAB = {1: [(0,), (1,), (2,)], 4: [(0, 0, 0, 0), (0, 0, 0, 1), (1, 0, 0, 0)]}

page_picks = st.lists(st.integers(0, 2), min_size=1, max_size=5)
snapshot_picks = st.sets(st.integers(1, 5), max_size=3)


@dataclass
class Running:
    """A request between prefill and finish: it locks its hit and holds its own new pages and slots."""

    tokens: list[int]
    hit: MatchResult
    new_pages: list[int]
    snapshots: dict[int, int]


class RadixMachine(RuleBasedStateMachine):
    """Drive a RadixCache like an engine does and compare it with a dict model after every step."""

    page_size = 1
    hybrid = False

    def __init__(self) -> None:
        super().__init__()
        self.free_pages = set(range(TOTAL_PAGES))
        self.free_slots = set(range(TOTAL_SLOTS))
        self.ref_pages: dict[tuple[int, ...], int] = {}  # token prefix → tree page holding its last page
        self.ref_slots: dict[tuple[int, ...], int] = {}  # token prefix → tree snapshot valid at its end
        self.locks: list[MatchResult] = []
        self.running: list[Running] = []
        free_state = self._on_free_state if self.hybrid else None
        self.cache = RadixCache(self.page_size, self._on_free_pages, free_state)

    def _tokens(self, picks: list[int]) -> list[int]:
        return [t for i in picks for t in VOCAB[self.page_size][i]]

    def _locked_pages(self) -> set[int]:
        hits = self.locks + [r.hit for r in self.running]
        return {page for hit in hits for page in hit.pages}

    def _on_free_pages(self, pages: list[int]) -> None:
        locked = self._locked_pages()
        owned = {page: prefix for prefix, page in self.ref_pages.items()}
        for page in pages:
            assert page not in self.free_pages, f"tree freed page {page}, which is already free"
            assert page in owned, f"tree freed page {page}, which it never adopted"
            assert page not in locked, f"tree evicted page {page} on a locked path"
            del self.ref_pages[owned[page]]
            self.free_pages.add(page)

    def _on_free_state(self, slot: int) -> None:
        owned = {s: prefix for prefix, s in self.ref_slots.items()}
        assert slot not in self.free_slots, f"tree freed slot {slot}, which is already free"
        assert slot in owned, f"tree freed slot {slot}, which it never adopted"
        del self.ref_slots[owned[slot]]
        self.free_slots.add(slot)

    def _alloc_pages(self, n: int) -> list[int] | None:
        """Take ``n`` free pages, evicting the shortfall first as an engine would; None if impossible."""
        if len(self.free_pages) < n:
            self.cache.evict(n - len(self.free_pages))
        if len(self.free_pages) < n:
            return None
        pages = sorted(self.free_pages)[:n]
        self.free_pages.difference_update(pages)
        return pages

    def _alloc_snapshots(self, tokens: list[int], picks: set[int]) -> dict[int, int]:
        if not self.hybrid:
            return {}
        positions = sorted(p * self.page_size for p in picks if p * self.page_size <= len(tokens))
        slots = sorted(self.free_slots)[: len(positions)]
        self.free_slots.difference_update(slots)
        return dict(zip(positions, slots))

    def _kv_len(self, tokens: list[int]) -> int:
        n = 0
        while n + self.page_size <= len(tokens) and tuple(tokens[: n + self.page_size]) in self.ref_pages:
            n += self.page_size
        return n

    def _match(self, tokens: list[int]) -> MatchResult:
        """match_prefix, checked against the model: a cached prefix, its exact pages, its snapshot."""
        ps, kv = self.page_size, self._kv_len(tokens)
        expected, slot = kv, None
        if self.hybrid:
            ends = [p for p in range(ps, kv + 1, ps) if tuple(tokens[:p]) in self.ref_slots]
            expected = max(ends, default=0)
            slot = self.ref_slots.get(tuple(tokens[:expected]))
        hit = self.cache.match_prefix(tokens)
        assert hit.matched_tokens == expected, f"matched {hit.matched_tokens} of {tokens}, model says {expected}"
        pages = [self.ref_pages[tuple(tokens[:p])] for p in range(ps, expected + 1, ps)]
        assert hit.pages == pages, f"match of {tokens} gave pages {hit.pages}, model says {pages}"
        assert hit.state_slot == slot, f"match of {tokens} gave slot {hit.state_slot}, model says {slot}"
        return hit

    def _insert(self, tokens: list[int], pages: list[int], snapshots: dict[int, int]) -> None:
        """insert, checked against the model; adopt into the model and free what the tree handed back."""
        ps, kv = self.page_size, self._kv_len(tokens)
        prefixes = [tuple(tokens[:p]) for p in range(ps, len(tokens) + 1, ps)]
        unused_pages = [pages[i] for i in range(kv // ps) if pages[i] != self.ref_pages[prefixes[i]]]
        unused_slots = [s for p, s in sorted(snapshots.items()) if self.ref_slots.get(tuple(tokens[:p]), s) != s]
        result = self.cache.insert(tokens, pages, snapshots)
        assert result.existing_tokens == kv, f"insert of {tokens}: existing {result.existing_tokens}, model {kv}"
        assert result.unused_pages == unused_pages, f"unused pages {result.unused_pages}, model {unused_pages}"
        assert result.unused_slots == unused_slots, f"unused slots {result.unused_slots}, model {unused_slots}"
        for i in range(kv // ps, len(pages)):
            self.ref_pages[prefixes[i]] = pages[i]
        for pos, slot in snapshots.items():
            self.ref_slots.setdefault(tuple(tokens[:pos]), slot)
        assert not self.free_pages.intersection(unused_pages) and not self.free_slots.intersection(unused_slots)
        self.free_pages.update(unused_pages)
        self.free_slots.update(unused_slots)

    @rule(picks=page_picks, snaps=snapshot_picks)
    def insert_fresh(self, picks: list[int], snaps: set[int]) -> None:
        tokens = self._tokens(picks)
        pages = self._alloc_pages(len(picks))
        if pages is not None:
            self._insert(tokens, pages, self._alloc_snapshots(tokens, snaps))

    @rule(picks=page_picks, snaps=snapshot_picks)
    def start_request(self, picks: list[int], snaps: set[int]) -> None:
        tokens = self._tokens(picks)
        hit = self._match(tokens)
        self.cache.lock(hit.node)
        new_pages = self._alloc_pages(len(picks) - len(hit.pages))
        if new_pages is None:
            self.cache.unlock(hit.node)
            return
        self.running.append(Running(tokens, hit, new_pages, self._alloc_snapshots(tokens, snaps)))

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 7))
    def finish_request(self, index: int) -> None:
        req = self.running.pop(index % len(self.running))
        self._insert(req.tokens, req.hit.pages + req.new_pages, req.snapshots)
        self.cache.unlock(req.hit.node)

    @rule(picks=page_picks, tail=st.integers(0, 3))
    def match(self, picks: list[int], tail: int) -> None:
        self._match(self._tokens(picks) + [0] * (tail % self.page_size))

    @rule(picks=page_picks)
    def lock_match(self, picks: list[int]) -> None:
        hit = self._match(self._tokens(picks))
        self.cache.lock(hit.node)
        self.locks.append(hit)

    @precondition(lambda self: self.locks)
    @rule(index=st.integers(0, 7))
    def unlock(self, index: int) -> None:
        self.cache.unlock(self.locks.pop(index % len(self.locks)).node)

    @rule(num_pages=st.integers(0, 12))
    def evict(self, num_pages: int) -> None:
        before = len(self.free_pages)
        freed = self.cache.evict(num_pages)
        assert freed == len(self.free_pages) - before, f"evict returned {freed}, freed {len(self.free_pages) - before}"
        if freed < num_pages:
            assert self.cache.evictable_pages() == 0, "evict stopped short with evictable pages left"

    @invariant()
    def tree_matches_model(self) -> None:
        self.cache.check_integrity()
        tree_pages, tree_slots = set(self.ref_pages.values()), set(self.ref_slots.values())
        held_pages = {p for r in self.running for p in r.new_pages}
        held_slots = {s for r in self.running for s in r.snapshots.values()}
        assert len(self.free_pages) + len(tree_pages) + len(held_pages) == TOTAL_PAGES, "a page leaked or doubled"
        assert self.free_pages | tree_pages | held_pages == set(range(TOTAL_PAGES)), "a page leaked"
        assert len(self.free_slots) + len(tree_slots) + len(held_slots) == TOTAL_SLOTS, "a slot leaked or doubled"
        assert self.cache.cached_pages() == len(self.ref_pages)
        assert self.cache.cached_states() == len(self.ref_slots)
        assert self.cache.evictable_pages() == len(self.ref_pages) - len(self._locked_pages())
        ps = self.page_size
        assert all(len(k) == ps or k[:-ps] in self.ref_pages for k in self.ref_pages), "cached prefixes not closed"
        assert all(k in self.ref_pages for k in self.ref_slots), "a snapshot outlived the KV it belongs to"


def _variant(page_size: int, hybrid: bool) -> type:
    """A TestCase running the machine for one (page_size, model) combination."""
    machine = type(f"RadixMachine_{page_size}_{hybrid}", (RadixMachine,), {"page_size": page_size, "hybrid": hybrid})
    case = machine.TestCase
    case.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
    return case


TestDensePage1 = _variant(1, False)
TestDensePage4 = _variant(4, False)
TestHybridPage1 = _variant(1, True)
TestHybridPage4 = _variant(4, True)


class Freed:
    """Records what the cache gives back, in order."""

    def __init__(self) -> None:
        self.pages: list[list[int]] = []
        self.slots: list[int] = []

    def free_pages(self, pages: list[int]) -> None:
        self.pages.append(pages)

    def free_state(self, slot: int) -> None:
        self.slots.append(slot)


def test_hybrid_hit_is_cut_back_to_the_deepest_snapshot() -> None:
    freed = Freed()
    cache = RadixCache(1, freed.free_pages, freed.free_state)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    assert cache.insert(tokens, list(range(8)), {2: 100, 5: 101}).unused_slots == []
    hit = cache.match_prefix(tokens)
    assert (hit.matched_tokens, hit.pages, hit.state_slot) == (5, [0, 1, 2, 3, 4], 101)
    hit = cache.match_prefix([1, 2, 3, 4, 9])  # KV matches 4 tokens, the deepest snapshot is at 2
    assert (hit.matched_tokens, hit.pages, hit.state_slot) == (2, [0, 1], 100)
    hit = cache.match_prefix([1, 9])
    assert (hit.matched_tokens, hit.pages, hit.state_slot) == (0, [], None)
    assert cache.insert(tokens, list(range(20, 28)), {5: 102, 8: 103}).unused_slots == [102]
    assert cache.match_prefix(tokens).state_slot == 103
    cache.check_integrity()


def test_split_of_locked_node_keeps_lock_counts() -> None:
    cache = RadixCache(2, Freed().free_pages)
    cache.insert([1, 2, 3, 4, 5, 6], [10, 11, 12])
    hit = cache.match_prefix([1, 2, 3, 4, 5, 6])
    cache.lock(hit.node)
    cache.lock(hit.node)
    assert cache.evictable_pages() == 0
    result = cache.insert([1, 2, 3, 4, 9, 9], [20, 21, 22])  # splits the locked node after 4 tokens
    assert (result.existing_tokens, result.unused_pages) == (4, [20, 21])
    assert hit.node.parent.lock_ref == 2 and hit.node.lock_ref == 2
    assert cache.evictable_pages() == 1
    cache.check_integrity()
    cache.unlock(hit.node)
    cache.unlock(hit.node)
    assert hit.node.parent.lock_ref == 0 and cache.evictable_pages() == 4
    cache.check_integrity()
    with pytest.raises(CacheIntegrityError, match="holds no lock"):
        cache.unlock(hit.node)


def test_evict_takes_the_least_recently_used_leaf_first() -> None:
    freed = Freed()
    cache = RadixCache(1, freed.free_pages)
    cache.insert([1, 1], [10, 11])
    cache.insert([2, 2], [20, 21])
    cache.insert([3, 3], [30, 31])
    cache.match_prefix([1, 1])  # now [2, 2] is the oldest, then [3, 3], then [1, 1]
    assert cache.evict(1) == 2 and freed.pages == [[20, 21]]
    assert cache.evict(3) == 4 and freed.pages == [[20, 21], [30, 31], [10, 11]]
    assert cache.cached_pages() == 0 and cache.evict(1) == 0


def test_evict_frees_parent_after_children_and_spares_locked_paths() -> None:
    freed = Freed()
    cache = RadixCache(1, freed.free_pages, freed.free_state)
    cache.insert([1, 2, 3], [10, 11, 12], {1: 7, 3: 8})
    cache.insert([1, 2, 4], [10, 11, 14])
    hit = cache.match_prefix([1, 2, 4])
    assert hit.matched_tokens == 1  # only position 1 holds a snapshot on that path
    cache.lock(hit.node)
    assert cache.evict(10) == 3 and sorted(freed.pages) == [[11], [12], [14]] and freed.slots == [8]
    assert cache.cached_pages() == 1 and cache.match_prefix([1]).state_slot == 7
    cache.check_integrity()


@pytest.mark.parametrize(("tokens", "pages", "page_size"), [([1, 2, 3], [5], 2), ([1, 2], [5, 6], 2), ([1], [], 1)])
def test_insert_length_mismatch_raises(tokens: list[int], pages: list[int], page_size: int) -> None:
    cache = RadixCache(page_size, Freed().free_pages)
    with pytest.raises(ValueError, match=f"{len(tokens)} tokens, {len(pages)} pages"):
        cache.insert(tokens, pages)
    with pytest.raises(ValueError, match=f"{len(tokens)} tokens, {len(pages)} pages"):
        NoCache(page_size, Freed().free_pages).insert(tokens, pages)


def test_bad_snapshots_raise() -> None:
    with pytest.raises(ValueError, match="dense cache"):
        RadixCache(1, Freed().free_pages).insert([1], [1], {1: 0})
    hybrid = RadixCache(2, Freed().free_pages, Freed().free_state)
    with pytest.raises(ValueError, match="snapshot position 1"):
        hybrid.insert([1, 2], [1], {1: 0})
    with pytest.raises(ValueError, match="snapshot position 4"):
        hybrid.insert([1, 2], [1], {4: 0})


def test_insert_hands_back_only_pages_the_tree_does_not_own() -> None:
    cache = RadixCache(1, Freed().free_pages)
    cache.insert([1, 2], [10, 11])
    hit = cache.match_prefix([1, 2, 3])
    result = cache.insert([1, 2, 3], [*hit.pages, 12])  # the engine's flow: hit pages + new pages
    assert (result.existing_tokens, result.unused_pages) == (2, [])
    result = cache.insert([1, 2, 3, 4], [10, 99, 12, 13])  # 99 duplicates the cached page 11
    assert (result.existing_tokens, result.unused_pages) == (3, [99])
    with pytest.raises(ValueError, match=r"pages \[10\] that the tree already owns"):
        cache.insert([5], [10])
    cache.check_integrity()


def test_lock_of_an_evicted_node_raises() -> None:
    cache = RadixCache(1, Freed().free_pages)
    cache.insert([1], [10])
    hit = cache.match_prefix([1])
    cache.evict(1)
    with pytest.raises(CacheIntegrityError, match="not in this tree"):
        cache.lock(hit.node)


def _corrupt_page(cache: RadixCache) -> None:
    cache.match_prefix([2]).node.pages[0] = cache.match_prefix([1]).pages[0]


def _corrupt_lock(cache: RadixCache) -> None:
    cache.match_prefix([1, 1]).node.lock_ref = 1


def _corrupt_key(cache: RadixCache) -> None:
    cache.match_prefix([1]).node.key.append(5)


def _corrupt_snapshot(cache: RadixCache) -> None:
    cache.match_prefix([2]).node.state_slot = 3


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (_corrupt_page, "also held elsewhere"),
        (_corrupt_lock, "under a parent with lock 0"),
        (_corrupt_key, "tokens in 1 pages"),
        (_corrupt_snapshot, "dense cache holds snapshot"),
    ],
)
def test_check_integrity_names_the_broken_invariant(corrupt: Callable[[RadixCache], None], message: str) -> None:
    cache = RadixCache(1, Freed().free_pages)
    cache.insert([1, 1], [10, 11])
    cache.insert([1, 2], [10, 12])
    cache.insert([2], [20])
    cache.check_integrity()
    corrupt(cache)
    with pytest.raises(CacheIntegrityError, match=message):
        cache.check_integrity()


def test_no_cache_adopts_nothing() -> None:
    freed = Freed()
    cache = NoCache(1, freed.free_pages, freed.free_state)
    result = cache.insert([1, 2], [10, 11], {2: 5, 1: 4})
    assert (result.existing_tokens, result.unused_pages, result.unused_slots) == (0, [10, 11], [4, 5])
    hit = cache.match_prefix([1, 2])
    assert (hit.matched_tokens, hit.pages, hit.state_slot) == (0, [], None)
    cache.lock(hit.node)
    cache.unlock(hit.node)
    assert cache.evict(5) == 0 and freed.pages == [] and freed.slots == []
    assert (cache.cached_pages(), cache.cached_states(), cache.evictable_pages()) == (0, 0, 0)
    assert cache.is_hybrid
    cache.check_integrity()
