"""cache=host: the L1 radix cache over an L2 host pool (HiCache's ``HiRadixCache``, simplified).

Write policies: ``write_through`` copies a prompt's pages (and snapshots) to L2 when the tree
adopts them; ``write_back`` copies a node only when L1 evicts it. L2 is LRU within its capacity
(``attach(host_pages=...)``) and never drops a page L1 still holds, so an L1 eviction moves a
page down and L2 pressure drops the oldest copies L1 no longer has (to L3, for cache=storage,
which holds everything written through). A match that the tiers below extend past L1 first
gathers the copies, then loads them into fresh device pages (and a snapshot into a fresh slot)
before the request runs: bitwise copies, so a warm pass from below is indistinguishable from
one from L1. ``MatchResult.host_tokens`` / ``storage_tokens`` count the pages each tier
supplied. A hybrid hit from below must end at a saved snapshot, as on L1.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from reference_impl.cache.radix import InsertResult, MatchResult, RadixCache, TreeNode
from reference_impl.faults import HOST_DEMOTES_AS_OLDEST, PAGE_KEY_FORGETS_PREFIX
from reference_impl.memory.host import HostPool, PageMover, page_hashes

Copies = dict[str, list[torch.Tensor]]  # chained page hash -> host copy of a page (or a snapshot)


@dataclass(slots=True)
class LoadPlan:
    """What the tiers below add to an L1 match: the pages past L1's, up to ``end`` tokens.

    L2's copies are taken when planning (L1 evictions before the commit may push them out of
    L2); L3's are only known to exist, and ``load_back`` reads them once the request fits.
    """

    end: int
    start: int                       # pages L1 held when planned (the copies start there)
    keys: list[str]                  # chained hash of each page of tokens[:end]
    pages: dict[str, list[torch.Tensor] | None]  # every page past L1's, in order: L2's copy, or None (in L3)
    snapshot: list[torch.Tensor] | None = None   # hybrid: L2's copy of the state at ``end``, or None (in L3)
    below: frozenset[str] = frozenset()          # pages that L3 supplies
    snapshot_below: bool = False                 # the state at ``end`` comes from L3


class HostCache(RadixCache):
    """RadixCache whose evicted pages live on in an L2 host pool and are loaded back on a match."""

    lower_tiers = ("host",)
    write_policy = "write_through"

    def __init__(
        self, page_size: int, free_pages: Callable[[list[int]], None], free_state: Callable[[int], None] | None = None
    ) -> None:
        """Build an empty L1 tree and an unbounded L2; ``attach`` gives it the pools and L2's size."""
        super().__init__(page_size, free_pages, free_state)
        self.host = HostPool()
        self.mover: PageMover | None = None

    def attach(self, mover: PageMover, host_pages: int | None = None) -> None:
        """Take the engine's page mover (pools, draft layers, Mamba layers, faults) and an L2 of ``host_pages``."""
        super().attach(mover, host_pages)
        self.mover = mover
        self.host = HostPool(host_pages)
        self._chained = PAGE_KEY_FORGETS_PREFIX.name not in mover.faults

    def _keys(self, tokens: Sequence[int], pages: int) -> list[str]:
        """The L2/L3 key of each of the first ``pages`` pages of ``tokens``: chained onto its prefix."""
        return page_hashes(tokens, self.page_size, pages, self._chained)

    def insert(
        self, tokens: Sequence[int], pages: Sequence[int], snapshots: Mapping[int, int] | None = None
    ) -> InsertResult:
        """Insert into L1; under write-through also copy every page and snapshot L2 lacks."""
        result = super().insert(tokens, pages, snapshots)
        keys = self._keys(tokens, len(pages))
        self.host.resident.update(keys)
        if self.write_policy == "write_through":
            self._save(keys, 0, list(pages), dict(snapshots or {}))
        return result

    def match_prefix(self, tokens: Sequence[int]) -> MatchResult:
        """L1's hit; ``pending`` plans the load-back when lower tiers hold a longer prefix (nothing moves yet)."""
        device = super().match_prefix(tokens)
        plan = self._plan(tokens)
        if plan.end > device.matched_tokens:
            device.pending = plan
        return device

    def load_back(self, tokens: Sequence[int], match: MatchResult) -> MatchResult:
        """Load ``match.pending`` into L1 (L3 → L2 → L1) and return the longer match; ``match`` if it cannot."""
        plan = match.pending
        if plan is None or not self._fetch(plan) or not self._load(tokens, plan):
            return match
        result = RadixCache.match_prefix(self, tokens)
        result.storage_tokens = len(plan.below) * self.page_size
        result.host_tokens = (len(plan.pages) - len(plan.below)) * self.page_size
        return result

    def _save(self, keys: list[str], first: int, pages: list[int], snapshots: dict[int, int]) -> None:
        """Copy pages ``keys[first:]`` and snapshots (by absolute position) that L2 lacks, and keep them."""
        copies: Copies = {}
        for key, page in zip(keys[first:], pages):
            if key in self.host.pages:
                self.host.touch([key])
            else:
                copies[key] = self.mover.save_page(page)
        states: Copies = {}
        for pos, slot in snapshots.items():
            key = keys[pos // self.page_size - 1]
            if key not in self.host.snapshots and self.mover.keeps_snapshot(pos):
                states[key] = self.mover.save_state(slot)
        self._keep(copies, states)

    def _keep(self, pages: Copies, snapshots: Copies) -> None:
        """Put fresh copies into L2 (StorageCache also writes them through to L3)."""
        for key, page in pages.items():
            self.host.put(key, page)
        for key, state in snapshots.items():
            self.host.put_snapshot(key, state)

    def _remove_leaf(self, node: TreeNode) -> int:
        """Evict a leaf down to L2: write-back copies it now, write-through marks L2's copy most recent."""
        prefix = [t for n in reversed(self._path_to_root(node)) for t in n.key]
        keys = self._keys(prefix, len(prefix) // self.page_size)
        first = len(keys) - len(node.pages)
        if self.write_policy == "write_back":
            snaps = {len(prefix): node.state_slot} if node.state_slot is not None else {}
            self._save(keys, first, list(node.pages), snaps)
        else:
            self.host.touch(keys[first:], newest=HOST_DEMOTES_AS_OLDEST.name not in self.mover.faults)
        self.host.resident.difference_update(keys[first:])
        return super()._remove_leaf(node)

    def _plan(self, tokens: Sequence[int]) -> LoadPlan:
        """The pages that extend L1's for ``tokens`` from L2, then L3 (hybrid: to the deepest snapshot)."""
        path, partial = self._walk(tokens)
        on_device = sum(len(n.pages) for n in path) + (partial[1] // self.page_size if partial else 0)
        keys = self._keys(tokens, len(tokens) // self.page_size)
        covered = on_device
        while covered < len(keys) and keys[covered] in self.host.pages:
            covered += 1
        in_store, store_snapshots = self._below(keys, covered)
        covered += in_store
        end, snapshot, snapshot_below = covered, None, False
        if self.is_hybrid:
            end = max((i + 1 for i in range(covered) if keys[i] in self.host.snapshots or keys[i] in store_snapshots),
                      default=0)
            snapshot = self.host.snapshots.get(keys[end - 1]) if end else None
            snapshot_below = bool(end) and snapshot is None
        pages = {key: self.host.pages.get(key) for key in keys[on_device:end]}
        below = frozenset(key for key, page in pages.items() if page is None)
        return LoadPlan(end * self.page_size, on_device, keys[:end], pages, snapshot, below, snapshot_below)

    def _below(self, keys: list[str], covered: int) -> tuple[int, set[str]]:
        """How many pages past ``covered`` a tier below L2 holds, and which keys' snapshots; none for cache=host."""
        return 0, set()

    def _fetch(self, plan: LoadPlan) -> bool:
        """Read what the plan leaves below L2 into it; False when that fails (cache=host: nothing to read)."""
        return True

    def _load(self, tokens: Sequence[int], plan: LoadPlan) -> bool:
        """Load the plan's copies into fresh L1 pages (and slot) so L1 matches ``tokens[:plan.end]``."""
        end = plan.end
        path, partial = self._walk(tokens[:end])
        if partial is not None:
            path.append(self._split(*partial))
        node = path[-1] if path else self._root
        device_pages = [p for n in path for p in n.pages]
        if len(device_pages) != min(plan.start, end // self.page_size):
            return False  # L1 evicted planned pages since the match (an unlocked hybrid tail): stay with L1's hit
        self.lock(node)
        try:
            fresh, slot = self._reserve(end // self.page_size - len(device_pages))
        finally:
            self.unlock(node)
        if fresh is None:
            return False
        for page, data in zip(fresh, plan.pages.values()):
            self.mover.load_page(page, data)
        snapshots = {}
        if slot is not None:
            self.mover.load_state(slot, plan.snapshot)
            snapshots = {end: slot}
        result = RadixCache.insert(self, tokens[:end], device_pages + fresh, snapshots)
        if result.unused_pages:
            self._free_pages(result.unused_pages)
        for unused in result.unused_slots:
            self._free_state(unused)
        self.host.resident.update(plan.keys)
        from_store = {plan.keys[-1]: plan.snapshot} if plan.snapshot_below else {}
        HostCache._keep(self, {key: plan.pages[key] for key in plan.below}, from_store)  # L3 → L2 → L1
        return True

    def _reserve(self, n: int) -> tuple[list[int] | None, int | None]:
        """``n`` fresh device pages (and a state slot when hybrid), evicting L1 leaves; (None, None) if short."""
        pools = self.mover.pools
        short = n - pools.num_free_pages
        if short > 0:
            self.evict(short)
        fresh = pools.alloc_pages(n) if pools.num_free_pages >= n else None
        if fresh is None or not self.is_hybrid:
            return fresh, None
        while pools.num_free_state_slots == 0 and self.evict(1):
            pass
        slot = pools.alloc_state_slot()
        if slot is None:
            pools.free_pages(fresh)
            return None, None
        return fresh, slot


class WriteBackHostCache(HostCache):
    """cache=host with the write-back policy: L2 gets a page only when L1 evicts it."""

    write_policy = "write_back"
