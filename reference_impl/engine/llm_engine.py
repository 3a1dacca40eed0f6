"""The engine: continuous batching, chunked prefill, prefix cache, eviction and preemption."""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from reference_impl.attention.launch_audit import AUDIT_KV_BYTES, int32_overflow_risks
from reference_impl.cache.radix import MatchResult
from reference_impl.config import EngineConfig
from reference_impl.engine.model_runner import ModelRunner
from reference_impl.engine.scheduler import Admission
from reference_impl.faults import (
    DRAFT_PAGES_KEPT_ON_PREEMPT, FULL_HIT_LAST_TOKEN_ONLY, PD_PREFILL_VERIFY_SCRATCH, SPEC_FINISH_PAGE_LEAK,
)
from reference_impl.memory.engine_pools import EnginePools
from reference_impl.memory.host import PageMover
from reference_impl.model.batch_invariant import TILE
from reference_impl.model.forward_batch import VerifyScratch
from reference_impl.model.load import load_model
from reference_impl.request import Chunk, Phase, Request, RequestOutput, RequestSpec
from reference_impl.spec.ngram import NoProposer


class EngineStallError(RuntimeError):
    """Work is left but no step can make progress (a scheduler or accounting bug)."""


@dataclass(slots=True)
class EngineStats:
    """Counters a cell reports next to its verdicts."""

    steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    decode_forwards: int = 0      # request-steps of decode (plain or verify) target forwards
    emitted_tokens: int = 0       # tokens those decode passes emitted
    verify_steps: int = 0         # of the decode request-steps, those that verified at least one draft token
    verify_emitted: int = 0       # tokens those verify steps emitted (counted from the outputs, not the accept lists)
    preemptions: int = 0
    draft_full_hits: int = 0      # prefix hits that restored the draft state with the target's K/V
    draft_partial_hits: int = 0   # prefix hits with the target's K/V but without the draft state
    forward_seconds: float = 0.0


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class Engine:
    """Serves batches of RequestSpecs to completion; the prefix cache survives between calls."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        cfg = config.model
        self.page_size = config.page_size
        self.proposer = config.spec() if config.spec is not None else NoProposer()
        target = config.pool(
            self.proposer.pool_model(cfg),
            page_size=config.page_size,
            num_pages=config.num_pages,
            num_state_slots=config.num_state_slots,
            device=config.device,
            dtype=config.dtype,
            poison=config.poison,
            faults=config.faults,
        )
        self.pools = EnginePools(target, self.proposer.setup(target, config))
        free_state = (lambda slot: self.pools.free_state_slots([slot])) if cfg.is_hybrid else None
        self.cache = config.cache(config.page_size, self.pools.free_pages, free_state)
        self.cache.attach(PageMover(
            self.pools, config.page_size, len(cfg.attention_layers), self.proposer.draft_kv(),
            len(cfg.mamba_layers), config.faults, pin=config.device.startswith("cuda"),
        ), host_pages=config.host_pages)
        if "storage" in self.cache.lower_tiers:  # store is ignored unless cache=storage
            layout = f"{cfg.name}.{type(self.proposer).__name__}.p{config.page_size}.{config.dtype}"
            self.cache.attach_store(config.store(config.store_location), config.tenant, layout)
        self.queue = config.scheduler(config.faults)
        self.verify_scratch = self._verify_scratch()
        self.runner = ModelRunner(
            load_model(cfg, config.device, config.dtype),
            self.pools,
            config.backend(config.page_size, deterministic=config.deterministic, faults=config.faults),
            config.page_size,
            config.topk,
            config.deterministic,
            self.proposer,
            self.verify_scratch,
        )
        self.proposer.attach(self.runner)
        self.snapshot_grid = math.lcm(config.page_size, cfg.mamba.chunk_size)
        self.stats = EngineStats()
        self.running: list[Request] = []
        self._arrivals = 0

    #: whether this engine runs verify steps (a PD prefill server does not, so it needs no verify scratch)
    verifies = True

    # -- public ---------------------------------------------------------------------------
    def generate(self, specs: Sequence[RequestSpec]) -> list[RequestOutput]:
        """Run ``specs`` to completion; outputs come back in finishing order, rejections first."""
        outputs = self.submit(specs)
        while self.has_work():
            if not self.step(outputs):
                raise EngineStallError(self.stall_report())
        return outputs

    def submit(self, specs: Sequence[RequestSpec]) -> list[RequestOutput]:
        """Queue ``specs``; returns at once the outputs of those rejected, each naming why."""
        rejected: list[RequestOutput] = []
        seen: set[str] = set()
        for spec in specs:
            reason = self.rejection(spec, seen)
            seen.add(spec.rid)
            if reason:
                rejected.append(RequestOutput.empty(spec.rid, "rejected", reason))
                continue
            self.queue.push(self.new_request(spec))
        return rejected

    def new_request(self, spec: RequestSpec) -> Request:
        """Engine-side state of a new request, numbered in arrival order."""
        self._arrivals += 1
        return Request(spec, self._arrivals - 1, RequestOutput.empty(spec.rid, "length"))

    def has_work(self) -> bool:
        return bool(self.running or len(self.queue))

    def close(self) -> None:
        """Nothing to stop: an engine lives in this process (a PD engine's decode side may not)."""

    def stall_report(self) -> str:
        return (f"no progress: {len(self.queue)} waiting, {len(self.running)} running, "
                f"{self.pools.num_free_pages} free pages, {self.cache.evictable_pages()} evictable")

    def audit(self) -> list[str]:
        """Integrity problems of the idle engine: leaks, double ownership, stale reads, wrapping offsets."""
        problems = list(self.runner.stale_reads)
        checks = [self.pools.check_integrity, self.cache.check_integrity]
        for check in checks:
            try:
                check()
            except AssertionError as exc:
                problems.append(str(exc))
        launches = getattr(self.runner.backend, "launches", None)
        if launches:
            problems.extend(int32_overflow_risks(launches, AUDIT_KV_BYTES // self.pools.bytes_per_page))
        if self.running or len(self.queue):
            problems.append(f"engine not idle: {len(self.running)} running, {len(self.queue)} waiting")
        pages_accounted = self.pools.num_free_pages + self.cache.cached_pages()
        if pages_accounted != self.config.num_pages:
            problems.append(f"pages leaked: free {self.pools.num_free_pages} + cached {self.cache.cached_pages()} != {self.config.num_pages}")
        slots_accounted = self.pools.num_free_state_slots + self.cache.cached_states()
        if self.config.model.is_hybrid and slots_accounted != self.config.num_state_slots:
            problems.append(
                f"state slots leaked: free {self.pools.num_free_state_slots} + cached {self.cache.cached_states()} "
                f"!= {self.config.num_state_slots}"
            )
        return problems

    @property
    def nan_events(self) -> list:
        return self.runner.nan_events

    # -- validation ---------------------------------------------------------------------
    def rejection(self, spec: RequestSpec, seen: set[str]) -> str:
        """Why a request cannot be served at all, naming it; empty when it can."""
        vocab = self.config.model.vocab_size
        if spec.rid in seen:
            return f"request {spec.rid!r}: duplicate request id in one batch"
        if spec.max_new_tokens < 1:
            return f"request {spec.rid!r}: max_new_tokens must be >= 1, got {spec.max_new_tokens}"
        if not spec.prompt:
            return f"request {spec.rid!r}: empty prompt"
        bad = [t for t in spec.prompt if not 0 <= t < vocab]
        if bad:
            return f"request {spec.rid!r}: token id {bad[0]} outside the vocabulary [0, {vocab})"
        need = _ceil_div(len(spec.prompt) + spec.max_new_tokens, self.page_size)
        if need > self.config.num_pages:
            return f"request {spec.rid!r}: needs {need} pages, the pool has {self.config.num_pages} even when empty"
        return ""

    # -- one step -----------------------------------------------------------------------
    def step(self, outputs: list[RequestOutput]) -> bool:
        """Run one prefill or decode step, appending finished requests' outputs; False when nothing could run."""
        chunks = self._schedule_prefill()
        is_decode = not chunks
        if is_decode:
            chunks = self._schedule_decode()
        if not chunks:
            return False
        before = {c.req: len(c.req.output.tokens) for c in chunks}
        started = time.perf_counter()
        self.runner.run(chunks, is_decode and not self.proposer.speculative)
        self.stats.forward_seconds += time.perf_counter() - started
        self.stats.steps += 1
        tokens = sum(c.length for c in chunks)
        if is_decode:
            self.stats.decode_tokens += tokens
            self.stats.decode_forwards += len(chunks)
            self.stats.emitted_tokens += sum(len(c.req.output.tokens) - before[c.req] for c in chunks)
            verified = [c for c in chunks if c.draft]
            self.stats.verify_steps += len(verified)
            self.stats.verify_emitted += sum(len(c.req.output.tokens) - before[c.req] for c in verified)
            if self.proposer.speculative:
                self._settle_verify(chunks, before)
        else:
            self.stats.prefill_tokens += tokens
        for chunk in chunks:
            if chunk.req.done:
                self._complete(chunk.req, outputs)
        return True

    def _complete(self, req: Request, outputs: list[RequestOutput]) -> None:
        """A request produced its last token: cache its prompt, free the rest, hand its output back."""
        self._finish(req)
        outputs.append(req.output)

    def _schedule_prefill(self) -> list[Chunk]:
        """Continue partial prefills, then admit waiting requests, under the token budget."""
        budget = self.config.prefill_budget
        chunks: list[Chunk] = []
        for req in self.running:
            if req.in_prefill and budget > 0:
                chunk = self._chunk(req, budget)
                if chunk.length:
                    chunks.append(chunk)
                    budget -= chunk.length

        def try_admit(req: Request) -> Admission:
            nonlocal budget
            if budget <= 0 or len(self.running) >= self.config.max_running:
                return Admission.FULL
            if not self._admit(req):
                return Admission.BLOCKED
            chunk = self._chunk(req, budget)
            if chunk.length:  # a zero-length chunk (deterministic grid) starts next step
                chunks.append(chunk)
                budget -= chunk.length
            return Admission.ADMITTED

        if len(self.queue):
            self.queue.admit(try_admit)
        return chunks

    def _schedule_decode(self) -> list[Chunk]:
        """The last token (plus its drafts) of every running request, taking pages (evicting, then preempting)."""
        while True:
            decoding = [r for r in self.running if not r.in_prefill]
            drafts = {r: self._draft(r) for r in decoding}
            ends = {r: r.num_computed + 1 + len(drafts[r]) for r in decoding}
            need = {r: max(0, _ceil_div(ends[r], self.page_size) - len(r.pages)) for r in decoding}
            if self._reserve_pages(sum(need.values())) or not decoding:
                break
            self._preempt(self.queue.victim(self.running))
        for req in decoding:
            req.pages.extend(self.pools.alloc_pages(need[req]))
        if not self.proposer.speculative:
            return [Chunk(req, req.num_computed, 1) for req in decoding]
        return [Chunk(req, req.num_computed, 1 + len(drafts[req]), draft=drafts[req]) for req in decoding]

    def _draft(self, req: Request) -> list[int]:
        """The proposer's draft for ``req``, never longer than the tokens it still needs past the bonus."""
        room = min(self.config.num_draft_tokens, req.spec.max_new_tokens - len(req.output.tokens) - 1)
        return self.proposer.propose(req, room)[:room] if room > 0 else []

    def _settle_verify(self, chunks: list[Chunk], before: dict[Request, int]) -> None:
        """Check each verify step emitted accepted + 1 tokens; free the pages only rejected drafts used."""
        for chunk in chunks:
            req = chunk.req
            emitted = len(req.output.tokens) - before[req]
            accepted = req.output.accepted[-1]
            assert emitted == accepted + 1, f"{req.rid}: emitted {emitted}, accepted {accepted}"
            keep = _ceil_div(req.num_computed, self.page_size)
            self.pools.free_pages(req.pages[keep:])
            del req.pages[keep:]

    # -- memory -------------------------------------------------------------------------
    def _reserve_pages(self, n: int) -> bool:
        """Make ``n`` pages free, evicting unlocked cache leaves only when that suffices."""
        short = n - self.pools.num_free_pages
        if short > 0 and short <= self.cache.evictable_pages():
            self.cache.evict(short)
        return self.pools.num_free_pages >= n

    def _new_state_slot(self) -> int | None:
        """A fresh state slot, evicting cached snapshots one leaf at a time if none is free."""
        while self.pools.num_free_state_slots == 0 and self.cache.evict(1):
            pass
        return self.pools.alloc_state_slot()

    def _admit(self, req: Request) -> bool:
        """Take the request's memory and start it running; False leaves nothing held."""
        match = self.acquire(req)
        if match is None:
            return False
        full = self.proposer.full_hit(match.pages) if match.matched_tokens else None
        if full is not None:
            self.stats.draft_full_hits += full
            self.stats.draft_partial_hits += not full
        if not req.admitted_once:
            req.output.cached_tokens = match.matched_tokens
            req.output.cached_host = match.host_tokens
            req.output.cached_storage = match.storage_tokens
            req.output.cached_device = match.matched_tokens - match.host_tokens - match.storage_tokens
            req.admitted_once = True
        req.phase = Phase.RUNNING
        self.running.append(req)
        return True

    def acquire(self, req: Request) -> MatchResult | None:
        """Match the prefix cache and take pages for the whole sequence (and a state slot); None holds nothing.

        On success the request owns its pages and slot, ``num_computed`` is the hit, and the
        matched prefix stays locked (``cache_node``) until ``_release``.
        """
        tokens = req.all_tokens()
        # a hit leaves the last prompt token to compute; the fault matches it too and steps back one token at the end
        whole = FULL_HIT_LAST_TOKEN_ONLY.name in self.config.faults and not self.config.model.is_hybrid
        look = tokens if whole else tokens[:-1]
        match = self.cache.match_prefix(look)
        self.cache.lock(match.node)
        new_pages = _ceil_div(len(tokens), self.page_size) - len(match.pages)
        reserve = len(self.running) + 1 if self.running else 0
        if not self._reserve_pages(new_pages + reserve):
            self.cache.unlock(match.node)
            return None
        if match.pending is not None:  # the request fits: now load its prefix back from the tiers below
            loaded = self.cache.load_back(look, match)
            if loaded is not match:
                self.cache.lock(loaded.node)
                self.cache.unlock(match.node)
                match = loaded
                new_pages = _ceil_div(len(tokens), self.page_size) - len(match.pages)
        req.cache_node, req.cache_pages = match.node, list(match.pages)
        req.pages = [*match.pages, *self.pools.alloc_pages(new_pages)]
        if match.matched_tokens == len(tokens):  # only under the fault: the last token is computed again, alone
            match = replace(match, matched_tokens=len(tokens) - 1)
        req.num_computed = match.matched_tokens
        if self.config.model.is_hybrid:
            req.state_slot = self._new_state_slot()
            if req.state_slot is None:
                self._release(req)
                return None
            if match.state_slot is not None:
                self.pools.copy_state(match.state_slot, req.state_slot)
            else:
                self.pools.zero_state(req.state_slot)
        return match

    def _chunk(self, req: Request, budget: int) -> Chunk:
        """The next prefill chunk of ``req`` (at most ``budget`` tokens), with its Mamba checkpoints."""
        start = req.num_computed
        end = min(req.seq_len, start + budget)
        if self.config.deterministic and end < req.seq_len:
            # Cut only on the tile grid, so chunking never shows in the bits; a budget below
            # one tile is rounded up to the next grid point for the step's first chunk.
            aligned = end // TILE * TILE
            if aligned <= start and budget == self.config.prefill_budget:
                aligned = min(req.seq_len, (start // TILE + 1) * TILE)
            end = max(aligned, start)
        chunk = Chunk(req, start, end - start)
        if self.config.model.is_hybrid:
            for pos in self._checkpoint_positions(req, start, start + chunk.length):
                slot = self._new_state_slot()
                if slot is not None:
                    chunk.checkpoints[pos] = req.checkpoint_slots[pos] = slot
        return chunk

    def _checkpoint_positions(self, req: Request, start: int, end: int) -> list[int]:
        """Prompt positions in (start, end] where a Mamba snapshot is kept for the prefix cache.

        Only on the snapshot grid (pages and SSD chunks both end there), so that resuming from a
        snapshot never cuts the chunked scan where the uninterrupted run did not: every
        ``state_interval`` tokens, at the prompt's last grid point (what a longer prompt resumes
        from) and at the last grid point before its final token (what the same prompt resumes
        from, since a hit always leaves one token to compute).
        """
        grid = self.snapshot_grid
        prompt_len = len(req.spec.prompt)
        ends = {prompt_len // grid * grid, (prompt_len - 1) // grid * grid}
        interval = self.config.state_interval
        return [
            pos
            for pos in range(start + 1, min(end, max(ends)) + 1)
            if pos % grid == 0 and (pos % interval == 0 or pos in ends)
        ]

    def _finish(self, req: Request) -> None:
        """Hand the prompt's whole computed pages (and snapshots) to the cache, free everything else."""
        aligned = min(len(req.spec.prompt), req.num_computed) // self.page_size * self.page_size
        n_pages = aligned // self.page_size
        snapshots = {pos: slot for pos, slot in req.checkpoint_slots.items() if pos <= aligned}
        result = self.cache.insert(req.spec.prompt[:aligned], req.pages[:n_pages], snapshots if self.config.model.is_hybrid else None)
        adopted = set(req.pages[:n_pages]) - set(result.unused_pages)
        self.proposer.cached(sorted(adopted))
        req.pages = [p for p in req.pages if p not in adopted]
        if SPEC_FINISH_PAGE_LEAK.name in self.config.faults and self.proposer.speculative:
            req.pages = req.pages[:-1]  # the last page (its decoded tokens, never cached) is forgotten, not freed
        req.checkpoint_slots = {pos: s for pos, s in req.checkpoint_slots.items() if s in result.unused_slots}
        self._release(req)
        req.phase = Phase.FINISHED

    def _verify_scratch(self) -> VerifyScratch | None:
        """Intermediate Mamba states for verify steps: only a hybrid engine that verifies drafts needs them."""
        cfg = self.config
        verifies = self.verifies or PD_PREFILL_VERIFY_SCRATCH.name in cfg.faults  # the fault: gated on nothing
        if not (verifies and self.proposer.speculative and cfg.model.is_hybrid):
            return None
        return VerifyScratch.allocate(cfg.model.mamba, len(cfg.model.mamba_layers), cfg.max_running,
                                      cfg.num_draft_tokens + 1, cfg.device, cfg.dtype)

    def _release(self, req: Request) -> None:
        """Unlock the cache path and free every page and slot the request still owns."""
        cached = set(req.cache_pages)
        self.pools.free_pages([p for p in req.pages if p not in cached])
        slots = [*req.checkpoint_slots.values(), *([req.state_slot] if req.state_slot is not None else [])]
        self.pools.free_state_slots(slots)
        self.cache.unlock(req.cache_node)
        req.pages, req.cache_pages, req.cache_node = [], [], None
        req.state_slot, req.checkpoint_slots = None, {}
        if req in self.running:
            self.running.remove(req)

    def _preempt(self, req: Request) -> None:
        """Recompute-style preemption: drop the request's memory and queue it again."""
        if self.pools.draft is not None and DRAFT_PAGES_KEPT_ON_PREEMPT.name in self.config.faults:
            cached = set(req.cache_pages)
            own = [p for p in req.pages if p not in cached]
            self.pools.target.free_pages(own)  # the draft pool's copies of these pages stay live
            req.pages = [p for p in req.pages if p in cached]
        self._release(req)
        req.num_computed = 0
        req.output.preemptions += 1
        req.phase = Phase.WAITING
        self.stats.preemptions += 1
        self.queue.push(req)
