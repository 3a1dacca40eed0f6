"""Unified pool: KV pages and Mamba state slots carved from one byte buffer, behind virtual ids.

Modelled on SGLang's unified memory pool (``--enable-unified-memory``, #33974 / #33517 /
#33362). One ``torch.uint8`` buffer holds everything:

    [ page envelope 0 | page envelope 1 | ... | page envelope N-1 | state slot 0 | ... | state slot S-1 ]

A page *envelope* is one page's K and V for every attention layer, contiguous (page-major),
so one page moves or transfers as one block. A state slot is every Mamba layer's conv and
SSM state, contiguous. With ``isz`` the dtype's size, ``E`` the envelope bytes and ``B`` the
slot bytes (see ``UnifiedLayout``), byte offsets are::

    K[attn_layer l][physical page p][offset t][head h][dim d]
        = p*E + ((((2*l + 0)*page_size + t)*kv_heads + h)*head_dim + d) * isz      (V: 2*l + 1)
    conv[mamba layer m][physical slot s][e] = N*E + s*B + (m*(C + H) + e) * isz
    ssm [mamba layer m][physical slot s][e] = N*E + s*B + (m*(C + H) + C + e) * isz
    E = num_attn * 2 * page_size * kv_heads * head_dim * isz,  B = num_mamba * (C + H) * isz

where C and H are the element counts of one conv and one SSM state. ``kv_views`` and
``state_views`` are ``as_strided`` views of the one buffer, so writes through them land in it.

Everything above the allocator holds virtual ids; ``AddressTable`` owns virtual ↔ physical.
Translation happens at the handoff only: ``to_physical`` (token slots) and
``to_physical_state`` (state slots). A missed call is SGLang #33517.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from reference_impl.config import ModelConfig
from reference_impl.faults import UNIFIED_NO_ZERO_ON_ISSUE
from reference_impl.memory.layout import PoolGeometry, RegionTable
from reference_impl.memory.poison import poison_, poison_rows_
from reference_impl.memory.static import IdAllocator, PoolIntegrityError, keep_memory, write_paged_kv

COMPACTION_MODES = ("eager", "lazy")
#: lazy mode compacts at alloc time once the holes inside the live span exceed this fraction of the pool.
LAZY_HOLE_FRACTION = 0.25


class UnmappedIdError(LookupError):
    """A virtual id handed to a translation that is out of range or was never issued."""


class AddressTable:
    """Virtual ↔ physical ids of one kind (pages or state slots); only the allocator touches it.

    Virtual ids are issued lowest-first, like the static pool's. Physical ids are issued from
    the top of the range down: issue rank r is physical id ``size - 1 - r``. So from the
    very first allocation virtual 0 sits at physical ``size - 1`` and any missed translation
    reads the wrong bytes at once, not only after a compaction (in a fresh pool v meets
    ``size - 1 - v``, equal only for the middle id of an odd size). Compaction packs live
    ids into the lowest ranks: a dense run at the top of the physical range. A freed virtual id keeps its last physical id, so a stale read (which the
    runner records) reads what a real pool would: whatever those bytes hold now.
    """

    def __init__(self, size: int, what: str) -> None:
        self.size = size
        self.what = what
        self.virtual = IdAllocator(size, what)
        self._ranks = IdAllocator(size, f"physical {what}")
        self.v2p = [-1] * size
        self.p2v = [-1] * size
        self._v2p_tensor: torch.Tensor | None = None  # v2p for to_physical's gather, rebuilt after a change

    def alloc(self, n: int) -> tuple[list[int], list[int]] | None:
        """``n`` (virtual, physical) id pairs, or None (nothing taken) when fewer are free."""
        virtual = self.virtual.alloc(n)
        if virtual is None:
            return None
        physical = [self.size - 1 - r for r in self._ranks.alloc(n)]
        self._map(virtual, physical)
        return virtual, physical

    def free(self, virtual: list[int]) -> list[int]:
        """Take virtual ids back; returns the physical ids they released."""
        self.virtual.free(virtual)
        physical = [self.v2p[v] for v in virtual]
        self._ranks.free(self.size - 1 - p for p in physical)
        for p in physical:
            self.p2v[p] = -1
        return physical

    def translate(self, virtual: Sequence[int]) -> list[int]:
        """Physical ids of ``virtual``; raises UnmappedIdError for an id never issued."""
        for v in virtual:
            if not 0 <= v < self.size or self.v2p[v] < 0:
                raise UnmappedIdError(f"virtual {self.what} {v} is out of range [0, {self.size}) or never issued")
        return [self.v2p[v] for v in virtual]

    def v2p_tensor(self) -> torch.Tensor:
        """The virtual → physical table as a tensor (kept Python-side so alloc and free do no tensor work)."""
        if self._v2p_tensor is None:
            self._v2p_tensor = torch.tensor(self.v2p, dtype=torch.long)
        return self._v2p_tensor

    def holes(self) -> int:
        """Free ids among the live span (ranks below the highest live one): what compaction would close."""
        return self._ranks.span() - (self.size - self._ranks.num_free)

    def compact(self) -> tuple[list[int], list[int]]:
        """Move every live id into the lowest ranks; returns (source, destination) physical ids to copy.

        With ``live`` ids live, the ranks at or above ``live`` that are live (the movers) are as
        many as the free ranks below ``live``, which are exactly the ones ``alloc`` pops first.
        """
        live = self.size - self._ranks.num_free
        movers = [r for r in range(live, self._ranks.span()) if self._ranks.is_live(r)]
        if not movers:
            return [], []
        targets = self._ranks.alloc(len(movers))
        self._ranks.free(movers)
        src = [self.size - 1 - r for r in movers]
        dst = [self.size - 1 - r for r in targets]
        virtual = [self.p2v[p] for p in src]
        for p in src:
            self.p2v[p] = -1
        self._map(virtual, dst)
        return src, dst

    def _map(self, virtual: list[int], physical: list[int]) -> None:
        for v, p in zip(virtual, physical):
            self.v2p[v] = p
            self.p2v[p] = v
        self._v2p_tensor = None

    def check_integrity(self) -> None:
        """Both id sets are consistent, equally many are live, and the tables are inverse on live ids."""
        self.virtual.check_integrity()
        self._ranks.check_integrity()
        live_virtual = self.virtual.live_ids()
        live_physical = self.size - self._ranks.num_free
        if len(live_virtual) != live_physical:
            raise PoolIntegrityError(f"{len(live_virtual)} live virtual {self.what}s, {live_physical} live physical")
        for v in live_virtual:
            p = self.v2p[v]
            if not 0 <= p < self.size or self.p2v[p] != v:
                back = self.p2v[p] if 0 <= p < self.size else "nothing"
                raise PoolIntegrityError(f"virtual {self.what} {v} maps to physical {p}, which maps back to {back}")
        for p, v in enumerate(self.p2v):
            if (v >= 0) != self._ranks.is_live(self.size - 1 - p):
                raise PoolIntegrityError(f"physical {self.what} {p} maps to virtual {v} but its liveness disagrees")


@dataclass(frozen=True, slots=True)
class UnifiedLayout:
    """Where every byte of the one buffer belongs; sizes are in elements of the pool dtype unless ``_bytes``."""

    num_pages: int
    page_size: int
    num_attn: int
    kv_heads: int
    head_dim: int
    num_state_slots: int
    num_mamba: int
    conv_shape: tuple[int, ...]
    ssm_shape: tuple[int, ...]
    itemsize: int

    @property
    def kv_block(self) -> int:
        """One attention layer's K (or V) of one page."""
        return self.page_size * self.kv_heads * self.head_dim

    @property
    def envelope(self) -> int:
        """One page's K and V for every attention layer."""
        return self.num_attn * 2 * self.kv_block

    @property
    def slot(self) -> int:
        """One state slot: conv then SSM state of every Mamba layer."""
        return self.num_mamba * (math.prod(self.conv_shape) + math.prod(self.ssm_shape))

    @property
    def state_base(self) -> int:
        """Start of the state-slot region, right after the last page envelope."""
        return self.num_pages * self.envelope

    @property
    def total_bytes(self) -> int:
        return (self.state_base + self.num_state_slots * self.slot) * self.itemsize

    def kv_offset(self, attn_layer: int, which: int) -> int:
        """Offset of layer ``attn_layer``'s K (``which`` 0) or V (1) inside an envelope."""
        return (2 * attn_layer + which) * self.kv_block

    def state_offset(self, mamba_layer: int, which: int) -> int:
        """Offset of layer ``mamba_layer``'s conv (``which`` 0) or SSM (1) state inside a slot."""
        conv = math.prod(self.conv_shape)
        return mamba_layer * (conv + math.prod(self.ssm_shape)) + which * conv

    def kv_view(self, typed: torch.Tensor, attn_layer: int, which: int) -> torch.Tensor:
        """K (0) or V (1) of one layer as (num_pages, page_size, kv_heads, head_dim), strided by the envelope."""
        shape = (self.num_pages, self.page_size, self.kv_heads, self.head_dim)
        stride = (self.envelope, *_contiguous_strides(shape[1:]))
        return typed.as_strided(shape, stride, self.kv_offset(attn_layer, which))

    def state_view(self, typed: torch.Tensor, mamba_layer: int, which: int) -> torch.Tensor:
        """Conv (0) or SSM (1) state of one layer as (num_state_slots, *state_shape), strided by the slot."""
        shape = self.ssm_shape if which else self.conv_shape
        stride = (self.slot, *_contiguous_strides(shape))
        return typed.as_strided((self.num_state_slots, *shape), stride, self.state_base + self.state_offset(mamba_layer, which))


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))


# Who owns which memory during compaction (the move that SGLang #33362 had to fence off):
# - Above the allocator (engine, radix cache, requests) only virtual ids are held, and a
#   live virtual id keeps its meaning across a move: compaction rewrites AddressTable only,
#   never a page table, cache node or request.
# - Physical ids leave the allocator only through to_physical / to_physical_state, into one
#   ForwardBatch that is built, used and dropped within one engine step. Moves happen only
#   inside alloc / free / compact, which the engine calls between steps, so no physical id
#   outlives a move.
# - During a move the allocator owns both ends: each destination is free (no virtual id maps
#   to it), each source is live until the tables switch and free after; the two sets are
#   disjoint, so one gather-then-scatter copy is safe. With poison on, the vacated sources
#   are poisoned at once, so anything that kept an old physical id reads NaN.
# - A reader that holds physical ids across steps (a PD transfer in flight: the decode side hands
#   its pages' physical ids to the prefill side, which writes into them steps later) breaks the
#   second rule. So PD runs this pool with lazy compaction and sets ``move_gate``, which refuses
#   every move while any transfer may be in flight (SGLang #33362's disagg_move_gate); holes then
#   simply wait for the next compaction.
class UnifiedPool:
    """KV pages and Mamba state slots in one byte buffer; virtual ids above, physical ids below.

    An issued page's whole envelope is zeroed (SGLang #33974: its bytes may hold anything);
    the fault ``unified_no_zero_on_issue`` skips that. ``poison`` fills the buffer with NaN
    at start-up and poisons freed and vacated pages and slots. State slots are not zeroed on
    issue: the engine zeroes (``zero_state``) or overwrites (``copy_state``) every new slot.
    ``compaction`` is "eager" (after every free) or "lazy" (on ``compact()``, or at alloc
    once holes pass LAZY_HOLE_FRACTION). Flags and faults are read once, here.
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
        compaction: str = "lazy",
    ) -> None:
        if compaction not in COMPACTION_MODES:
            raise ValueError(f"compaction={compaction!r} is not one of {', '.join(COMPACTION_MODES)}")
        self.page_size = page_size
        self.num_pages = num_pages
        self.num_state_slots = num_state_slots
        self.layout = UnifiedLayout(
            num_pages, page_size, len(model.attention_layers), model.num_kv_heads, model.head_dim,
            num_state_slots, len(model.mamba_layers), model.mamba.conv_state_shape(), model.mamba.ssm_state_shape(),
            dtype.itemsize,
        )
        self.buffer = torch.empty(self.layout.total_bytes, dtype=torch.uint8, device=device)
        typed = self.buffer.view(dtype)
        if poison:
            poison_(typed)
        else:
            self.buffer.zero_()
        self.pages = AddressTable(num_pages, "page")
        self.state_slots = AddressTable(num_state_slots, "state slot")
        self.compaction = compaction
        self._eager = compaction == "eager"
        #: when set and true, compaction moves nothing (a PD transfer may hold physical ids)
        self.move_gate: Callable[[], bool] | None = None
        self._build_views(typed)
        self._on_issue_pages = keep_memory if UNIFIED_NO_ZERO_ON_ISSUE.name in faults else self._zero_envelopes
        self._on_vacate_pages = self._poison_envelopes if poison else keep_memory
        self._on_vacate_slots = self._poison_slot_rows if poison else keep_memory

    def _build_views(self, typed: torch.Tensor) -> None:
        """Per-layer K/V and state views, and per-page / per-slot rows, all into ``typed`` (the buffer)."""
        lay = self.layout
        self._kv = [(lay.kv_view(typed, layer, 0), lay.kv_view(typed, layer, 1)) for layer in range(lay.num_attn)]
        self._states = [(lay.state_view(typed, layer, 0), lay.state_view(typed, layer, 1)) for layer in range(lay.num_mamba)]
        self._envelopes = typed[: lay.state_base].view(lay.num_pages, lay.envelope)
        self._slot_rows = typed[lay.state_base :].view(lay.num_state_slots, lay.slot)
        isz = lay.itemsize
        self._envelope_bytes = self.buffer[: lay.state_base * isz].view(lay.num_pages, lay.envelope * isz)
        self._slot_bytes = self.buffer[lay.state_base * isz :].view(lay.num_state_slots, lay.slot * isz)

    # -- allocation (virtual ids out and in; physical ids stay in the tables) -------------
    def alloc_pages(self, n: int) -> list[int] | None:
        """``n`` fresh virtual pages with zeroed envelopes, or None (nothing taken) when fewer are free."""
        if not self._eager and self.pages.holes() > LAZY_HOLE_FRACTION * self.num_pages:
            self._compact_pages()
        issued = self.pages.alloc(n)
        if issued is None:
            return None
        virtual, physical = issued
        if physical:
            self._on_issue_pages(physical)
        return virtual

    def free_pages(self, pages: Iterable[int]) -> None:
        """Take virtual pages back (poisoned when poison is on; compacted at once when eager)."""
        self._on_vacate_pages(self.pages.free(list(pages)))
        if self._eager:
            self._compact_pages()

    @property
    def num_free_pages(self) -> int:
        return self.pages.virtual.num_free

    def page_is_live(self, page: int) -> bool:
        return self.pages.virtual.is_live(page)

    def alloc_state_slot(self) -> int | None:
        """A fresh virtual state slot, or None when none is free; the engine zeroes or overwrites it."""
        if not self._eager and self.state_slots.holes() > LAZY_HOLE_FRACTION * self.num_state_slots:
            self._compact_slots()
        issued = self.state_slots.alloc(1)
        return issued[0][0] if issued else None

    def free_state_slots(self, slots: Iterable[int]) -> None:
        """Take virtual state slots back (poisoned when poison is on; compacted at once when eager)."""
        self._on_vacate_slots(self.state_slots.free(list(slots)))
        if self._eager:
            self._compact_slots()

    @property
    def num_free_state_slots(self) -> int:
        return self.state_slots.virtual.num_free

    # -- compaction -------------------------------------------------------------------
    def compact(self) -> int:
        """Pack live pages and state slots at the top of their physical ranges; returns how many moved."""
        return self._compact_pages() + self._compact_slots()

    def _compact_pages(self) -> int:
        return self._compact(self.pages, self._envelope_bytes, self._on_vacate_pages)

    def _compact_slots(self) -> int:
        return self._compact(self.state_slots, self._slot_bytes, self._on_vacate_slots)

    def _compact(self, table: AddressTable, rows: torch.Tensor, on_vacate: Callable[[list[int]], None]) -> int:
        """Renumber ``table``, then copy byte rows source → destination (disjoint, so gather then scatter is exact)."""
        if self.move_gate is not None and self.move_gate():
            return 0
        src, dst = table.compact()
        if src:
            rows.index_copy_(0, self._index(dst), rows.index_select(0, self._index(src)))
            on_vacate(src)
        return len(src)

    def _index(self, ids: list[int]) -> torch.Tensor:
        return torch.tensor(ids, dtype=torch.long, device=self.buffer.device)

    def _zero_envelopes(self, physical: list[int]) -> None:
        """The #33974 fix: one memset of every issued page's whole envelope, all layers, K and V."""
        self._envelope_bytes.index_fill_(0, self._index(physical), 0)

    def _poison_envelopes(self, physical: list[int]) -> None:
        poison_rows_(self._envelopes, 0, self._index(physical))

    def _poison_slot_rows(self, physical: list[int]) -> None:
        poison_rows_(self._slot_rows, 0, self._index(physical))

    # -- KV pages ---------------------------------------------------------------------
    def kv_views(self, attn_layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one attention layer, (num_pages, page_size, kv_heads, head_dim) strided views by physical page."""
        return self._kv[attn_layer]

    @property
    def bytes_per_page(self) -> int:
        """Bytes of one page envelope: K and V of every attention layer (``layout.envelope`` counts elements)."""
        return self.layout.envelope * self.layout.itemsize

    def to_physical(self, slots: torch.Tensor) -> torch.Tensor:
        """Virtual token slots → physical token slots; -1 stays -1. The one KV handoff point (#33517)."""
        keep = slots >= 0
        out_of_range = keep & (slots >= self.num_pages * self.page_size)
        if bool(out_of_range.any()):
            raise UnmappedIdError(f"virtual token slot {int(slots[out_of_range][0])} is beyond the pool's pages")
        page = torch.where(keep, slots // self.page_size, 0)
        physical_page = self.pages.v2p_tensor().to(slots.device)[page]
        unmapped = keep & (physical_page < 0)
        if bool(unmapped.any()):
            raise UnmappedIdError(f"virtual page {int(page[unmapped][0])} was never issued")
        return torch.where(keep, physical_page * self.page_size + slots % self.page_size, -1)

    def write_kv(self, attn_layer: int, out_cache_loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new tokens' K/V at their physical slots; slots of -1 are skipped."""
        write_paged_kv(*self.kv_views(attn_layer), self.page_size, out_cache_loc, k, v)

    # -- Mamba state slots ----------------------------------------------------------------
    def state_views(self, mamba_layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Conv and SSM states of one Mamba layer as strided views, indexed by physical state slot."""
        return self._states[mamba_layer]

    def to_physical_state(self, slots: Sequence[int]) -> list[int]:
        """Virtual state slots → physical ones: the one state handoff point."""
        return self.state_slots.translate(slots)

    def zero_state(self, slot: int) -> None:
        """Reset a slot (every Mamba layer) to the state of an empty prefix."""
        (phys,) = self.to_physical_state([slot])
        self._slot_bytes[phys].zero_()

    def copy_state(self, src: int, dst: int) -> None:
        """Copy every Mamba layer's state from slot ``src`` to slot ``dst`` (copy-on-write of a snapshot)."""
        p_src, p_dst = self.to_physical_state([src, dst])
        self._slot_bytes[p_dst] = self._slot_bytes[p_src]

    def transfer_geometry(self, regions: RegionTable) -> PoolGeometry:
        """Every layer's view into the one buffer; a page's blocks coalesce into its envelope, which moves whole."""
        return PoolGeometry.of(self._kv, self._states, regions, envelope=True)

    def check_integrity(self) -> None:
        """Raise PoolIntegrityError unless both address tables are consistent permutations on live ids."""
        self.pages.check_integrity()
        self.state_slots.check_integrity()


class EagerUnifiedPool(UnifiedPool):
    """The unified pool compacting after every free: a pool level the registry can name by import path."""

    def __init__(self, model: ModelConfig, **kwargs: Any) -> None:
        super().__init__(model, **{**kwargs, "compaction": "eager"})
