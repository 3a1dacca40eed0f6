"""Reference attention over the paged pool in plain torch: the backend every other one is judged by."""
from __future__ import annotations

import math

import torch

from reference_impl.model import batch_invariant
from reference_impl.model.forward_batch import ForwardBatch


def gather_pages(view: torch.Tensor, slots: torch.Tensor, page_size: int) -> torch.Tensor:
    """Read token slots from a (num_pages, page_size, heads, dim) view, strided or not."""
    return view[slots // page_size, slots % page_size]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """Softmax attention of n new queries over prefix_len + n keys, causal, GQA-aware.

    q: (n, Hq, D); k, v: (prefix_len + n, Hkv, D). Query i sits at position prefix_len + i.
    """
    n, num_heads, head_dim = q.shape
    group = num_heads // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(head_dim)
    key_pos = torch.arange(k.shape[0], device=q.device)
    query_pos = torch.arange(n, device=q.device) + prefix_len
    future = key_pos[None, :] > query_pos[:, None]
    scores = scores.masked_fill(future[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


class TorchBackend:
    """Two-stage semantics: prefix K/V read from the pool, the new tokens' K/V from the inputs.

    One request at a time. Deterministic mode also fixes each query's reduction by its
    absolute position (``batch_invariant.causal_attention``), so chunking and cache hits
    cannot change a bit; otherwise a request's keys go through one einsum of whatever shape.
    """

    name = "torch"

    def __init__(self, page_size: int, *, deterministic: bool = True, faults: frozenset[str] = frozenset()) -> None:
        self.page_size = page_size
        self.deterministic = deterministic
        self._attend = batch_invariant.causal_attention if deterministic else causal_attention

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_view: torch.Tensor,
        v_view: torch.Tensor,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """Attention output (T, Hq, D) for the packed queries of ``batch``."""
        out = torch.empty_like(q)
        for r in range(batch.batch_size):
            q0, q1 = batch.qo_indptr[r], batch.qo_indptr[r + 1]
            kv0 = batch.kv_indptr[r]
            prefix = batch.prefix_lens[r]
            slots = batch.kv_indices[kv0 : kv0 + prefix]
            keys = torch.cat([gather_pages(k_view, slots, self.page_size), k[q0:q1]])
            values = torch.cat([gather_pages(v_view, slots, self.page_size), v[q0:q1]])
            out[q0:q1] = self._attend(q[q0:q1], keys, values, prefix)
        return out
