"""The L2 host pool: copies of device pages and Mamba snapshots, keyed by a prefix-chained page hash.

A page's key hashes its tokens chained onto its parent page's key, so equal keys mean equal
prefixes (SGLang HiCache's ``get_hash_str``). Copies go through the pools' own translation
(``kv_views`` + ``to_physical``, ``state_views`` + ``to_physical_state``): every id the cache
hands in is virtual, so the static and the unified pool work alike. Every pool that holds state
of a page moves with it: target K/V, the draft's K/V (draft pool or MTP tail layer), and the
Mamba snapshot that ends a cached prefix.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from reference_impl.faults import HICACHE_DRAFT_NOT_RESTORED, MAMBA_WHOLE_BLOCK_OFFLOAD
from reference_impl.memory.pool import Pool, physical_pages

#: the block (tokens) the faulty offload (``mamba_whole_block_offload``) rounds Mamba snapshots to.
MAMBA_OFFLOAD_BLOCK = 32


def page_hashes(tokens: Sequence[int], page_size: int, pages: int, chained: bool = True) -> list[str]:
    """The chained key of each of the first ``pages`` whole pages of ``tokens`` (unchained: the fault)."""
    keys, prev = [], b""
    for i in range(pages):
        chunk = ",".join(str(t) for t in tokens[i * page_size : (i + 1) * page_size]).encode()
        key = hashlib.sha256((prev if chained else b"") + b"|" + chunk).hexdigest().encode()
        keys.append(key.decode())
        prev = key
    return keys


@dataclass(slots=True)
class PageMover:
    """Reads and writes one virtual page (or state slot) of every pool a cached prefix spans."""

    pools: Pool
    page_size: int
    target_layers: int                                   # the target model's attention layers
    draft: list[tuple[Pool, int]] = field(default_factory=list)  # (pool, layer) of draft K/V
    mamba_layers: int = 0
    faults: frozenset[str] = frozenset()
    pin: bool = False  # host copies in pinned memory (the engine runs on CUDA)

    def _kv(self) -> list[tuple[Pool, int]]:
        return [(self.pools, layer) for layer in range(self.target_layers)] + self.draft

    def to_host(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """CPU copies of ``tensors``: page-locked when ``pin`` (a CUDA engine), so load-back is a DMA as in HiCache."""
        if self.pin:
            return [torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t) for t in tensors]
        return [t.detach().to("cpu", copy=True) for t in tensors]

    def save_page(self, page: int) -> list[torch.Tensor]:
        """Host copies of K and V of ``page`` in every layer of every pool (target first, then draft)."""
        views = []
        for pool, layer in self._kv():
            (phys,) = physical_pages(pool, [page])
            views.extend(view[phys] for view in pool.kv_views(layer))
        return self.to_host(views)

    def load_page(self, page: int, data: list[torch.Tensor]) -> None:
        """Write host copies back into ``page``; under the fault the draft's K/V is left zeroed."""
        items = iter(data)
        for index, (pool, layer) in enumerate(self._kv()):
            (phys,) = physical_pages(pool, [page])
            for view in pool.kv_views(layer):
                saved = next(items)
                if index >= self.target_layers and HICACHE_DRAFT_NOT_RESTORED.name in self.faults:
                    view[phys] = 0
                else:
                    view[phys] = saved.to(view.device)

    def save_state(self, slot: int) -> list[torch.Tensor]:
        """Host copies of conv and SSM state of ``slot`` in every Mamba layer."""
        (phys,) = self.pools.to_physical_state([slot])
        return self.to_host([v[phys] for i in range(self.mamba_layers) for v in self.pools.state_views(i)])

    def load_state(self, slot: int, data: list[torch.Tensor]) -> None:
        """Write a saved snapshot into ``slot``."""
        (phys,) = self.pools.to_physical_state([slot])
        items = iter(data)
        for i in range(self.mamba_layers):
            for view in self.pools.state_views(i):
                view[phys] = next(items).to(view.device)

    def keeps_snapshot(self, position: int) -> bool:
        """Whether offload keeps a snapshot at ``position`` (the fault keeps whole blocks only)."""
        return MAMBA_WHOLE_BLOCK_OFFLOAD.name not in self.faults or position % MAMBA_OFFLOAD_BLOCK == 0


class HostPool:
    """L2: page and snapshot copies in host memory, keyed by chained page hash, LRU within ``capacity`` pages.

    A page whose key is ``resident`` (L1 holds it too) is never evicted: a write-through L1 drops
    an evicted page trusting L2 to hold it, so only copies of pages L1 no longer holds may go
    (SGLang's ``HiRadixCache.evict_host`` likewise evicts only device-evicted nodes). A snapshot
    lives and dies with the page that ends at its position. ``capacity`` None: unbounded.
    """

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and capacity < 0:
            raise ValueError(f"host pool capacity must be >= 0 pages, got {capacity}")
        self.capacity = capacity
        self.pages: OrderedDict[str, list[torch.Tensor]] = OrderedDict()  # oldest first
        self.snapshots: dict[str, list[torch.Tensor]] = {}
        self.resident: set[str] = set()
        self.evicted = 0   # pages L2 dropped to make room (still in L3 when there is one)
        self.refused = 0   # pages L2 could not take: full of pages L1 still holds

    def __len__(self) -> int:
        return len(self.pages)

    def put(self, key: str, page: list[torch.Tensor]) -> bool:
        """Keep ``page`` under ``key`` as the most recent, evicting the oldest non-resident copy if full."""
        if key in self.pages:
            self.pages.move_to_end(key)
            return True
        if self.capacity is not None and len(self.pages) >= self.capacity:
            victim = next((k for k in self.pages if k not in self.resident), None)
            if victim is None:
                self.refused += 1
                return False
            del self.pages[victim]
            self.snapshots.pop(victim, None)
            self.evicted += 1
        self.pages[key] = page
        return True

    def put_snapshot(self, key: str, state: list[torch.Tensor]) -> None:
        """Keep a Mamba snapshot at the end of page ``key`` (only while L2 holds that page)."""
        if key in self.pages:
            self.snapshots[key] = state

    def touch(self, keys: Sequence[str], newest: bool = True) -> None:
        """Mark ``keys`` most recently used (L1 just demoted them: they are L2's freshest copies).

        ``newest=False`` is the fault ``host_demotes_as_oldest``: the copies become L2's next victims instead.
        """
        for key in keys:
            if key in self.pages:
                self.pages.move_to_end(key, last=newest)
