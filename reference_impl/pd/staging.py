"""The decode side's staging buffer: a ring of chunk-sized slots on an even chunk grid (SGLang #30545).

When the two sides split KV heads differently, the prefill side cannot write a page straight
into the decode side's pool: it gathers the head slices of every layer of a chunk's pages into
one contiguous region per decode shard, and the decode side scatters each chunk into its own
pages when it arrives. A request's pages are cut on an even grid of ``chunk_pages`` pages; grid
cell ``g`` holds pages ``g*chunk_pages .. (g+1)*chunk_pages - 1``. Each transfer reserves one
ring slot per grid cell it sends, starting from the cell of its first page (the decode side's
prefix hit may start that mid-grid), so the slot of cell ``g`` is ``base + g - first_cell``.

The ring hands out regions first in, first out; ``watermark`` is the oldest slot still held. A
region is only reserved while everything from the watermark up to it is free, so a transfer
waits (stays BOOTSTRAPPING) until the decode side has scattered enough of the earlier ones.
"""
from __future__ import annotations

from collections import OrderedDict

from reference_impl.pd.handoff import StagingRegion


class StagingIntegrityError(AssertionError):
    """A staging region was freed twice, or regions are still held when the decode side is idle."""


def grid_cells(start_page: int, end_page: int, chunk_pages: int) -> list[tuple[int, int, int]]:
    """(cell, first page, pages) of ``start_page .. end_page - 1`` cut on the chunk grid."""
    cuts = []
    page = start_page
    while page < end_page:
        cell = page // chunk_pages
        stop = min(end_page, (cell + 1) * chunk_pages)
        cuts.append((cell, page, stop - page))
        page = stop
    return cuts


class StagingRing:
    """Slot allocator of one ring: regions of consecutive slots (mod size), reserved and released FIFO."""

    def __init__(self, slots: int, chunk_pages: int) -> None:
        if slots < 1 or chunk_pages < 1:
            raise ValueError(f"a staging ring needs slots >= 1 and chunk_pages >= 1, got {slots}, {chunk_pages}")
        self.slots = slots
        self.chunk_pages = chunk_pages
        self.head = 0       # next slot to hand out (monotonic; position = head % slots)
        self.watermark = 0  # oldest slot still held (monotonic)
        self._held: OrderedDict[int, tuple[int, bool]] = OrderedDict()  # base -> (cells, released)
        self.reserved = 0   # regions handed out, ever (the PD ledger's count)
        self.released = 0   # regions given back, ever

    def cells_for(self, decode_prefix_pages: int, total_pages: int) -> tuple[int, int]:
        """(first cell, cells) a transfer of pages ``decode_prefix_pages .. total_pages - 1`` needs."""
        first = decode_prefix_pages // self.chunk_pages
        last = (total_pages - 1) // self.chunk_pages
        return first, last - first + 1

    def reserve(self, decode_prefix_pages: int, total_pages: int) -> StagingRegion | None:
        """Slots for one transfer, or None while the ring is full up to the watermark."""
        first, cells = self.cells_for(decode_prefix_pages, total_pages)
        if cells > self.slots:
            raise ValueError(f"a transfer of {cells} chunks cannot fit a staging ring of {self.slots} slots")
        if self.head + cells - self.watermark > self.slots:
            return None
        base = self.head
        self.head += cells
        self._held[base] = (cells, False)
        self.reserved += 1
        return StagingRegion(base, first, cells)

    def release(self, region: StagingRegion) -> None:
        """The decode side is done with ``region``; the watermark passes every released region at the front."""
        cells, released = self._held.get(region.base, (0, True))
        if released:
            raise StagingIntegrityError(f"staging region at slot {region.base} released twice or never reserved")
        self._held[region.base] = (cells, True)
        self.released += 1
        while self._held and next(iter(self._held.values()))[1]:
            base, (n, _) = self._held.popitem(last=False)
            self.watermark = base + n

    def slot(self, region: StagingRegion, cell: int) -> int:
        """Ring position of grid cell ``cell`` of ``region``."""
        return (region.base + cell - region.first_cell) % self.slots

    def check_integrity(self) -> None:
        """Idle: every region released and the watermark caught up with the head."""
        if self._held or self.watermark != self.head:
            raise StagingIntegrityError(
                f"staging ring not drained: {len(self._held)} region(s) held, watermark {self.watermark}, head {self.head}"
            )
