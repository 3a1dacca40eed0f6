"""Paged extend (prefill) attention in Triton: SGLang's two-stage kernel and its unified single-stage one.

One program per (request, KV head, block of BLOCK_M new tokens; ``LaunchShapes.extend_block_m``); a program's rows are the
(token, query head) pairs of that KV-head group, so GQA reads each K/V tile once. The
two-stage variant (SGLang's default path) reads the prefix K/V from the pool and the new
tokens' K/V from the ``k``/``v`` inputs under the causal mask. The unified variant
(``UNIFIED``; SGLang's deterministic path, ``_forward_extend_unified``) reads everything
from the pool through one index list per request, prefix slots then new slots: a key
counts the same way whether it was a cache hit or just written, which is also why a wrong
new-token slot shows up only there (SGLang #33517). See ``triton_ops.common`` for the
masking and index-width rules.
"""
from __future__ import annotations

import math

import torch

from reference_impl.attention.triton_ops.common import (
    SHAPES,
    LaunchShapes,
    attend_pages,
    block_d,
    block_n,
    check_device,
    pool_strides,
    tl,
    triton,
)

@triton.jit
def _query_rows(Q, q_start, ext_len, m_block, kv_head, stride_qt, stride_qh, offs_d, mask_d,
                GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr):
    """This program's rows: fp32 queries, token index within the extend, query head, liveness."""
    rows = tl.arange(0, BLOCK_M * BLOCK_G)
    token = m_block * BLOCK_M + rows // BLOCK_G
    head = kv_head * GROUP + rows % BLOCK_G
    live = (token < ext_len) & (rows % BLOCK_G < GROUP)
    ptrs = Q + (q_start + token)[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(ptrs, mask=live[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
    return q, token, head, live


@triton.jit
def _extend(
    Q, K_new, V_new, O, K, V, qo_indptr, kv_indptr, prefix_lens, indices, packed_rows, sm_scale,
    stride_qt, stride_qh, stride_nt, stride_nh, stride_ot, stride_oh,
    stride_page, stride_slot, stride_head, stride_dim,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, INDEX_INT32: tl.constexpr,
    UNIFIED: tl.constexpr,
):
    """Causal attention of BLOCK_M new tokens of one request, for the query heads of one KV head."""
    req, kv_head, m_block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_start = tl.load(qo_indptr + req)
    ext_len = tl.load(qo_indptr + req + 1) - q_start
    if m_block * BLOCK_M < ext_len:
        kv_start = tl.load(kv_indptr + req)
        seq_len = tl.load(kv_indptr + req + 1) - kv_start
        prefix = tl.load(prefix_lens + req)
        block_end = tl.minimum(ext_len, (m_block + 1) * BLOCK_M)  # new tokens this block's rows can see
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < HEAD_DIM
        q, token, head, live = _query_rows(Q, q_start, ext_len, m_block, kv_head, stride_qt, stride_qh,
                                           offs_d, mask_d, GROUP, BLOCK_M, BLOCK_G)
        m = tl.zeros([BLOCK_M * BLOCK_G], dtype=tl.float32) - float("inf")
        l = tl.zeros([BLOCK_M * BLOCK_G], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M * BLOCK_G, BLOCK_D], dtype=tl.float32)
        head_off = kv_head * stride_head
        if UNIFIED:
            # one pass over prefix then new slots, all from the pool
            m, l, acc = attend_pages(q, m, l, acc, K, V, indices, kv_start, seq_len, 0, prefix + block_end,
                                     prefix + token, head_off, sm_scale, stride_page, stride_slot, stride_dim,
                                     offs_d, mask_d, BLOCK_N, PAGE_SIZE, INDEX_INT32)
        else:
            # stage 1: the prefix, from the pool; every row sees all of it
            m, l, acc = attend_pages(q, m, l, acc, K, V, indices, kv_start, seq_len, 0, prefix,
                                     tl.zeros_like(token) + prefix - 1, head_off, sm_scale, stride_page, stride_slot,
                                     stride_dim, offs_d, mask_d, BLOCK_N, PAGE_SIZE, INDEX_INT32)
            # stage 2: the new tokens, from the k/v inputs seen as one-token pages at packed rows
            m, l, acc = attend_pages(q, m, l, acc, K_new, V_new, packed_rows, q_start, ext_len, 0, block_end,
                                     token, kv_head * stride_nh, sm_scale, stride_nt, 0, 1,
                                     offs_d, mask_d, BLOCK_N, 1, False)
        out_ptrs = O + (q_start + token)[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
        tl.store(out_ptrs, (acc / l[:, None]).to(O.dtype.element_ty), mask=live[:, None] & mask_d[None, :])


def extend_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_view: torch.Tensor,
    v_view: torch.Tensor,
    csr: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    indices: torch.Tensor,
    max_extend: int,
    *,
    unified: bool,
    index_int32: bool,
    shapes: LaunchShapes = SHAPES,
) -> torch.Tensor:
    """Extend attention (T, Hq, D) of the packed new tokens ``q``; ``k``/``v`` contiguous (T, Hkv, D).

    ``csr`` is (qo_indptr, kv_indptr, prefix_lens) as int32 tensors on q's device; ``indices``
    lists each request's prefix slots then new slots, like ``kv_indices``. Two-stage reads
    only its prefix part (new K/V come from ``k``/``v``); ``unified`` reads all of it.
    """
    check_device(q, "q")
    num_tokens, num_heads, head_dim = q.shape
    page_size, num_kv_heads = k_view.shape[1], k_view.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    block_m = shapes.extend_block_m
    grid = (csr[0].numel() - 1, num_kv_heads, triton.cdiv(max_extend, block_m))
    _extend[grid](
        q, k, v, out, k_view, v_view, *csr, indices, torch.arange(num_tokens, device=q.device),
        1.0 / math.sqrt(head_dim), q.stride(0), q.stride(1), k.stride(0), k.stride(1), out.stride(0), out.stride(1),
        *pool_strides(k_view, v_view),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_G=triton.next_power_of_2(group),
        BLOCK_D=block_d(head_dim), BLOCK_N=block_n(page_size), PAGE_SIZE=page_size, INDEX_INT32=index_int32,
        UNIFIED=unified,
    )
    return out
