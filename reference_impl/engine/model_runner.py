"""Model runner: turns scheduled chunks into a ForwardBatch (virtual → physical), runs it, samples greedily."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_impl.attention.backend import AttentionBackend
from reference_impl.memory.pool import Pool
from reference_impl.model.forward_batch import ForwardBatch, VerifyScratch
from reference_impl.model.tiny_lm import TinyLM
from reference_impl.request import Chunk, Request
from reference_impl.spec.proposer import Proposer
from reference_impl.spec.verify import greedy_accept


@dataclass(slots=True)
class NanEvent:
    """A non-finite value seen by the sentinel: where, at which engine step, for which requests."""

    where: str
    step: int
    rids: list[str]


class ModelRunner:
    """Owns the model call; the only place where virtual ids are translated for the kernels."""

    def __init__(
        self, model: TinyLM, pools: Pool, backend: AttentionBackend, page_size: int, topk: int, deterministic: bool,
        proposer: Proposer, verify_scratch: VerifyScratch | None = None,
    ) -> None:
        self.model = model
        self.verify_scratch = verify_scratch
        self.proposer = proposer
        self.deterministic = deterministic
        self.pools = pools
        self.backend = backend
        self.page_size = page_size
        self.topk = topk
        self.step = 0
        self.nan_events: list[NanEvent] = []
        self.stale_reads: list[str] = []
        self._rids: list[str] = []

    def _sentinel(self, where: str, tensor: torch.Tensor) -> None:
        if not bool(torch.isfinite(tensor).all()) and len(self.nan_events) < 64:
            self.nan_events.append(NanEvent(where, self.step, list(self._rids)))

    def _slots(self, req: Request, start: int, end: int) -> torch.Tensor:
        """Virtual token slots of positions start..end-1 of ``req``, from its page table."""
        positions = torch.arange(start, end)
        pages = torch.tensor(req.pages, dtype=torch.long)[positions // self.page_size]
        return pages * self.page_size + positions % self.page_size

    def physical_slots(self, req: Request, start: int, end: int, pools: Pool) -> torch.Tensor:
        """Physical slots of positions start..end-1 of ``req`` in ``pools`` (the draft pool's translation)."""
        return pools.to_physical(self._slots(req, start, end))

    def _audit_pages(self, req: Request) -> None:
        """Record any page in the request's table that the allocator says is free (a stale read)."""
        for page in req.pages:
            if not self.pools.page_is_live(page):
                self.stale_reads.append(f"step {self.step}: request {req.rid} reads freed page {page}")

    def build_batch(self, chunks: list[Chunk], is_decode: bool) -> ForwardBatch:
        """Pack the chunks; every id handed to the model is translated here, once."""
        ids, positions, out_loc, kv, qo_indptr, kv_indptr = [], [], [], [], [0], [0]
        for chunk in chunks:
            req, end = chunk.req, chunk.start + chunk.length
            self._audit_pages(req)
            known = req.all_tokens()[chunk.start : end if chunk.draft is None else chunk.start + 1]
            ids.extend([*known, *(chunk.draft or [])])
            positions.append(torch.arange(chunk.start, end))
            out_loc.append(self._slots(req, chunk.start, end))
            kv.append(self._slots(req, 0, end))
            qo_indptr.append(qo_indptr[-1] + chunk.length)
            kv_indptr.append(kv_indptr[-1] + end)
        to_state = self.pools.to_physical_state
        virtual_loc = torch.cat(out_loc)
        return ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.long),
            positions=torch.cat(positions),
            out_cache_loc=self.pools.to_physical(virtual_loc),
            qo_indptr=qo_indptr,
            kv_indptr=kv_indptr,
            kv_indices=self.pools.to_physical(torch.cat(kv)),
            prefix_lens=[chunk.start for chunk in chunks],
            state_slots=to_state([c.req.state_slot for c in chunks]) if chunks[0].req.state_slot is not None else [],
            checkpoints=[dict(zip(c.checkpoints, to_state(list(c.checkpoints.values())))) for c in chunks],
            is_decode=is_decode,
            out_cache_loc_virtual=virtual_loc,
            verify=chunks[0].draft is not None,
            verify_scratch=self.verify_scratch if chunks[0].draft is not None else None,
        )

    def run(self, chunks: list[Chunk], is_decode: bool) -> None:
        """One forward step; appends the greedy token (with logprobs and margin) to sampling requests."""
        self._rids = [c.req.rid for c in chunks]
        batch = self.build_batch(chunks, is_decode)
        device = next(iter(self.model.parameters())).device
        batch.input_ids, batch.positions = batch.input_ids.to(device), batch.positions.to(device)
        batch.out_cache_loc, batch.kv_indices = batch.out_cache_loc.to(device), batch.kv_indices.to(device)
        batch.out_cache_loc_virtual = batch.out_cache_loc_virtual.to(device)
        hidden = self.model(batch, self.pools, self.backend, self._sentinel, deterministic=self.deterministic)
        if batch.verify:
            self._verify(chunks, batch, hidden)
            self.proposer.observe(chunks, batch.qo_indptr, hidden)
            self.step += 1
            return
        sampling = [i for i, c in enumerate(chunks) if c.samples]
        if sampling:
            last = torch.tensor([batch.qo_indptr[i + 1] - 1 for i in sampling], device=device)
            logits = self.model.logits(hidden[last], deterministic=self.deterministic).float()
            self._sentinel("logits", logits)
            self._sample([chunks[i].req for i in sampling], logits)
        for chunk in chunks:
            chunk.req.num_computed = chunk.start + chunk.length
        self.proposer.observe(chunks, batch.qo_indptr, hidden)
        self.step += 1

    def _verify(self, chunks: list[Chunk], batch: ForwardBatch, hidden: torch.Tensor) -> None:
        """Greedy verification: emit the accepted drafts plus the bonus token, roll Mamba states back to match."""
        logits = self.model.logits(hidden, deterministic=self.deterministic).float()
        self._sentinel("logits", logits)
        targets = self._choosable(logits).argmax(dim=-1).tolist()
        for r, chunk in enumerate(chunks):
            q0 = batch.qo_indptr[r]
            accepted = greedy_accept(chunk.draft, targets[q0 : q0 + len(chunk.draft)])
            self._sample([chunk.req] * (accepted + 1), logits[q0 : q0 + accepted + 1])
            chunk.req.output.accepted.append(accepted)
            chunk.req.output.drafted.append(len(chunk.draft))
            chunk.req.num_computed = chunk.start + accepted + 1
            scratch = batch.verify_scratch
            for layer in range(len(scratch.conv) if scratch is not None and batch.state_slots else 0):
                conv, ssm = self.pools.state_views(layer)
                slot = batch.state_slots[r]
                conv[slot], ssm[slot] = scratch.conv[layer][r, accepted], scratch.ssm[layer][r, accepted]

    def _choosable(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` as greedy chooses from them: the model's stop tokens never (``ModelConfig.stop_tokens``)."""
        stop = self.model.cfg.stop_tokens
        if not stop:
            return logits
        masked = logits.clone()
        masked[:, list(stop)] = float("-inf")
        return masked

    def _sample(self, reqs: list[Request], logits: torch.Tensor) -> None:
        logprobs = torch.log_softmax(logits, dim=-1)
        top_lp, top_ids = logprobs.topk(max(self.topk, 2), dim=-1)
        choosable = self._choosable(logits)
        top2 = choosable.topk(2, dim=-1).values
        margins = (top2[:, 0] - top2[:, 1]).tolist()
        tokens = choosable.argmax(dim=-1).tolist()
        for i, req in enumerate(reqs):
            out = req.output
            out.tokens.append(tokens[i])
            out.logprobs.append(float(logprobs[i, tokens[i]]))
            out.top_ids.append(top_ids[i, : self.topk].tolist())
            out.top_logprobs.append(top_lp[i, : self.topk].tolist())
            out.margins.append(margins[i])
