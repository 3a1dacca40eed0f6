"""cache=host: the L1 radix cache over an L2 host pool (HiCache's ``HiRadixCache``, simplified).

Write policies: ``write_through`` copies a prompt's pages (and snapshots) to L2 when the tree
adopts them; ``write_back`` copies a node only when L1 evicts it. Either way an evicted page
is still in L2, and a match that L2 extends past L1 loads those pages back into fresh device
pages (and a snapshot into a fresh slot) before the request runs: bitwise copies, so a warm
pass from L2 is indistinguishable from one from L1. ``MatchResult.host_tokens`` says how much of
a hit came from L2. A hybrid hit from L2 must end at a saved snapshot, as on L1.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from reference_impl.host_pool import HostPool, PageMover, page_hashes
from reference_impl.radix_cache import InsertResult, MatchResult, RadixCache, TreeNode

WRITE_POLICIES = ("write_through", "write_back")


class HostCache(RadixCache):
    """RadixCache whose evicted pages live on in an L2 host pool and are loaded back on a match."""

    lower_tiers = ("host",)
    write_policy = "write_through"

    def __init__(
        self, page_size: int, free_pages: Callable[[list[int]], None], free_state: Callable[[int], None] | None = None
    ) -> None:
        """Build an empty L1 tree and an empty L2 pool; ``attach`` gives it the pools to copy from."""
        super().__init__(page_size, free_pages, free_state)
        self.host = HostPool()
        self.mover: PageMover | None = None
        self._fetched: set[str] = set()  # keys a tier below L2 supplied during the current match

    def attach(self, mover: PageMover) -> None:
        """Take the engine's page mover (pools, draft layers, Mamba layers, faults)."""
        self.mover = mover

    def insert(
        self, tokens: Sequence[int], pages: Sequence[int], snapshots: Mapping[int, int] | None = None
    ) -> InsertResult:
        """Insert into L1; under write-through also copy every page and snapshot L2 lacks."""
        result = super().insert(tokens, pages, snapshots)
        if self.write_policy == "write_through":
            self._save(tokens, 0, list(pages), dict(snapshots or {}))
        return result

    def match_prefix(self, tokens: Sequence[int]) -> MatchResult:
        """L1's hit, extended from lower tiers when they hold a longer prefix (loaded back before returning)."""
        self._fetched = set()
        device = super().match_prefix(tokens)
        end = self._host_end(tokens)
        if end <= device.matched_tokens or not self._load(tokens, end):
            return device
        result = super().match_prefix(tokens)
        keys = page_hashes(tokens, self.page_size, result.matched_tokens // self.page_size)
        below = sum(k in self._fetched for k in keys[device.matched_tokens // self.page_size:])
        result.storage_tokens = below * self.page_size
        result.host_tokens = result.matched_tokens - device.matched_tokens - result.storage_tokens
        return result

    def demote_all(self) -> None:
        """Evict every unlocked L1 page to the tiers below (what capacity pressure does, all at once)."""
        self.evict(self.evictable_pages())

    def _save(self, tokens: Sequence[int], start: int, pages: list[int], snapshots: dict[int, int]) -> None:
        """Copy pages (of positions ``start`` on) and snapshots (absolute positions) into L2."""
        first = start // self.page_size
        keys = page_hashes(tokens, self.page_size, first + len(pages))
        for key, page in zip(keys[first:], pages):
            if key not in self.host.pages:
                self.host.pages[key] = self.mover.save_page(page)
        for pos, slot in snapshots.items():
            key = keys[pos // self.page_size - 1]
            if key not in self.host.snapshots and self.mover.keeps_snapshot(pos):
                self.host.snapshots[key] = self.mover.save_state(slot)

    def _remove_leaf(self, node: TreeNode) -> int:
        """Evict a leaf; under write-back copy it to L2 first."""
        if self.write_policy == "write_back":
            prefix = [t for n in reversed(self._path_to_root(node)) for t in n.key]
            start = len(prefix) - len(node.key)
            snaps = {len(prefix): node.state_slot} if node.state_slot is not None else {}
            self._save(prefix, start, list(node.pages), snaps)
        return super()._remove_leaf(node)

    def _host_end(self, tokens: Sequence[int]) -> int:
        """How far L1 pages followed by L2 pages cover ``tokens`` (hybrid: to the deepest L2 snapshot)."""
        path, partial = self._walk(tokens)
        on_device = sum(len(n.pages) for n in path) + (partial[1] // self.page_size if partial else 0)
        keys = page_hashes(tokens, self.page_size, len(tokens) // self.page_size)
        covered = on_device
        while covered < len(keys) and keys[covered] in self.host.pages:
            covered += 1
        covered = self._fetch_below(keys, covered)
        if not self.is_hybrid:
            return covered * self.page_size
        ends = [i + 1 for i in range(covered) if keys[i] in self.host.snapshots]
        return max(ends, default=0) * self.page_size

    def _fetch_below(self, keys: list[str], covered: int) -> int:
        """Pages a tier below L2 adds to L2 past ``covered`` (none for cache=host); the new cover."""
        return covered

    def _load(self, tokens: Sequence[int], end: int) -> bool:
        """Load L2 pages (and the snapshot at ``end``) into L1 so L1 matches ``tokens[:end]``."""
        path, partial = self._walk(tokens[:end])
        if partial is not None:
            path.append(self._split(*partial))
        node = path[-1] if path else self._root
        device_pages = [p for n in path for p in n.pages]
        self.lock(node)
        try:
            fresh, slot = self._reserve(end // self.page_size - len(device_pages))
        finally:
            self.unlock(node)
        if fresh is None:
            return False
        keys = page_hashes(tokens, self.page_size, end // self.page_size)
        for key, page in zip(keys[len(device_pages):], fresh):
            self.mover.load_page(page, self.host.pages[key])
        snapshots = {}
        if slot is not None:
            self.mover.load_state(slot, self.host.snapshots[keys[-1]])
            snapshots = {end: slot}
        result = RadixCache.insert(self, tokens[:end], device_pages + fresh, snapshots)
        if result.unused_pages:
            self._free_pages(result.unused_pages)
        for unused in result.unused_slots:
            self._free_state(unused)
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
