"""Where a pool's pages and state slots lie in memory, as byte blocks a transfer can move.

A transfer engine addresses raw bytes (``ptr + offset``), outside any pool's own indexing:
SGLang hands its transfer backends ``kv_data_ptrs`` and item lengths, vLLM's NIXL connector
registers every KV tensor and computes block addresses. Here a pool describes itself once as
a ``PoolGeometry`` over the regions it registered in a ``RegionTable``; ``page_blocks`` and
``state_blocks`` then turn a *physical* page or slot into (region, offset, bytes) blocks, on
either side of a transfer, with no pool object at hand (the decode side may be another process).

Blocks come in a canonical order (layer, K before V, token, head slice), so the blocks of one
page on the sending side pair one to one with the receiving side's, whatever the two pools'
layouts, as long as each block has the same length on both sides (vLLM #48414's canonical
layout, decoupled from the parallel topology). A unified pool's blocks of one page coalesce into
its envelope, so an envelope moves whole (SGLang #33362); an envelope cannot be cut into head
slices for a decode side whose KV heads are split over shards, and asking for it is an error.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: (region id, byte offset in the region, length in bytes)
Block = tuple[int, int, int]


class TransferLayoutError(ValueError):
    """A pool layout a transfer cannot move as asked (an envelope cut into head slices, mismatched lengths)."""


class RegionTable:
    """The memory one side exposes to transfers, by id: a uint8 view of each registered tensor's storage."""

    def __init__(self) -> None:
        self.regions: list[torch.Tensor] = []
        self._ids: dict[int, int] = {}

    def add(self, tensor: torch.Tensor) -> int:
        """The id of the region holding ``tensor``'s storage, registering it on first sight."""
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in self._ids:
            region = torch.empty(0, dtype=torch.uint8, device=tensor.device)
            region.set_(storage, 0, (storage.nbytes(),))
            self._ids[key] = len(self.regions)
            self.regions.append(region)
        return self._ids[key]

    def addresses(self) -> list[tuple[int, int]]:
        """(address, bytes) of every region, in id order: what a transfer engine registers."""
        return [(r.data_ptr(), r.numel()) for r in self.regions]


@dataclass(frozen=True, slots=True)
class ViewGeometry:
    """One (rows, *inner) tensor view inside a region: row ``i`` starts ``base + i * row_stride`` bytes in."""

    region: int
    base: int
    row_stride: int
    inner_shape: tuple[int, ...]
    inner_strides: tuple[int, ...]  # in bytes
    itemsize: int

    @classmethod
    def of(cls, view: torch.Tensor, regions: RegionTable) -> ViewGeometry:
        """Describe ``view`` (rows first), registering its storage in ``regions``."""
        isz = view.element_size()
        return cls(regions.add(view), view.storage_offset() * isz, view.stride(0) * isz, tuple(view.shape[1:]),
                   tuple(s * isz for s in view.stride()[1:]), isz)

    @property
    def row_bytes(self) -> int:
        return math.prod(self.inner_shape) * self.itemsize

    @property
    def contiguous_rows(self) -> bool:
        """Whether one row's bytes are one contiguous block."""
        expect = self.itemsize
        for size, stride in zip(reversed(self.inner_shape), reversed(self.inner_strides)):
            if size > 1 and stride != expect:
                return False
            expect *= size
        return True


@dataclass(frozen=True, slots=True)
class PoolGeometry:
    """Every attention layer's K and V page views and every Mamba layer's state views of one pool.

    ``kv[l]`` is (K, V) of attention layer ``l`` with rows = physical pages and inner shape
    (page_size, kv_heads, head_dim); ``state[m]`` is (conv, SSM) of Mamba layer ``m`` with rows =
    physical state slots. ``envelope`` is True for a unified pool, whose page blocks must move whole.
    """

    kv: tuple[tuple[ViewGeometry, ViewGeometry], ...]
    state: tuple[tuple[ViewGeometry, ViewGeometry], ...]
    envelope: bool = False

    @classmethod
    def of(
        cls, kv_views: Sequence[tuple[torch.Tensor, torch.Tensor]],
        state_views: Sequence[tuple[torch.Tensor, torch.Tensor]], regions: RegionTable, envelope: bool = False,
    ) -> PoolGeometry:
        return cls(
            tuple((ViewGeometry.of(k, regions), ViewGeometry.of(v, regions)) for k, v in kv_views),
            tuple((ViewGeometry.of(c, regions), ViewGeometry.of(s, regions)) for c, s in state_views),
            envelope,
        )

    @property
    def kv_heads(self) -> int:
        return self.kv[0][0].inner_shape[1] if self.kv else 0


def coalesce(blocks: list[Block]) -> list[Block]:
    """Merge blocks that continue each other in the same region."""
    merged: list[Block] = []
    for region, offset, length in blocks:
        if merged and merged[-1][0] == region and merged[-1][1] + merged[-1][2] == offset:
            merged[-1] = (region, merged[-1][1], merged[-1][2] + length)
        else:
            merged.append((region, offset, length))
    return merged


def shard_heads(kv_heads: int, shard: int, shards: int) -> range:
    """KV heads of ``shard`` out of ``shards`` attention-TP ranks; fewer heads than ranks are replicated."""
    if shards <= kv_heads:
        if kv_heads % shards:
            raise TransferLayoutError(f"{kv_heads} KV heads do not split over {shards} shards")
        per = kv_heads // shards
        return range(shard * per, (shard + 1) * per)
    head = shard * kv_heads // shards
    return range(head, head + 1)


def page_blocks(geom: PoolGeometry, page: int, layers: Sequence[int], shard: int = 0, shards: int = 1) -> list[Block]:
    """Blocks of physical ``page`` for attention ``layers`` (K then V each), cut to ``shard``'s KV heads."""
    if shards > 1 and geom.envelope:
        raise TransferLayoutError(
            "a unified pool's page envelope moves whole and cannot be cut into head slices for "
            f"{shards} decode shards (SGLang #33362: envelopes are not TP-resliced)"
        )
    blocks: list[Block] = []
    for layer in layers:
        for view in geom.kv[layer]:
            row = view.base + page * view.row_stride
            if shards == 1 and view.contiguous_rows:
                blocks.append((view.region, row, view.row_bytes))
                continue
            page_size, _, head_dim = view.inner_shape
            heads = shard_heads(view.inner_shape[1], shard, shards)
            token_stride, head_stride, dim_stride = view.inner_strides
            if dim_stride != view.itemsize or (len(heads) > 1 and head_stride != head_dim * view.itemsize):
                raise TransferLayoutError("a head slice of a page is not contiguous in this pool")
            for token in range(page_size):
                start = row + token * token_stride + heads.start * head_stride
                blocks.append((view.region, start, len(heads) * head_dim * view.itemsize))
    return coalesce(blocks)


def state_blocks(geom: PoolGeometry, slot: int) -> list[Block]:
    """Blocks of physical state ``slot``: every Mamba layer's conv then SSM state (whole, never sliced)."""
    blocks: list[Block] = []
    for pair in geom.state:
        for view in pair:
            if not view.contiguous_rows:
                raise TransferLayoutError("a state slot of this pool is not contiguous")
            blocks.append((view.region, view.base + slot * view.row_stride, view.row_bytes))
    return coalesce(blocks)
