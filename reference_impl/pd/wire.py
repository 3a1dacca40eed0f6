"""What of a request crosses from prefill to decode: its KV blocks, its state blocks and one metadata record.

Each side describes itself once as a ``WireLayout`` (geometry only, no tensors: it crosses a
process boundary): every KV pool with the attention layers that move (the target's, the MTP
tail layer, the draft model's pool), the Mamba state of the target pool, the metadata slots and,
with staging, the staging buffer of each decode shard. Both sides enumerate a page's blocks with
the same functions in the same canonical order, so blocks pair one to one; a length that
differs is a layout mismatch and fails loudly (SGLang's item-length check).

The metadata record (SGLang's ``MetadataBuffers``) carries what the decode side needs besides
KV and state: the first output token with its logprob, top-k and margin, the cached-token counts
the client sees (the prefill side's), and the draft head's hidden at the last prompt position.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from reference_impl.memory.layout import (
    Block,
    PoolGeometry,
    RegionTable,
    TransferLayoutError,
    ViewGeometry,
    coalesce,
    page_blocks,
)
from reference_impl.memory.engine_pools import EnginePools
from reference_impl.request import RequestOutput
from reference_impl.spec.proposer import Proposer


@dataclass(frozen=True, slots=True)
class KVPart:
    """One KV pool of a side, the attention layers of it that move, and which of those are the proposer's."""

    geometry: PoolGeometry
    layers: tuple[int, ...]
    draft_layers: tuple[int, ...] = ()

    def moving(self, with_draft: bool) -> tuple[int, ...]:
        return self.layers if with_draft else tuple(layer for layer in self.layers if layer not in self.draft_layers)


@dataclass(frozen=True, slots=True)
class WireLayout:
    """One side's transferable memory: KV parts, state, metadata rows and (decode) staging rings per shard."""

    kv: tuple[KVPart, ...]
    state: PoolGeometry | None
    aux: ViewGeometry
    staging: tuple[ViewGeometry, ...]  # per decode shard: rows = staging slots (decode) or the one send row (prefill)
    shards: int
    chunk_pages: int
    staging_slots: int = 0


def kv_parts(pools: EnginePools, proposer: Proposer, regions: RegionTable) -> tuple[KVPart, ...]:
    """The KV pools of an engine: its target pool (every layer, the MTP tail among them) and a sidecar draft pool."""
    draft = {(id(pool), layer) for pool, layer in proposer.draft_kv()}
    parts = []
    for pool in pools.pools:
        geometry = pool.transfer_geometry(regions)
        layers = tuple(range(len(geometry.kv)))
        parts.append(KVPart(geometry, layers, tuple(layer for layer in layers if (id(pool), layer) in draft)))
    return tuple(parts)


def tagged_kv_blocks(layout: WireLayout, page: int, shard: int) -> list[tuple[Block, bool]]:
    """Every KV block of physical ``page`` for ``shard`` in canonical order, each marked if it is the proposer's."""
    return [
        (block, layer in part.draft_layers)
        for part in layout.kv for layer in part.layers
        for block in page_blocks(part.geometry, page, (layer,), shard, layout.shards)
    ]


def page_kv_blocks(layout: WireLayout, page: int, shard: int, with_draft: bool = True) -> list[Block]:
    """The KV blocks of physical ``page`` for ``shard``, coalesced (a unified pool's envelope is one block)."""
    return coalesce([block for block, is_draft in tagged_kv_blocks(layout, page, shard) if with_draft or not is_draft])


def piece_bytes(layout: WireLayout, shard: int) -> int:
    """Bytes of one page's KV for ``shard`` in a staging piece (draft layers included)."""
    return sum(block[2] for block, _ in tagged_kv_blocks(layout, 0, shard))


def pair_blocks(src: Sequence[Block], dst: Sequence[Block], what: str) -> list[tuple[Block, Block]]:
    """Blocks of the two sides, one to one; a count or a length that differs is a layout mismatch."""
    if len(src) != len(dst) or any(s[2] != d[2] for s, d in zip(src, dst)):
        lengths = sorted({s[2] for s in src}), sorted({d[2] for d in dst})
        raise TransferLayoutError(
            f"{what}: prefill side has {len(src)} blocks of {lengths[0]} bytes, decode side {len(dst)} of "
            f"{lengths[1]} (pools of different layouts, or KV heads split differently)"
        )
    return list(zip(src, dst))


def coalesce_pairs(pairs: Sequence[tuple[Block, Block]]) -> list[tuple[Block, Block]]:
    """Merge pairs whose source and destination both continue the previous pair's (the copies are disjoint,
    so their order is free): consecutive pages of a static pool then move as one block per layer."""
    merged: list[tuple[Block, Block]] = []
    for src, dst in sorted(pairs):
        if merged:
            (r0, s0, n0), (q0, d0, _) = merged[-1]
            if src[0] == r0 and dst[0] == q0 and src[1] == s0 + n0 and dst[1] == d0 + n0:
                merged[-1] = ((r0, s0, n0 + src[2]), (q0, d0, n0 + src[2]))
                continue
        merged.append((src, dst))
    return merged


#: fixed fields of a metadata record before top-k ids, top-k logprobs and the draft hidden
AUX_FIELDS = ("token", "logprob", "margin", "cached", "cached_device", "cached_host", "cached_storage")


def aux_width(topk: int, hidden: int) -> int:
    """float64 entries of one metadata record."""
    return len(AUX_FIELDS) + 2 * topk + hidden


def encode_aux(out: RequestOutput, draft_tail: torch.Tensor | None, topk: int, hidden: int) -> torch.Tensor:
    """The prefill side's record of a request's first token (float64 holds ids and fp32 values exactly)."""
    row = torch.zeros(aux_width(topk, hidden), dtype=torch.float64)
    fixed = [out.tokens[0], out.logprobs[0], out.margins[0], out.cached_tokens, out.cached_device, out.cached_host,
             out.cached_storage]
    row[: len(fixed)] = torch.tensor(fixed, dtype=torch.float64)
    k0 = len(fixed)
    row[k0 : k0 + topk] = torch.tensor(out.top_ids[0], dtype=torch.float64)
    row[k0 + topk : k0 + 2 * topk] = torch.tensor(out.top_logprobs[0], dtype=torch.float64)
    if hidden and draft_tail is not None:
        row[k0 + 2 * topk :] = draft_tail.detach().to("cpu", torch.float64)
    return row


def decode_aux(row: torch.Tensor, out: RequestOutput, topk: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """Fill ``out`` with the record's first token and cached counts; returns the draft hidden it carried."""
    values = row.tolist()
    fields = dict(zip(AUX_FIELDS, values))
    k0 = len(AUX_FIELDS)
    out.tokens.append(int(fields["token"]))
    out.logprobs.append(fields["logprob"])
    out.margins.append(fields["margin"])
    out.top_ids.append([int(t) for t in values[k0 : k0 + topk]])
    out.top_logprobs.append(values[k0 + topk : k0 + 2 * topk])
    out.cached_tokens, out.cached_device = int(fields["cached"]), int(fields["cached_device"])
    out.cached_host, out.cached_storage = int(fields["cached_host"]), int(fields["cached_storage"])
    return row[k0 + 2 * topk :].to(device=device, dtype=dtype)
