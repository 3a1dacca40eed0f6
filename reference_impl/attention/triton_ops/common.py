"""Triton setup and the page-reading softmax loop that every paged attention kernel here shares.

Where the kernels run. With a CUDA device Triton compiles them; without one, importing this
module sets ``TRITON_INTERPRET=1`` (unless the variable is already set) *before* triton is
imported, so every kernel defined afterwards runs under Triton's numpy interpreter on CPU
tensors. Triton reads the variable when a kernel is decorated, so the setting is
process-wide from then on. To use the interpreter on a GPU machine, export
``TRITON_INTERPRET=1`` before the first import.

Whole pages, arithmetic masks. Like trtllm-gen, the kernels read every slot of a page that
holds at least one token of the range they attend to, including the unwritten tail of a
request's last page, and mask with arithmetic (score × mask, then probabilities × mask,
so the value tile is weighted by zero) instead of selecting with ``tl.where``/-inf. With a
zero (or any finite) tail the masked slots contribute exactly nothing and the result is
dense attention; with NaN bytes in the tail, NaN × 0 = NaN poisons the whole row — SGLang
#33974 root cause 1, where recycled pages exposed stale NaN bytes to such a kernel.

Index arithmetic. ``physical_page * page_stride`` is computed in int64, unless the kernel
is built with ``INDEX_INT32`` (the ``slot_stride_int32`` fault): then the slot id is cast
to int32 first and the product wraps mod 2**32 once it passes 2**31 — SGLang #33974 root
cause 2, where a large envelope stride folded into 32-bit offsets.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402  (must follow the TRITON_INTERPRET decision above)
import triton.language as tl  # noqa: E402

INTERPRETED: bool = bool(triton.knobs.runtime.interpret)
if INTERPRETED:
    from reference_impl.attention.triton_ops import interpreter

    interpreter.install()

#: tokens per KV tile: whole pages when a page is at most this long.
MIN_BLOCK_N = 64


@dataclass(frozen=True, slots=True)
class LaunchShapes:
    """How a kernel's work is cut into program instances; never what it computes.

    A GPU runs program instances side by side, so SGLang's shapes favour many small ones. The
    interpreter runs them one after another and pays per instance and per operation (each op is
    a Python call of ~0.1 ms, whatever its tile size), not per FLOP, so it wants few, larger ones:

    - ``extend_block_m``: new tokens per extend program. A row's keys are visited in the same
      BLOCK_N tiles from position 0 whatever the block, and the tiles past the row's own position
      are fully masked (exact no-ops: nothing added, nothing rescaled), so this does not change
      any row's result. It is a constant, never taken from the batch.
    - ``kv_split_cores``: the cores the batch-dependent decode split count fills (None: the GPU's
      SM count). Only non-deterministic mode uses it; deterministic mode's split tile is fixed.
    - ``merge_one_split``: run decode stage 2 when every request has a single split. Merging one
      split is the identity (weight exp(0) = 1, nothing to rescale), so the interpreter copies
      stage 1's output instead, bitwise the same.
    """

    extend_block_m: int
    kv_split_cores: int | None
    merge_one_split: bool


#: compiled on a GPU: SGLang's shapes.
COMPILED_SHAPES = LaunchShapes(extend_block_m=16, kv_split_cores=None, merge_one_split=True)
#: under the interpreter: 2-4x fewer extend programs, at most 2 splits per small decode batch, no
#: identity merge launch (BENCHMARKS.md, "Pools and kernels").
INTERPRETER_SHAPES = LaunchShapes(extend_block_m=32, kv_split_cores=4, merge_one_split=False)
#: the shapes of this process, chosen once with ``INTERPRETED``.
SHAPES = INTERPRETER_SHAPES if INTERPRETED else COMPILED_SHAPES


class TritonDeviceError(RuntimeError):
    """Tensors live where the kernels cannot run (CPU tensors with compiled CUDA kernels)."""


def check_device(tensor: torch.Tensor, what: str) -> None:
    """Raise unless ``tensor`` can be handed to the kernels as built in this process."""
    if not INTERPRETED and tensor.device.type != "cuda":
        raise TritonDeviceError(
            f"{what} is on {tensor.device} but Triton compiles for CUDA in this process: build the engine "
            "with device='cuda', or export TRITON_INTERPRET=1 before importing reference_impl.attention.triton_ops.common"
        )


def block_n(page_size: int) -> int:
    """KV tile length: a power of two holding whole pages (at least ``MIN_BLOCK_N`` tokens)."""
    return max(MIN_BLOCK_N, triton.next_power_of_2(page_size))


def block_d(head_dim: int) -> int:
    """Head-dim tile: a power of two, at least 16 so ``tl.dot`` accepts it."""
    return max(16, triton.next_power_of_2(head_dim))


def block_rows(n: int) -> int:
    """Query-row tile: a power of two, at least 16 so ``tl.dot`` accepts it."""
    return max(16, triton.next_power_of_2(n))


def pool_strides(k_view: torch.Tensor, v_view: torch.Tensor) -> tuple[int, int, int, int]:
    """Element strides (page, slot, head, dim) shared by the K and V views of one layer, strided or not."""
    if k_view.dim() != 4 or k_view.shape != v_view.shape:
        shapes = f"{tuple(k_view.shape)} and {tuple(v_view.shape)}"
        raise ValueError(f"K and V views must both be (num_pages, page_size, heads, dim); got {shapes}")
    if k_view.stride() != v_view.stride():
        raise ValueError(f"K and V views must share strides; got {k_view.stride()} and {v_view.stride()}")
    return k_view.stride()


@triton.jit
def attend_pages(q, m, l, acc, K, V, indices, kv_start, seq_len, start, end, last_key, head_off, sm_scale,
                 page_stride, slot_stride, dim_stride, offs_d, mask_d,
                 BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, INDEX_INT32: tl.constexpr):
    """Online softmax of the rows ``q`` over pool positions [start, end), row i seeing keys up to ``last_key[i]``.

    Position p of the sequence sits at slot ``indices[kv_start + p]``; ``start`` is page-aligned.
    A page is loaded whole when it holds any position before ``end``, and not at all otherwise.
    Returns the updated (max, sum, accumulator). One function for every pool read, kept
    inline because each jit-function call costs milliseconds under the interpreter.
    """
    for block in range(start, end, BLOCK_N):
        pos = block + tl.arange(0, BLOCK_N)
        # past the sequence end, continue the last token's page: its unwritten tail is read too
        last = tl.minimum(pos, seq_len - 1)
        slot = tl.load(indices + kv_start + last) + (pos - last)
        if INDEX_INT32:
            slot = slot.to(tl.int32)  # slot_stride_int32: the page × stride product below wraps past 2**31
        else:
            slot = slot.to(tl.int64)
        offs = (slot // PAGE_SIZE) * page_stride + (slot % PAGE_SIZE) * slot_stride
        ptrs = offs[:, None] + head_off + offs_d[None, :] * dim_stride
        page_live = ((pos // PAGE_SIZE) * PAGE_SIZE < end)[:, None] & mask_d[None, :]
        k = tl.load(K + ptrs, mask=page_live, other=0.0).to(tl.float32)
        v = tl.load(V + ptrs, mask=page_live, other=0.0).to(tl.float32)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * sm_scale
        # arithmetic mask (score × mask, probability × mask): NaN in a masked slot stays NaN
        keep = (pos[None, :] <= last_key[:, None]).to(tl.float32)
        s = qk * keep + (keep - 1.0) * 1e30
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None]) * keep
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m = m_new
    return m, l, acc
