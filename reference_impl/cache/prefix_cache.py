"""The prefix cache interface (``cache = off``, ``device``, ``host``, ``storage`` or yours).

A cache level names a class built as ``Cache(page_size, free_pages, free_state)`` (``free_state``
None for a dense model); the registry checks it against ``PrefixCache`` when a matrix file names it.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar, Protocol

from reference_impl.cache.radix import InsertResult, MatchResult, TreeNode
from reference_impl.memory.host import PageMover


class PrefixCache(Protocol):
    """Whole pages of token ids → virtual KV pages (and Mamba snapshot slots) the cache owns.

    Ownership (``cache.radix`` states it step by step). The cache never allocates in L1: it
    adopts pages and slots the engine hands to ``insert`` and gives back, through ``free_pages`` /
    ``free_state``, exactly once, only what ``evict`` drops. ``match_prefix`` hands out nothing:
    the pages and slot of a ``MatchResult`` stay the cache's and are safe to read only while the
    caller holds ``lock(result.node)``. A cache with tiers below L1 (``lower_tiers``) allocates
    fresh L1 pages for ``load_back`` through the page mover's pools, and owns them from then on.

    ``check_integrity`` raises ``CacheIntegrityError`` (an AssertionError) unless a recount agrees
    with the counters: no page or slot held twice, locks monotone towards the root, and
    ``evictable_pages`` the pages no lock pins. The engine's audit adds
    ``free pages + cached_pages() == num_pages``.

    With ``"storage"`` in ``lower_tiers`` the engine also calls ``attach_store(store, tenant, layout)``.
    """

    lower_tiers: ClassVar[tuple[str, ...]]  # tiers below L1 this cache loads back from: (), ("host",), ("host", "storage")

    def attach(self, mover: PageMover, host_pages: int | None = None) -> None:
        """Take the engine's page mover (pools, draft layers, faults) and the L2 capacity in pages."""

    def match_prefix(self, tokens: Sequence[int]) -> MatchResult:
        """The longest cached whole-page prefix of ``tokens``; moves nothing (``pending`` plans a load-back)."""

    def load_back(self, tokens: Sequence[int], match: MatchResult) -> MatchResult:
        """Commit ``match.pending`` once the caller made room: a longer match (lock its node instead), or ``match``."""

    def insert(
        self, tokens: Sequence[int], pages: Sequence[int], snapshots: Mapping[int, int] | None = None
    ) -> InsertResult:
        """Adopt the pages (and snapshot slots) of ``tokens`` not cached yet; the unused ones stay the caller's."""

    def lock(self, node: TreeNode) -> None:
        """Pin ``node``'s path against ``evict``."""

    def unlock(self, node: TreeNode) -> None:
        """Release one ``lock(node)``."""

    def evict(self, num_pages: int) -> int:
        """Free unlocked pages (least recently used first) until ``num_pages`` are freed; returns how many were."""

    def evictable_pages(self) -> int:
        """Pages ``evict`` can free now."""

    def cached_pages(self) -> int:
        """L1 pages the cache owns."""

    def cached_states(self) -> int:
        """Snapshot slots the cache owns."""

    def check_integrity(self) -> None:
        """Raise CacheIntegrityError naming the first broken invariant."""
