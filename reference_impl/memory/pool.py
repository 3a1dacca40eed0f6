"""The pool interface: what every KV page and Mamba state slot pool offers (``pool = static``, ``unified`` or yours).

A pool level names a class built as ``Pool(model, *, page_size, num_pages, num_state_slots, device,
dtype, poison, faults)``; the registry checks it against ``Pool`` when a matrix file names it.
``physical_pages`` is the one translation of whole pages, for every caller that moves pages
(tier copies, PD handoff, the draft's cache fault).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, runtime_checkable

import torch

from reference_impl.memory.layout import PoolGeometry, RegionTable


class Pool(Protocol):
    """KV pages and Mamba state slots: virtual ids above the pool, physical ids only at a kernel handoff.

    Ownership. The pool owns every id that is free. ``alloc_pages`` / ``alloc_state_slot`` hand
    fresh *virtual* ids to the caller, who owns them until it gives them back through
    ``free_pages`` / ``free_state_slots``, exactly once (the engine, the radix cache or a PD side:
    whoever holds the id at that moment, see ``Request`` and ``cache.radix``). A freed id may be
    re-issued at once, so a caller must drop every copy of it when it frees.

    Safety of ids. A virtual id is safe to hold across steps: a pool that moves memory (compaction)
    keeps every live virtual id's meaning. A *physical* id (from ``to_physical`` /
    ``to_physical_state``) is safe only until the next ``alloc_*`` / ``free_*`` / compaction, which
    the engine calls between steps: build a batch with it and drop it. A PD transfer that holds
    physical ids longer must gate moves (``MovingPool.move_gate``).

    Memory. An issued page reads as zero (or at least finite: never another request's NaN); with
    ``poison`` every free page and slot reads NaN, so a stale read shows. A new state slot holds
    anything: the engine zeroes (``zero_state``) or overwrites (``copy_state``) it.

    ``check_integrity`` raises ``PoolIntegrityError`` (an AssertionError) unless every id is either
    free or live, never both, none freed twice and none lost: ``free + live == total`` for pages and
    for state slots, and virtual ↔ physical maps are inverse on live ids. The ``pool_audit`` oracle
    calls it on the idle engine, next to ``free pages + cached pages == num_pages``.

    Also read (instance attributes, not checked on the class): ``page_size`` (tokens per page).
    """

    # -- allocation -----------------------------------------------------------------------
    def alloc_pages(self, n: int) -> list[int] | None:
        """``n`` fresh virtual pages, lowest first, or None (and nothing taken) when fewer are free."""

    def free_pages(self, pages: Iterable[int]) -> None:
        """Take live virtual pages back; a page not live raises PoolIntegrityError and frees nothing."""

    @property
    def num_free_pages(self) -> int:
        """Pages ``alloc_pages`` can issue now."""

    def page_is_live(self, page: int) -> bool:
        """Whether virtual ``page`` is issued (a request reading a page that is not reads stale memory)."""

    def alloc_state_slot(self) -> int | None:
        """A fresh virtual Mamba state slot, or None when none is free."""

    def free_state_slots(self, slots: Iterable[int]) -> None:
        """Take live virtual state slots back."""

    @property
    def num_free_state_slots(self) -> int:
        """State slots ``alloc_state_slot`` can issue now."""

    @property
    def bytes_per_page(self) -> int:
        """Bytes one page costs across every attention layer (the launch audit's KV budget divides by it)."""

    # -- KV pages -------------------------------------------------------------------------
    def kv_views(self, attn_layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one attention layer as (num_pages, page_size, kv_heads, head_dim) views by physical page."""

    def to_physical(self, slots: torch.Tensor) -> torch.Tensor:
        """Virtual token slots (page * page_size + offset) → physical ones; -1 stays -1."""

    def write_kv(self, attn_layer: int, out_cache_loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new tokens' K/V at *physical* slots ``out_cache_loc``; slots of -1 are skipped."""

    # -- Mamba state slots ----------------------------------------------------------------
    def state_views(self, mamba_layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Conv and SSM states of one Mamba layer, indexed by physical state slot."""

    def to_physical_state(self, slots: Sequence[int]) -> list[int]:
        """Virtual state slots → physical ones."""

    def zero_state(self, slot: int) -> None:
        """Reset virtual ``slot`` to the state of an empty prefix."""

    def copy_state(self, src: int, dst: int) -> None:
        """Copy every Mamba layer's state from virtual slot ``src`` to ``dst``."""

    # -- transfer and audit -----------------------------------------------------------------
    def transfer_geometry(self, regions: RegionTable) -> PoolGeometry:
        """Where every layer's pages and state slots lie, registered in ``regions``, for a PD transfer."""

    def check_integrity(self) -> None:
        """Raise PoolIntegrityError unless every page and slot is free xor live, and none is lost."""


@runtime_checkable
class MovingPool(Protocol):
    """A pool that moves live pages between physical ids (compaction) and can be told not to."""

    compaction: str  # "eager" (after every free) or "lazy": PD runs only lazily, so the gate can hold moves off
    move_gate: Callable[[], bool] | None  # when set and it answers True, no page or slot moves


def physical_pages(pool: Pool, pages: Sequence[int]) -> list[int]:
    """Physical ids of virtual ``pages`` in ``pool``: the one page-level translation (through ``to_physical``)."""
    if not pages:
        return []
    page_size = pool.page_size
    slots = torch.tensor([p * page_size for p in pages], dtype=torch.long)
    return [int(s) // page_size for s in pool.to_physical(slots)]
