"""Paged attention over the pool equals dense causal attention over contiguous K/V."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impl.attention.torch_backend import TorchBackend
from reference_impl.config import DENSE
from reference_impl.memory.static import StaticPools
from reference_impl.model.forward_batch import ForwardBatch


def dense_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int) -> torch.Tensor:
    """SDPA over the whole sequence, keeping only the last q.shape[0] query rows."""
    n = q.shape[0]
    total = k.shape[0]
    group = q.shape[1] // k.shape[1]
    full_q = torch.zeros(total, *q.shape[1:])
    full_q[prefix:] = q
    out = F.scaled_dot_product_attention(
        full_q.transpose(0, 1), k.repeat_interleave(group, 1).transpose(0, 1),
        v.repeat_interleave(group, 1).transpose(0, 1), is_causal=True,
    )
    return out.transpose(0, 1)[total - n :]


@settings(max_examples=40, deadline=None)
@given(
    page_size=st.sampled_from([1, 4, 16]),
    lens=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 12)), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_paged_attention_matches_dense(page_size: int, lens: list[tuple[int, int]], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    cfg = DENSE
    pools = StaticPools(cfg, page_size=page_size, num_pages=200 // page_size + 40, num_state_slots=1)
    perm = torch.randperm(pools.num_pages, generator=gen).tolist()  # scattered, non-contiguous page tables
    qs, ks, vs, out_loc, kv_idx, refs = [], [], [], [], [], []
    qo, kvp, prefixes = [0], [0], []
    for prefix, n in lens:
        total = prefix + n
        pages = [perm.pop() for _ in range(-(-total // page_size))]
        slots = torch.tensor([pages[p // page_size] * page_size + p % page_size for p in range(total)])
        k = torch.randn(total, cfg.num_kv_heads, cfg.head_dim, generator=gen)
        v = torch.randn(total, cfg.num_kv_heads, cfg.head_dim, generator=gen)
        q = torch.randn(n, cfg.num_heads, cfg.head_dim, generator=gen)
        pools.write_kv(0, slots[:prefix], k[:prefix], v[:prefix])  # the prefix is already cached
        refs.append(dense_reference(q, k, v, prefix))
        qs.append(q), ks.append(k[prefix:]), vs.append(v[prefix:])
        out_loc.append(slots[prefix:]), kv_idx.append(slots)
        qo.append(qo[-1] + n), kvp.append(kvp[-1] + total), prefixes.append(prefix)
    batch = ForwardBatch(
        input_ids=torch.zeros(qo[-1], dtype=torch.long), positions=torch.zeros(qo[-1], dtype=torch.long),
        out_cache_loc=torch.cat(out_loc), qo_indptr=qo, kv_indptr=kvp, kv_indices=torch.cat(kv_idx),
        prefix_lens=prefixes, state_slots=[], checkpoints=[{} for _ in lens], is_decode=False,
    )
    k_new, v_new = torch.cat(ks), torch.cat(vs)
    pools.write_kv(0, batch.out_cache_loc, k_new, v_new)
    k_view, v_view = pools.kv_views(0)
    out = TorchBackend(page_size).forward(torch.cat(qs), k_new, v_new, k_view, v_view, batch)
    torch.testing.assert_close(out, torch.cat(refs), atol=1e-5, rtol=1e-5)


def test_write_kv_skips_minus_one() -> None:
    """A slot of -1 means "do not write": padding leaves the pool untouched."""
    pools = StaticPools(DENSE, page_size=4, num_pages=4, num_state_slots=1)
    k = torch.ones(3, DENSE.num_kv_heads, DENSE.head_dim)
    pools.write_kv(0, torch.tensor([0, -1, 5]), k, k)
    k_view, _ = pools.kv_views(0)
    written = k_view.reshape(16, -1).abs().sum(-1).nonzero().flatten().tolist()
    assert written == [0, 5]
