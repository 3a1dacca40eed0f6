"""The prefill side: an engine that computes prompts and one token, and the sender that ships them.

Who owns what on this side: a request is prefilled like any other (its own pages, its prefix
hit locked in this side's radix cache); once it has sampled its first token it is *parked*
(``inflight``), still holding every page, until its last chunk has left. Only then is its prompt
inserted into the prefill side's cache and the rest freed. A page is sent once it is whole
(the partial last page waits for the last chunk), and only from the decode side's own prefix hit
on. Physical ids of this side are translated once per chunk, when the chunk is sent.
"""
from __future__ import annotations

import random
from dataclasses import replace

import torch

from reference_impl.config import EngineConfig
from reference_impl.cache.radix import MatchResult
from reference_impl.engine.llm_engine import Engine
from reference_impl.faults import PD_DRAFT_STATE_NOT_SENT, PD_MAMBA_STATE_EARLY, PD_STAGING_GRID_SHIFT
from reference_impl.memory.layout import Block, RegionTable, ViewGeometry, state_blocks
from reference_impl.pd.decode import gate_moves, handoff_pages, handoff_state
from reference_impl.pd.handoff import IN_FLIGHT, ChunkHeader, Transfer, TransferFailed, TransferState
from reference_impl.pd.staging import grid_cells
from reference_impl.pd.wire import (
    WireLayout,
    aux_width,
    coalesce_pairs,
    encode_aux,
    kv_parts,
    page_kv_blocks,
    pair_blocks,
    piece_bytes,
    tagged_kv_blocks,
)
from reference_impl.request import Request, RequestOutput

Pair = tuple[Block, Block]


class PrefillEngine(Engine):
    """Runs each request to its first token, then parks it until its KV has been sent (it never verifies)."""

    verifies = False

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.inflight: dict[str, Request] = {}
        self.hits: dict[str, tuple[int, int, int]] = {}  # rid -> (total, host, storage) matched at first admission

    def acquire(self, req: Request) -> MatchResult | None:
        """Admit as any engine does, and keep this side's own record of the hit (what the client must see)."""
        match = super().acquire(req)
        if match is not None:
            self.hits.setdefault(req.rid, (match.matched_tokens, match.host_tokens, match.storage_tokens))
        return match

    def _complete(self, req: Request, outputs: list[RequestOutput]) -> None:
        """Park: the request keeps its pages (nothing may free or move them) until the transfer ends."""
        self.running.remove(req)
        self.inflight[req.rid] = req

    def request(self, rid: str) -> Request | None:
        """The running or parked request ``rid`` (None while it still waits in the queue)."""
        return self.inflight.get(rid) or next((r for r in self.running if r.rid == rid), None)

    def release(self, rid: str) -> tuple[int, int, int] | None:
        """The last chunk left: cache the prompt, free the rest; returns the hit recorded at admission."""
        self._finish(self.inflight.pop(rid))
        return self.hits.pop(rid, None)

    def abort(self, rid: str) -> None:
        """The transfer failed: its computed prompt pages are still good KV, so cache them; free the rest."""
        self.hits.pop(rid, None)
        req = self.inflight.pop(rid, None) or self.request(rid)
        if req is not None:
            self._finish(req)


class KVSender:
    """Cuts what a prefill request computed into chunks of paired blocks and writes them through the transport."""

    def __init__(self, engine: PrefillEngine, decode: WireLayout, transport: object, config: EngineConfig) -> None:
        self.engine = engine
        self.decode = decode
        self.transport = transport
        self.faults = config.faults
        self.fail_rate = config.pd_fail_rate
        self.regions = RegionTable()
        parts = kv_parts(engine.pools, engine.proposer, self.regions)
        self.hidden = config.model.hidden if engine.proposer.draft_kv() else 0
        self.aux = torch.zeros(1, aux_width(config.topk, self.hidden), dtype=torch.float64)
        layout = WireLayout(parts, parts[0].geometry, ViewGeometry.of(self.aux, self.regions), (), decode.shards,
                            decode.chunk_pages)
        self.send_buffers = [torch.zeros(1, decode.chunk_pages * piece_bytes(layout, h), dtype=torch.uint8)
                             for h in range(decode.shards)] if decode.staging else []
        self.layout = replace(layout, staging=tuple(ViewGeometry.of(b, self.regions) for b in self.send_buffers))
        gate_moves(engine.pools, self.in_flight, config.faults)
        self._transfers: dict[str, Transfer] = {}

    def in_flight(self) -> bool:
        """The prefill side's move gate: a page may not move while any transfer has its physical ids out."""
        return any(t.state in IN_FLIGHT for t in self._transfers.values())

    def track(self, transfer: Transfer) -> None:
        self._transfers[transfer.rid] = transfer

    def untrack(self, transfer: Transfer) -> None:
        self._transfers.pop(transfer.rid, None)

    # -- one chunk -------------------------------------------------------------------------
    def send(self, t: Transfer, req: Request, end_page: int, last: bool) -> None:
        """Send pages ``t.next_page .. end_page - 1`` of ``req`` (and, when ``last``, its state and record)."""
        start = t.next_page
        physical = handoff_pages(self.engine.pools, req.pages[start:end_page], self.faults)
        # a last chunk with no page left to send still carries the state and the record: one piece, no pages
        pieces = (grid_cells(start, end_page, self.decode.chunk_pages) if self.decode.staging else []) \
            or [(None, start, end_page - start)]
        for i, (cell, first, count) in enumerate(pieces):
            final = last and i == len(pieces) - 1
            own = physical[first - start : first - start + count]
            pairs = self._staged(t, cell, first, own) if cell is not None else self._direct(t, first, own)
            self._write(t, pairs, first, count, final, req)
        t.next_page = end_page

    def _direct(self, t: Transfer, first: int, own: list[int]) -> list[Pair]:
        """Every KV block of the pages, straight into the decode side's pages."""
        boot = t.bootstrap
        start = first - boot.decode_prefix_pages
        return self.page_pairs(own, list(boot.dst_pages[start : start + len(own)]),
                               with_draft=PD_DRAFT_STATE_NOT_SENT.name not in self.faults)

    def page_pairs(self, src_pages: list[int], dst_pages: list[int], with_draft: bool = True) -> list[Pair]:
        """Block pairs moving physical ``src_pages`` into the decode side's physical ``dst_pages``, shard by
        shard; within a shard, blocks that continue each other on both sides merge (never across shards,
        which on a real decode side are different ranks)."""
        pairs: list[Pair] = []
        for shard in range(self.decode.shards):
            pairs += coalesce_pairs([
                pair for src, dst in zip(src_pages, dst_pages)
                for pair in pair_blocks(page_kv_blocks(self.layout, src, shard, with_draft),
                                        page_kv_blocks(self.decode, dst, shard, with_draft), f"page {src}")
            ])
        return pairs

    def _staged(self, t: Transfer, cell: int, first: int, own: list[int]) -> list[Pair]:
        """Gather the pages' head slices per shard into one contiguous piece, written into the cell's staging slot."""
        boot = t.bootstrap
        region = boot.staging
        # the even grid: SGLang #30545 located the slot by the absolute chunk index start_page // chunk_pages
        offset = cell if PD_STAGING_GRID_SHIFT.name in self.faults else cell - region.first_cell
        slot = (region.base + offset) % self.decode.staging_slots
        within = first - cell * self.decode.chunk_pages
        pairs = []
        for shard, buffer in enumerate(self.send_buffers):
            piece = piece_bytes(self.layout, shard)
            for i, page in enumerate(own):
                self._gather(page, shard, buffer[0, i * piece : (i + 1) * piece])
            ring = self.decode.staging[shard]
            dst = (ring.region, ring.base + slot * ring.row_stride + within * piece, len(own) * piece)
            src = (self.layout.staging[shard].region, self.layout.staging[shard].base, len(own) * piece)
            pairs.append((src, dst))
        return pairs

    def _gather(self, page: int, shard: int, out: torch.Tensor) -> None:
        """One page's canonical piece for ``shard``; under ``pd_draft_state_not_sent`` the draft's bytes stay zero."""
        skip_draft = PD_DRAFT_STATE_NOT_SENT.name in self.faults
        pos = 0
        for (region, offset, length), is_draft in tagged_kv_blocks(self.layout, page, shard):
            if skip_draft and is_draft:
                out[pos : pos + length].zero_()
            else:
                out[pos : pos + length].copy_(self.regions.regions[region][offset : offset + length])
            pos += length

    def _extras(self, t: Transfer, req: Request, first: bool, final: bool) -> list[Pair]:
        """The non-KV state: the Mamba state (with the last chunk) and the metadata record (last chunk)."""
        pairs: list[Pair] = []
        boot = t.bootstrap
        state_now = first if PD_MAMBA_STATE_EARLY.name in self.faults else final
        if req.state_slot is not None and state_now:
            src = handoff_state(self.engine.pools, req.state_slot, self.faults)
            pairs += pair_blocks(state_blocks(self.layout.state, src), state_blocks(self.decode.state, boot.dst_state_slot),
                                 "Mamba state")
        if final:
            self.aux[0] = encode_aux(req.output, req.draft_tail, self.engine.config.topk, self.hidden)
            aux, dst = self.layout.aux, self.decode.aux
            pairs.append(((aux.region, aux.base, aux.row_bytes), (dst.region, dst.base + boot.aux_slot * dst.row_stride, dst.row_bytes)))
        return pairs

    def _write(self, t: Transfer, kv: list[Pair], first: int, count: int, final: bool, req: Request) -> None:
        """Write one chunk and notify; an injected failure writes part of it and raises TransferFailed."""
        pairs = kv + self._extras(t, req, t.chunks == 0, final)
        header = ChunkHeader(t.rid, t.attempt, t.chunks, first, count, final)
        rng = random.Random(f"{t.rid}/{t.attempt}/{t.chunks}")
        if self.fail_rate and rng.random() < self.fail_rate:
            self.transport.write(pairs[: len(pairs) // 2], None)
            raise TransferFailed(f"chunk {t.chunks} of {t.rid} (attempt {t.attempt}) lost in transport")
        if t.state is TransferState.WAITING_FOR_INPUT:
            t.advance(TransferState.TRANSFERRING)
        self.transport.write(pairs, header)
        t.kv_bytes += sum(src[2] for src, _ in kv)
        t.chunks += 1
        t.pages_sent += count
        t.bytes_sent += sum(src[2] for src, _ in pairs)

