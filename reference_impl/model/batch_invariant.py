"""Batch-invariant building blocks for deterministic mode: a row's result depends on that row only.

A BLAS matmul picks its kernel (and so its reduction order) from the whole shape: on this
CPU, ``x[:1] @ w.T`` and ``(x @ w.T)[:1]`` differ in the last bits. Deterministic mode
therefore reduces every output element on its own, in one fixed order, and tiles
attention by absolute position, so a request's logits are bitwise the same alone or in a
full batch, and cold or served from the prefix cache (the vLLM/SGLang batch-invariant ops).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

#: torch's CPU elementwise loop takes fp32 in unrolled blocks of two AVX-512 vectors (32
#: lanes) and runs the last ``numel % 32`` elements through a scalar path whose exp/log round
#: differently (measured: softplus of a row alone vs in a batch of 5 differs in the last bit).
#: A row padded to a multiple of LANES never lands in that tail.
LANES = 32

#: absolute-position tile of deterministic attention and of chunked-prefill boundaries; the
#: Mamba2 chunk size divides it, so every prefill cut falls on the SSD chunk grid.
TILE = 16


def lane_aligned(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Apply an elementwise ``fn`` so that each element takes the same code path for any row count."""
    pad = (-x.shape[-1]) % LANES
    if pad == 0:
        return fn(x)
    return fn(torch.nn.functional.pad(x, (0, pad)))[..., : x.shape[-1]]


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` with each output reduced independently of how many rows ``x`` has."""
    return (x.unsqueeze(-2) * weight).sum(-1)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """Causal GQA attention whose per-query reduction depends only on the query's position.

    q: (n, Hq, D) at positions prefix_len .. prefix_len+n-1; k, v: (prefix_len+n, Hkv, D).
    Query rows are grouped in TILE-aligned blocks of absolute position; a block at b0 attends
    over exactly keys [0, b0 + TILE) (zero-padded, masked past each row), whatever the chunk.
    """
    n, num_heads, head_dim = q.shape
    total = prefix_len + n
    group = num_heads // k.shape[1]
    padded = -(-total // TILE) * TILE
    keys = torch.zeros(padded, num_heads, head_dim, dtype=k.dtype, device=k.device)
    values = torch.zeros_like(keys)
    keys[:total] = k.repeat_interleave(group, dim=1)
    values[:total] = v.repeat_interleave(group, dim=1)
    keys, values = keys.transpose(0, 1), values.transpose(0, 1)  # (H, L, D)
    out = torch.empty_like(q)
    scale = 1.0 / math.sqrt(head_dim)
    for block in range(prefix_len // TILE * TILE, total, TILE):
        lo, hi, width = max(block, prefix_len), min(block + TILE, total), block + TILE
        rows = q[lo - prefix_len : hi - prefix_len].transpose(0, 1)  # (H, r, D)
        scores = (rows.unsqueeze(2) * keys[:, None, :width]).sum(-1) * scale  # (H, r, width)
        position = torch.arange(lo, hi, device=q.device)
        future = torch.arange(width, device=q.device)[None, :] > position[:, None]
        probs = torch.softmax(scores.masked_fill(future[None], float("-inf")), dim=-1)
        mixed = (probs.unsqueeze(-1) * values[:, None, :width]).sum(2)  # (H, r, D)
        out[lo - prefix_len : hi - prefix_len] = mixed.transpose(0, 1)
    return out
