"""An engine's pools: the target pool, and the proposer's own draft pool when it has one, pages in lockstep.

Who owns what: the engine (and the radix cache, the tiers, a PD side) hold virtual page ids that
name the same tokens' K/V in both pools. ``alloc_pages`` issues the same ids in both and
``free_pages`` frees them in both, so a page is live in the draft pool exactly when it is live in the
target's. Everything else (state slots, KV views, translation) is the target pool's: the draft pool
is read and written only through ``draft`` by the proposer, and moved as a whole by tier copies and
PD transfers.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from reference_impl.memory.layout import PoolGeometry, RegionTable
from reference_impl.memory.pool import Pool
from reference_impl.memory.static import PoolIntegrityError


@dataclass(slots=True)
class EnginePools:
    """``target`` plus an optional ``draft`` pool issued and freed with it; a ``Pool`` itself (the target's view)."""

    target: Pool
    draft: Pool | None = None

    @property
    def pools(self) -> list[Pool]:
        """The target pool, then the draft pool if any: every pool that holds K/V of a page."""
        return [self.target] if self.draft is None else [self.target, self.draft]

    @property
    def page_size(self) -> int:
        return self.target.page_size

    # -- pages: in lockstep -------------------------------------------------------------------
    def alloc_pages(self, n: int) -> list[int] | None:
        """``n`` pages in every pool (the same virtual ids), or None when the target has fewer free."""
        pages = self.target.alloc_pages(n)
        if pages is not None and self.draft is not None:
            mirror = self.draft.alloc_pages(n)
            if mirror != pages:
                raise PoolIntegrityError(f"draft pool issued pages {mirror}, target issued {pages}")
        return pages

    def free_pages(self, pages: Iterable[int]) -> None:
        """Free ``pages`` in every pool."""
        pages = list(pages)
        for pool in self.pools:
            pool.free_pages(pages)

    def check_integrity(self) -> None:
        """Every pool consistent, and the draft pool holds exactly the target's live pages."""
        for pool in self.pools:
            pool.check_integrity()
        if self.draft is not None and self.draft.num_free_pages != self.target.num_free_pages:
            raise PoolIntegrityError(f"draft pool pages leaked: {self.draft.num_free_pages} free vs "
                                     f"{self.target.num_free_pages} in the target pool")

    # -- the rest: the target pool's ------------------------------------------------------------
    @property
    def num_free_pages(self) -> int:
        return self.target.num_free_pages

    def page_is_live(self, page: int) -> bool:
        return self.target.page_is_live(page)

    def alloc_state_slot(self) -> int | None:
        return self.target.alloc_state_slot()

    def free_state_slots(self, slots: Iterable[int]) -> None:
        self.target.free_state_slots(slots)

    @property
    def num_free_state_slots(self) -> int:
        return self.target.num_free_state_slots

    @property
    def bytes_per_page(self) -> int:
        return self.target.bytes_per_page

    def kv_views(self, attn_layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.target.kv_views(attn_layer)

    def to_physical(self, slots: torch.Tensor) -> torch.Tensor:
        return self.target.to_physical(slots)

    def write_kv(self, attn_layer: int, out_cache_loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.target.write_kv(attn_layer, out_cache_loc, k, v)

    def state_views(self, mamba_layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.target.state_views(mamba_layer)

    def to_physical_state(self, slots: Sequence[int]) -> list[int]:
        return self.target.to_physical_state(slots)

    def zero_state(self, slot: int) -> None:
        self.target.zero_state(slot)

    def copy_state(self, src: int, dst: int) -> None:
        self.target.copy_state(src, dst)

    def transfer_geometry(self, regions: RegionTable) -> PoolGeometry:
        return self.target.transfer_geometry(regions)
