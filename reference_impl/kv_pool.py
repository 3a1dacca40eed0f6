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
        for i in ids:
            if not 0 <= i < self.size or not self._live[i]:
                raise PoolIntegrityError(f"{self.what} {i} freed while not live")
            self._live[i] = 0
            heapq.heappush(self._free, i)

    def is_live(self, i: int) -> bool:
        return bool(self._live[i])

    def live_ids(self) -> list[int]:
        return [i for i in range(self.size) if self._live[i]]

    def check_integrity(self) -> None:
        """Free list and live flags are exact complements, without duplicates."""
        if len(set(self._free)) != len(self._free):
            raise PoolIntegrityError(f"{self.what} free list holds duplicates")
        if any(self._live[i] for i in self._free):
            raise PoolIntegrityError(f"a {self.what} is both free and live")
        if len(self._free) + sum(self._live) != self.size:
            raise PoolIntegrityError(f"{self.what}s leaked: free + live != {self.size}")


class StaticPools:
    """Separate KV and Mamba-state tensors, zero-filled at creation (the static layout)."""

    def __init__(
        self,
        model: ModelConfig,
        *,
        page_size: int,
        num_pages: int,
        num_state_slots: int,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.page_size = page_size
        self.num_pages = num_pages
        self.pages = IdAllocator(num_pages, "page")
        self.state_slots = IdAllocator(num_state_slots, "state slot")
        kv_shape = (len(model.attention_layers), num_pages, page_size, model.num_kv_heads, model.head_dim)
        self._k = torch.zeros(kv_shape, device=device, dtype=dtype)
        self._v = torch.zeros(kv_shape, device=device, dtype=dtype)
        n_mamba = len(model.mamba_layers)
        self._conv = torch.zeros((n_mamba, num_state_slots, *model.mamba.conv_state_shape()), device=device, dtype=dtype)
        self._ssm = torch.zeros((n_mamba, num_state_slots, *model.mamba.ssm_state_shape()), device=device, dtype=dtype)

    # -- allocation (the only way ids enter or leave use) ---------------------------------
    def alloc_pages(self, n: int) -> list[int] | None:
        """``n`` fresh virtual pages, or None (nothing taken) when fewer are free."""
        return self.pages.alloc(n)

    def free_pages(self, pages: Iterable[int]) -> None:
        self.pages.free(pages)

    @property
    def num_free_pages(self) -> int:
        return self.pages.num_free

    def page_is_live(self, page: int) -> bool:
        return self.pages.is_live(page)

    def alloc_state_slot(self) -> int | None:
        """A fresh virtual Mamba state slot, or None when none is free."""
        slots = self.state_slots.alloc(1)
        return slots[0] if slots else None

    def free_state_slots(self, slots: Iterable[int]) -> None:
        self.state_slots.free(slots)

    @property
    def num_free_state_slots(self) -> int:
        return self.state_slots.num_free

    # -- KV pages ---------------------------------------------------------------------
    def kv_views(self, attn_layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one attention layer as (num_pages, page_size, kv_heads, head_dim) physical views."""
        return self._k[attn_layer], self._v[attn_layer]

    def to_physical(self, slots: torch.Tensor) -> torch.Tensor:
        """Virtual token slots → physical token slots (identity here; -1 stays -1)."""
        return slots

    def write_kv(self, attn_layer: int, out_cache_loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new tokens' K/V at their physical slots; slots of -1 are skipped."""
        keep = out_cache_loc >= 0
        loc = out_cache_loc[keep]
        k_view, v_view = self.kv_views(attn_layer)
        page, offset = loc // self.page_size, loc % self.page_size
        k_view[page, offset] = k[keep].to(k_view.dtype)
        v_view[page, offset] = v[keep].to(v_view.dtype)

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

    def check_integrity(self) -> None:
        self.pages.check_integrity()
        self.state_slots.check_integrity()
