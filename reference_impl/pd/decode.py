"""The decode server: preallocates for a request, lets the prefill side write into it, then decodes it.

Who owns what, from bootstrap to adoption (the handoff SGLang #33362 had to fence off):
- ``bootstrap`` takes, on the decode side, the request's pages (its own prefix hit, locked in its
  radix cache, plus fresh pages for the rest of the prompt), a Mamba slot, a metadata slot and,
  with staging, one ring slot per grid cell. It translates the fresh pages and the slot to
  physical ids once, here, and hands those to the prefill side.
- From then until ``receive`` sees the last chunk (or ``abort``), the prefill side may write into
  those physical pages and slots at any time: nothing may move them. The pools' move gate refuses
  every compaction while any request is preallocated, and PD runs the unified pool lazily.
- The last chunk hands everything to the decode engine: the request joins its running batch with
  the first token from the metadata record. An aborted request's memory goes back unread: its
  pages are freed, never inserted into the cache, whatever part of them arrived.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from reference_impl.config import EngineConfig
from reference_impl.engine.llm_engine import Engine
from reference_impl.faults import PD_ABORT_CACHES_PAGES, PD_COMPACTION_IN_FLIGHT, PD_VIRTUAL_IDS_ON_WIRE
from reference_impl.memory.engine_pools import EnginePools
from reference_impl.memory.layout import Block, RegionTable, ViewGeometry
from reference_impl.memory.pool import MovingPool, Pool, physical_pages
from reference_impl.memory.static import IdAllocator
from reference_impl.pd.handoff import Bootstrap, ChunkHeader, TransferStateError
from reference_impl.pd.staging import StagingRing, grid_cells
from reference_impl.pd.wire import WireLayout, aux_width, decode_aux, kv_parts, page_kv_blocks, piece_bytes
from reference_impl.request import Phase, Request, RequestOutput, RequestSpec

#: metadata slots: how many requests may be preallocated at once
AUX_SLOTS = 64


def chunk_pages(config: EngineConfig) -> int:
    """Pages per grid cell: one chunked-prefill step's worth (SGLang's full_chunk_pages)."""
    return max(1, config.prefill_budget // config.page_size)


def gate_moves(pools: EnginePools, in_flight: Callable[[], bool], faults: frozenset[str]) -> None:
    """Install the move gate on every pool of ``pools`` that moves pages (refuse moves while ``in_flight()``)."""
    for pool in pools.pools:
        if not isinstance(pool, MovingPool):
            continue
        if pool.compaction != "lazy":
            raise ValueError(f"PD needs the unified pool's lazy compaction, not {pool.compaction!r}: "
                             "an eager pool moves pages on every free, under a transfer in flight")
        if PD_COMPACTION_IN_FLIGHT.name not in faults:  # the fault: no gate (SGLang #33362 before the fix)
            pool.move_gate = in_flight


def handoff_pages(pools: Pool, pages: list[int], faults: frozenset[str]) -> list[int]:
    """The one translation of a handoff; the fault ``pd_virtual_ids_on_wire`` skips it."""
    return list(pages) if PD_VIRTUAL_IDS_ON_WIRE.name in faults else physical_pages(pools, pages)


def handoff_state(pools: Pool, slot: int, faults: frozenset[str]) -> int:
    """A state slot's physical id, translated at the handoff like the pages (the same fault skips it)."""
    return slot if PD_VIRTUAL_IDS_ON_WIRE.name in faults else pools.to_physical_state([slot])[0]


def copy_blocks(regions: RegionTable, blocks: list[Block], source: torch.Tensor) -> None:
    """Write ``source`` bytes, in order, into ``blocks`` of ``regions``."""
    pos = 0
    for region, offset, length in blocks:
        regions.regions[region][offset : offset + length].copy_(source[pos : pos + length])
        pos += length


class DecodeEngine(Engine):
    """A decode server's engine: requests arrive with their prompt's KV computed elsewhere."""

    def preallocate(self, spec: RequestSpec) -> Request | None:
        """A request holding its prefix hit and pages for its whole prompt (and a Mamba slot); None holds nothing."""
        req = self.new_request(spec)
        return req if self.acquire(req) is not None else None

    def adopt(self, req: Request, aux_row: torch.Tensor, outputs: list[RequestOutput]) -> None:
        """The last chunk arrived: continue decoding after the first token the prefill side sampled."""
        cfg = self.config
        tail = decode_aux(aux_row, req.output, cfg.topk, cfg.dtype, cfg.device)
        req.draft_tail = tail if tail.numel() else None
        req.num_computed = len(req.spec.prompt)
        req.admitted_once = True
        req.phase = Phase.RUNNING
        self.running.append(req)
        if req.done:
            self._complete(req, outputs)

    def drop(self, req: Request, as_landed: bool = False) -> None:
        """An aborted transfer: free the request's pages and slot unread (never cached).

        ``as_landed`` is the fault ``pd_abort_caches_pages``: the prompt's pages go to the cache as if they had arrived.
        """
        if as_landed:
            req.num_computed = len(req.spec.prompt)
            self._finish(req)
            return
        self._release(req)


@dataclass(slots=True)
class Preallocated:
    req: Request
    bootstrap: Bootstrap
    chunks: int = 0


class DecodeServer:
    """The decode side of PD: bootstrap, receive, abort, step; its memory is described by ``layout``."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.engine = DecodeEngine(config)
        self.faults = config.faults
        self.preallocated: dict[str, Preallocated] = {}
        self.finished: list[RequestOutput] = []  # adopted requests that needed no decode step
        self.gate_refusals = 0
        self.counts = {"aux_taken": 0, "aux_returned": 0}  # metadata slots taken and given back (the ring counts its own)
        gate_moves(self.engine.pools, self._moves_refused, config.faults)
        self.regions = RegionTable()
        parts = kv_parts(self.engine.pools, self.engine.proposer, self.regions)
        hidden = config.model.hidden if self.engine.proposer.draft_kv() else 0
        self.aux = torch.zeros(AUX_SLOTS, aux_width(config.topk, hidden), dtype=torch.float64)
        self.aux_slots = IdAllocator(AUX_SLOTS, "metadata slot")
        pages = chunk_pages(config)
        self.layout = WireLayout(parts, parts[0].geometry, ViewGeometry.of(self.aux, self.regions), (),
                                 config.decode_tp, pages)
        self.ring: StagingRing | None = None
        self.staging: list[torch.Tensor] = []
        if config.pd_staging:
            slots = -(-config.num_pages // pages) + 1  # room for the largest request the pool can hold
            self.ring = StagingRing(slots, pages)
            self.staging = [torch.zeros(slots, pages * piece_bytes(self.layout, h), dtype=torch.uint8)
                            for h in range(config.decode_tp)]
            self.layout = replace(self.layout, staging=tuple(ViewGeometry.of(b, self.regions) for b in self.staging),
                                  staging_slots=slots)

    # -- the handoff ---------------------------------------------------------------------
    def _moves_refused(self) -> bool:
        """The move gate: no page may move while any preallocated request's physical ids are out."""
        if self.preallocated:
            self.gate_refusals += 1
            return True
        return False

    def bootstrap(self, spec: RequestSpec, attempt: int) -> Bootstrap | None:
        """Preallocate for ``spec`` and answer with physical ids; None (nothing held) while there is no room."""
        engine = self.engine
        if len(engine.running) + len(self.preallocated) >= self.config.max_running or not self.aux_slots.num_free:
            return None
        req = engine.preallocate(spec)
        if req is None:
            return None
        hit_pages = req.num_computed // self.config.page_size
        region = None
        if self.ring is not None:
            region = self.ring.reserve(hit_pages, len(req.pages))
            if region is None:
                engine.drop(req)
                return None
        (aux_slot,) = self.aux_slots.alloc(1)
        self.counts["aux_taken"] += 1
        pools = engine.pools
        state = handoff_state(pools, req.state_slot, self.faults) if req.state_slot is not None else None
        boot = Bootstrap(spec.rid, attempt, hit_pages, tuple(handoff_pages(pools, req.pages[hit_pages:], self.faults)),
                         state, aux_slot, region)
        self.preallocated[spec.rid] = Preallocated(req, boot)
        return boot

    def receive(self, header: ChunkHeader) -> None:
        """A chunk arrived: scatter it from staging (if any); the last one hands the request to the engine."""
        entry = self._entry(header.rid, header.attempt)
        if header.index != entry.chunks:
            raise TransferStateError(f"{header.rid}: chunk {header.index} arrived, expected {entry.chunks}")
        entry.chunks += 1
        if self.ring is not None and header.num_pages:
            self._scatter(entry.bootstrap, header)
        if header.last:
            del self.preallocated[header.rid]
            self._free_handoff(entry.bootstrap)
            self.engine.adopt(entry.req, self.aux[entry.bootstrap.aux_slot].clone(), self.finished)

    def abort(self, rid: str, attempt: int) -> tuple[int, ...]:
        """The transfer failed: free everything it held; nothing it wrote is read.

        Returns the pages the attempt took past its hit that are still live afterwards (cached or held):
        the ledger's record that an abort left nothing behind, empty when it did not.
        """
        entry = self._entry(rid, attempt)
        del self.preallocated[rid]
        self._free_handoff(entry.bootstrap)
        fresh = entry.req.pages[entry.bootstrap.decode_prefix_pages:]
        self.engine.drop(entry.req, as_landed=PD_ABORT_CACHES_PAGES.name in self.faults)
        return tuple(p for p in fresh if self.engine.pools.page_is_live(p))

    def _entry(self, rid: str, attempt: int) -> Preallocated:
        entry = self.preallocated.get(rid)
        if entry is None or entry.bootstrap.attempt != attempt:
            raise TransferStateError(f"decode side holds no transfer {rid!r} attempt {attempt}")
        return entry

    def _free_handoff(self, boot: Bootstrap) -> None:
        self.aux_slots.free([boot.aux_slot])
        self.counts["aux_returned"] += 1
        if boot.staging is not None:
            self.ring.release(boot.staging)

    def _scatter(self, boot: Bootstrap, header: ChunkHeader) -> None:
        """Copy each arrived page from its staging slot into the pool, shard by shard (scatter by arrival)."""
        pages = self.layout.chunk_pages
        for cell, first, count in grid_cells(header.start_page, header.start_page + header.num_pages, pages):
            slot = self.ring.slot(boot.staging, cell)
            for shard, buffer in enumerate(self.staging):
                piece = piece_bytes(self.layout, shard)
                for page in range(first, first + count):
                    dst = boot.dst_pages[page - boot.decode_prefix_pages]
                    start = (page - cell * pages) * piece
                    copy_blocks(self.regions, page_kv_blocks(self.layout, dst, shard), buffer[slot, start : start + piece])

    # -- the engine ------------------------------------------------------------------------
    def step(self, outputs: list[RequestOutput]) -> bool:
        """One decode-engine step; also hands back requests that finished on arrival (one token asked)."""
        done, self.finished = self.finished, []
        outputs.extend(done)
        return self.engine.step(outputs) or bool(done)

    def has_work(self) -> bool:
        return self.engine.has_work() or bool(self.preallocated) or bool(self.finished)

    def audit(self) -> list[str]:
        """The engine's idle audit, plus every metadata slot and staging slot back."""
        problems = self.engine.audit()
        if self.preallocated:
            problems.append(f"{len(self.preallocated)} request(s) still preallocated: {sorted(self.preallocated)}")
        try:
            self.aux_slots.check_integrity()
            if self.aux_slots.num_free != AUX_SLOTS:
                problems.append(f"metadata slots leaked: {AUX_SLOTS - self.aux_slots.num_free} held")
            if self.ring is not None:
                self.ring.check_integrity()
        except AssertionError as exc:
            problems.append(str(exc))
        return problems

    def engine_stats(self) -> object:
        return self.engine.stats

    def nan_events(self) -> list:
        return list(self.engine.nan_events)

    def counters(self) -> dict[str, int]:
        """What the decode side can tell about itself (the rest is counted by the prefill side)."""
        return {"gate_refusals": self.gate_refusals,
                "verify_scratch_bytes": self.engine.verify_scratch.nbytes if self.engine.verify_scratch else 0,
                "staging_reserved": self.ring.reserved if self.ring else 0,
                "staging_released": self.ring.released if self.ring else 0, **self.counts}

    def close(self) -> None:
        """An in-process server holds nothing outside this process."""
