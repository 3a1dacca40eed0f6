"""spec = draft: the EAGLE-like sidecar proposer, its own KV pool, and what the prefix cache keeps of it.

The draft pool has the draft layer's geometry and issues and frees pages in lockstep with the
target pool (``EnginePools``), so a virtual page id names the target's and the draft's K/V
of the same tokens: a radix hit that keeps a page keeps both (a *full* hit). After every
target forward the draft catches up over the newly computed positions, writing its K/V;
proposing reads that K/V and writes nothing, so rejected drafts leave no draft state behind.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from reference_impl.attention.torch_backend import causal_attention, gather_pages
from reference_impl.config import EngineConfig, ModelConfig
from reference_impl.faults import DRAFT_CHAIN_DEFAULT_STEPS, DRAFT_STATE_NOT_CACHED
from reference_impl.memory.pool import Pool, physical_pages
from reference_impl.model import batch_invariant
from reference_impl.model.load import load_model
from reference_impl.request import Chunk, Request
from reference_impl.spec.draft_model import DraftHead, load_draft


#: speculative steps a chain buffer sized "by default" holds (SGLang's and vLLM's EAGLE default: 3 steps)
DEFAULT_NUM_STEPS = 3


class SlotTranslator(Protocol):
    """What the draft needs of the engine's model runner, the one place that translates virtual slots."""

    deterministic: bool

    def physical_slots(self, req: Request, start: int, end: int, pools: Pool) -> torch.Tensor:
        """Physical slots of positions start..end-1 of ``req`` in ``pools``."""




class DraftProposer:
    """spec = draft: fc(cat(embedding of t+1, target hidden at t)) → one attention layer → shared LM head."""

    speculative = True

    def pool_model(self, model: ModelConfig) -> ModelConfig:
        """The target pool's layout: the target's own (the draft has a pool of its own)."""
        return model

    def setup(self, target: Pool, config: EngineConfig) -> Pool:
        """Load the draft head and build its own pool (the draft's geometry), issued in lockstep with ``target``."""
        self.config = config
        self.lost: set[int] = set()  # pages the cache adopted without their draft state (the fault)
        self.head: DraftHead = load_draft(load_model(config.model, config.device, config.dtype))
        self.kv_pool: Pool = config.pool(
            self.head.cfg, page_size=config.page_size, num_pages=config.num_pages, num_state_slots=1,
            device=config.device, dtype=config.dtype, poison=config.poison, faults=config.faults,
        )
        self.kv_layer = 0
        return self.kv_pool

    def attach(self, runner: SlotTranslator) -> None:
        """Remember the runner: the one place that translates the draft pool's virtual slots."""
        self.runner = runner
        self._attend = batch_invariant.causal_attention if runner.deterministic else causal_attention

    def _layer(
        self, reqs: Sequence[Request], starts: Sequence[int], lengths: Sequence[int], x: torch.Tensor, write: bool
    ) -> torch.Tensor:
        """The draft layer over rows ``x`` (lengths[r] rows of request r from starts[r]); prefix K/V from its pool."""
        det = self.runner.deterministic
        positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lengths)]).to(x.device)
        q, k, v = self.head.qkv(x, positions, det)
        pool, layer = self.kv_pool, self.kv_layer
        k_view, v_view = pool.kv_views(layer)
        out, row = torch.empty_like(q), 0
        for req, start, n in zip(reqs, starts, lengths):
            if write:
                slots = self.runner.physical_slots(req, start, start + n, pool).to(x.device)
                pool.write_kv(layer, slots, k[row : row + n], v[row : row + n])
            prefix = self.runner.physical_slots(req, 0, start, pool).to(x.device)
            keys = torch.cat([gather_pages(k_view, prefix, self.config.page_size), k[row : row + n]])
            values = torch.cat([gather_pages(v_view, prefix, self.config.page_size), v[row : row + n]])
            out[row : row + n] = self._attend(q[row : row + n], keys, values, start)
            row += n
        return self.head.finish(x, out, det)

    def observe(self, chunks: Sequence[Chunk], qo_indptr: Sequence[int], hidden: torch.Tensor) -> None:
        """Catch up over every position the target just computed; keep each request's last draft hidden."""
        rows, next_ids = [], []
        for chunk, q0 in zip(chunks, qo_indptr):
            req = chunk.req
            n = req.num_computed - chunk.start
            rows.append(hidden[q0 : q0 + n])
            next_ids.extend(req.all_tokens()[chunk.start + 1 : req.num_computed + 1])
        ids = torch.tensor(next_ids, dtype=torch.long, device=hidden.device)
        x = self.head.project(ids, torch.cat(rows), self.runner.deterministic)
        lengths = [c.req.num_computed - c.start for c in chunks]
        out = self._layer([c.req for c in chunks], [c.start for c in chunks], lengths, x, write=True)
        end = 0
        for chunk, n in zip(chunks, lengths):
            end += n
            chunk.req.draft_tail = out[end - 1]

    def propose(self, req: Request, k: int) -> list[int]:
        """Up to ``k`` tokens, each from the draft's hidden at the previous position; nothing is written."""
        det = self.runner.deterministic
        hidden, drafts, inputs = req.draft_tail, [], []
        chain = [hidden]  # the hidden each draft step reads, step by step
        while True:
            drafts.append(int(self.head.logits(hidden[None], det).argmax(-1)))
            if len(drafts) == k:
                return drafts
            inputs.append(self.head.project(torch.tensor([drafts[-1]], device=hidden.device), hidden[None], det))
            hidden = self._layer([req], [req.num_computed], [len(inputs)], torch.cat(inputs), write=False)[-1]
            chain.append(hidden)
            if DRAFT_CHAIN_DEFAULT_STEPS.name in self.config.faults:
                hidden = chain[(len(chain) - 1) % DEFAULT_NUM_STEPS]  # the fault: a ring of the default step count

    def draft_kv(self) -> list[tuple[Pool, int]]:
        """(pool, layer) of the draft's K/V, which a lower cache tier must move with the target's."""
        return [(self.kv_pool, self.kv_layer)]

    def cached(self, pages: Sequence[int]) -> None:
        """The prefix cache adopted ``pages``; under the fault their draft K/V is not kept."""
        if DRAFT_STATE_NOT_CACHED.name in self.config.faults and pages:
            draft_pool, page_size = self.kv_pool, self.config.page_size
            physical = torch.tensor([p * page_size + i for p in physical_pages(draft_pool, pages) for i in range(page_size)],
                                    device=self.head.embed.device)
            k_view, _ = draft_pool.kv_views(self.kv_layer)
            zeros = torch.zeros(len(physical), *k_view.shape[2:], dtype=k_view.dtype, device=k_view.device)
            draft_pool.write_kv(self.kv_layer, physical, zeros, zeros)
            self.lost.update(pages)

    def full_hit(self, pages: Sequence[int]) -> bool:
        """Whether a radix hit on ``pages`` restores the draft state with the target's K/V."""
        return not any(p in self.lost for p in pages)
