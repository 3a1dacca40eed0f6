"""Paged decode attention in Triton, split-KV in two stages like SGLang's ``decode_attention``.

Stage 1: one program per (request, KV head, split) attends the query heads of that KV-head
group over one range of whole pages and stores a partial output and its log-sum-exp.
Stage 2: one program per request merges each head's splits in split order. How many pages
a split covers is chosen per request by the caller (``split_pages``): a fixed tile in
deterministic mode, so a request's reduction order never depends on the batch, or a
batch-dependent count otherwise. See ``triton_ops.common`` for the masking and index rules.
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
    block_rows,
    check_device,
    pool_strides,
    tl,
    triton,
)


@triton.jit
def _decode_stage1(
    Q, K, V, kv_indptr, kv_indices, split_pages, Mid_O, Mid_Lse, sm_scale,
    stride_qt, stride_qh, stride_page, stride_slot, stride_head, stride_dim,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, INDEX_INT32: tl.constexpr,
):
    req, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    kv_start = tl.load(kv_indptr + req)
    seq_len = tl.load(kv_indptr + req + 1) - kv_start
    split_len = tl.load(split_pages + req) * PAGE_SIZE
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    if start < end:
        rows = tl.arange(0, BLOCK_R)
        heads = kv_head * GROUP + rows
        live = rows < GROUP
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < HEAD_DIM
        q_ptrs = Q + req * stride_qt + heads[:, None] * stride_qh + offs_d[None, :]
        q = tl.load(q_ptrs, mask=live[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
        m = tl.zeros([BLOCK_R], dtype=tl.float32) - float("inf")
        l = tl.zeros([BLOCK_R], dtype=tl.float32)
        acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
        m, l, acc = attend_pages(q, m, l, acc, K, V, kv_indices, kv_start, seq_len, start, end,
                                 tl.zeros_like(rows) + end - 1, kv_head * stride_head, sm_scale,
                                 stride_page, stride_slot, stride_dim, offs_d, mask_d, BLOCK_N, PAGE_SIZE, INDEX_INT32)
        mid = req * stride_mb + heads * stride_mh + split * stride_ms
        tl.store(Mid_O + mid[:, None] + offs_d[None, :], acc / l[:, None], mask=live[:, None] & mask_d[None, :])
        tl.store(Mid_Lse + req * stride_lb + heads * stride_lh + split, m + tl.log(l), mask=live)


@triton.jit
def _decode_stage2(
    Mid_O, Mid_Lse, O, kv_indptr, split_pages,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ot, stride_oh,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
):
    req = tl.program_id(0)
    seq_len = tl.load(kv_indptr + req + 1) - tl.load(kv_indptr + req)
    num_splits = tl.cdiv(seq_len, tl.load(split_pages + req) * PAGE_SIZE)
    heads = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (heads < NUM_HEADS)[:, None] & (offs_d < HEAD_DIM)[None, :]
    m = tl.zeros([BLOCK_H], dtype=tl.float32) - float("inf")
    l = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for split in range(0, num_splits):  # in split order: the merge never depends on the batch
        lse = tl.load(Mid_Lse + req * stride_lb + heads * stride_lh + split, mask=heads < NUM_HEADS, other=0.0)
        mid = req * stride_mb + heads[:, None] * stride_mh + split * stride_ms + offs_d[None, :]
        part = tl.load(Mid_O + mid, mask=mask, other=0.0)
        m_new = tl.maximum(m, lse)
        alpha = tl.exp(m - m_new)
        weight = tl.exp(lse - m_new)
        acc = acc * alpha[:, None] + weight[:, None] * part
        l = l * alpha + weight
        m = m_new
    out_ptrs = O + req * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(out_ptrs, (acc / l[:, None]).to(O.dtype.element_ty), mask=mask)


def decode_attention(
    q: torch.Tensor,
    k_view: torch.Tensor,
    v_view: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    split_pages: torch.Tensor,
    max_splits: int,
    *,
    index_int32: bool,
    shapes: LaunchShapes = SHAPES,
) -> torch.Tensor:
    """Decode attention (B, Hq, D) of one query per request over its paged sequence.

    ``split_pages[r]`` pages per split for request r; ``max_splits`` bounds the split count.
    With one split and ``shapes.merge_one_split`` off, stage 1's output is the answer (merging a
    single split is the identity), so stage 2 is not launched.
    """
    check_device(q, "q")
    batch, num_heads, head_dim = q.shape
    page_size, num_kv_heads = k_view.shape[1], k_view.shape[2]
    group = num_heads // num_kv_heads
    mid_o = torch.empty(batch, num_heads, max_splits, head_dim, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(batch, num_heads, max_splits, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    mid_strides = (*mid_o.stride()[:3], *mid_lse.stride()[:2])
    _decode_stage1[(batch, num_kv_heads, max_splits)](
        q, k_view, v_view, kv_indptr, kv_indices, split_pages, mid_o, mid_lse, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), *pool_strides(k_view, v_view), *mid_strides,
        GROUP=group, HEAD_DIM=head_dim, BLOCK_R=block_rows(group), BLOCK_D=block_d(head_dim),
        BLOCK_N=block_n(page_size), PAGE_SIZE=page_size, INDEX_INT32=index_int32,
    )
    if max_splits == 1 and not shapes.merge_one_split:
        return out.copy_(mid_o[:, :, 0])
    _decode_stage2[(batch,)](
        mid_o, mid_lse, out, kv_indptr, split_pages, *mid_strides, out.stride(0), out.stride(1),
        NUM_HEADS=num_heads, HEAD_DIM=head_dim, BLOCK_H=triton.next_power_of_2(num_heads), BLOCK_D=block_d(head_dim),
        PAGE_SIZE=page_size,
    )
    return out
