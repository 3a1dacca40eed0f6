"""Static pools: a zero-filled paged KV pool and a Mamba state slot pool, separate tensors.

Locations. A *page* holds ``page_size`` consecutive tokens of one request; a token's
*slot* (``out_cache_loc`` in SGLang's words) is ``page * page_size + offset``. A slot of
-1 means "do not write" (padding). Above the allocator every id is *virtual*; the static
pool's virtual and physical ids coincide, and ``to_physical`` is the one function that
crosses from one to the other at a kernel handoff.
"""
from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

import torch

from reference_impl.config import ModelConfig
from reference_impl.memory.layout import PoolGeometry, RegionTable
from reference_impl.memory.poison import poison_, poison_rows_


class PoolIntegrityError(AssertionError):
    """A page or slot is both free and live, freed twice, or unaccounted for."""


class IdAllocator:
    """Hands out the lowest free ids first, so runs are deterministic and load pushes ids high."""

    def __init__(self, size: int, what: str) -> None:
        self.size = size
        self.what = what
        self._free = list(range(size))
        self._live = bytearray(size)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int] | None:
        """``n`` fresh ids, or None (and nothing taken) when fewer than ``n`` are free."""
        if n > len(self._free):
            return None
        ids = [heapq.heappop(self._free) for _ in range(n)]
        for i in ids:
            self._live[i] = 1
        return ids

    def free(self, ids: Iterable[int]) -> None:
        """Take ``ids`` back; all are checked first, so a bad call frees nothing."""
        ids = list(ids)
        seen: set[int] = set()
        for i in ids:
            if not 0 <= i < self.size or not self._live[i] or i in seen:
                raise PoolIntegrityError(f"{self.what} {i} freed while not live")
            seen.add(i)
        for i in ids:
            self._live[i] = 0
            heapq.heappush(self._free, i)

    def is_live(self, i: int) -> bool:
        return bool(self._live[i])

    def live_ids(self) -> list[int]:
        return [i for i in range(self.size) if self._live[i]]

    def span(self) -> int:
        """One past the highest live id (0 when none is live): the extent that holes are counted in."""
        return self._live.rfind(1) + 1

    def check_integrity(self) -> None:
        """Free list and live flags are exact complements, without duplicates."""
        if len(set(self._free)) != len(self._free):
            raise PoolIntegrityError(f"{self.what} free list holds duplicates")
        if any(self._live[i] for i in self._free):
            raise PoolIntegrityError(f"a {self.what} is both free and live")
        if len(self._free) + sum(self._live) != self.size:
            raise PoolIntegrityError(f"{self.what}s leaked: free + live != {self.size}")


def write_paged_kv(
    k_view: torch.Tensor, v_view: torch.Tensor, page_size: int, out_cache_loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Store tokens' K/V at physical slots of (num_pages, page_size, ...) views, strided or not; -1 is skipped."""
    keep = out_cache_loc >= 0
    loc = out_cache_loc[keep]
    page, offset = loc // page_size, loc % page_size
    k_view[page, offset] = k[keep].to(k_view.dtype)
    v_view[page, offset] = v[keep].to(v_view.dtype)


def keep_memory(ids: list[int]) -> None:
    """The issue/free hook when there is nothing to scrub: memory stays as it is, at no cost."""


class StaticPools:
    """Separate KV and Mamba-state tensors, zero-filled at creation (the static layout).

    Zero-filled and only ever written with finite K/V, a static pool needs no scrubbing: a
    re-issued page holds old finite values, which masks and gathers handle (SGLang #33974
    calls static pools "naturally immune"). With ``poison`` the buffers start as NaN, a
    freed page or slot is poisoned again (so a stale read shows), and an issued page is
    zeroed (so it is as safe to issue as without poison). The flag is read once, here.
    ``faults`` is taken for the common pool interface; no static-pool fault exists yet.
    """

    def __init__(
        self,
        model: ModelConfig,
        *,
        page_size: int,
        num_pages: int,
        num_state_slots: int,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        poison: bool = False,
        faults: frozenset[str] = frozenset(),
    ) -> None:
        self.page_size = page_size
        self.num_pages = num_pages
        self.pages = IdAllocator(num_pages, "page")
        self.state_slots = IdAllocator(num_state_slots, "state slot")
        kv_shape = (len(model.attention_layers), num_pages, page_size, model.num_kv_heads, model.head_dim)
        n_mamba = len(model.mamba_layers)
        shapes = [
            kv_shape,
            kv_shape,
            (n_mamba, num_state_slots, *model.mamba.conv_state_shape()),
            (n_mamba, num_state_slots, *model.mamba.ssm_state_shape()),
        ]
        fill = poison_ if poison else torch.Tensor.zero_
        self._k, self._v, self._conv, self._ssm = (fill(torch.empty(s, device=device, dtype=dtype)) for s in shapes)
        self._on_issue_pages = self._zero_pages if poison else keep_memory
        self._on_free_pages = self._poison_pages if poison else keep_memory
        self._on_free_slots = self._poison_slots if poison else keep_memory

    # -- allocation (the only way ids enter or leave use) ---------------------------------
    def alloc_pages(self, n: int) -> list[int] | None:
        """``n`` fresh virtual pages, or None (nothing taken) when fewer are free."""
        pages = self.pages.alloc(n)
        if pages:
            self._on_issue_pages(pages)
        return pages

    def free_pages(self, pages: Iterable[int]) -> None:
        """Take pages back (poisoned again when poison is on)."""
        pages = list(pages)
        self.pages.free(pages)
        self._on_free_pages(pages)

    @property
    def num_free_pages(self) -> int:
        return self.pages.num_free

    def page_is_live(self, page: int) -> bool:
        return self.pages.is_live(page)

    def alloc_state_slot(self) -> int | None:
        """A fresh virtual Mamba state slot, or None when none is free; the engine zeroes or overwrites it."""
        slots = self.state_slots.alloc(1)
        return slots[0] if slots else None

    def free_state_slots(self, slots: Iterable[int]) -> None:
        """Take state slots back (poisoned again when poison is on)."""
        slots = list(slots)
        self.state_slots.free(slots)
        self._on_free_slots(slots)

    @property
    def num_free_state_slots(self) -> int:
        return self.state_slots.num_free

    def _zero_pages(self, pages: list[int]) -> None:
        """Poison on: an issued page reads zero in every layer, as a fresh static pool would."""
        index = torch.tensor(pages, dtype=torch.long, device=self._k.device)
        self._k.index_fill_(1, index, 0)
        self._v.index_fill_(1, index, 0)

    def _poison_pages(self, pages: list[int]) -> None:
        """Poison on: a freed page reads NaN in every layer, K and V."""
        index = torch.tensor(pages, dtype=torch.long, device=self._k.device)
        poison_rows_(self._k, 1, index)
        poison_rows_(self._v, 1, index)

    def _poison_slots(self, slots: list[int]) -> None:
        """Poison on: a freed state slot reads NaN in every Mamba layer, conv and SSM."""
        index = torch.tensor(slots, dtype=torch.long, device=self._conv.device)
        poison_rows_(self._conv, 1, index)
        poison_rows_(self._ssm, 1, index)

    @property
    def bytes_per_page(self) -> int:
        """K and V bytes of one page across every attention layer (what a page costs the budget)."""
        layers, _, page_size, heads, dim = self._k.shape
        return 2 * layers * page_size * heads * dim * self._k.element_size()

    # -- KV pages ---------------------------------------------------------------------
    def kv_views(self, attn_layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one attention layer as (num_pages, page_size, kv_heads, head_dim) physical views."""
        return self._k[attn_layer], self._v[attn_layer]

    def to_physical(self, slots: torch.Tensor) -> torch.Tensor:
        """Virtual token slots → physical token slots (identity here; -1 stays -1)."""
        return slots

    def write_kv(self, attn_layer: int, out_cache_loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new tokens' K/V at their physical slots; slots of -1 are skipped."""
        write_paged_kv(*self.kv_views(attn_layer), self.page_size, out_cache_loc, k, v)

    # -- Mamba state slots ----------------------------------------------------------------
    def state_views(self, mamba_layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Conv and SSM states of one Mamba layer, indexed by physical state slot."""
        return self._conv[mamba_layer], self._ssm[mamba_layer]

    def to_physical_state(self, slots: Sequence[int]) -> list[int]:
        """Virtual state slots → physical ones (identity here)."""
        return list(slots)

    def zero_state(self, slot: int) -> None:
        """Reset a slot to the state of an empty prefix."""
        (phys,) = self.to_physical_state([slot])
        self._conv[:, phys].zero_()
        self._ssm[:, phys].zero_()

    def copy_state(self, src: int, dst: int) -> None:
        """Copy every Mamba layer's state from slot ``src`` to slot ``dst`` (copy-on-write of a snapshot)."""
        p_src, p_dst = self.to_physical_state([src, dst])
        self._conv[:, p_dst] = self._conv[:, p_src]
        self._ssm[:, p_dst] = self._ssm[:, p_src]

    def transfer_geometry(self, regions: RegionTable) -> PoolGeometry:
        """Where every layer's pages and state slots lie, for a transfer engine (the K, V and state tensors)."""
        return PoolGeometry.of([self.kv_views(layer) for layer in range(self._k.shape[0])],
                               [self.state_views(m) for m in range(self._conv.shape[0])], regions)

    def check_integrity(self) -> None:
        """Raise PoolIntegrityError if a page or slot is both free and live, or unaccounted for."""
        self.pages.check_integrity()
        self.state_slots.check_integrity()
