"""slot_stride_int32 on a real pool past 2**31 elements (GPU only: 17 GiB)."""
from __future__ import annotations

import pytest
import torch

from reference_impl.model.forward_batch import ForwardBatch
from tests.reference_impl.attention.test_triton_backend import HKV, HQ, D

PAGE_SIZE, STRIDE, HIGH = 4, 2**20, 4096  # page 4096 × 2**20 elements = 2**32: wraps to page 0

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device with 17 GiB free"),
]


def decode_on(pages: list[int], storage: torch.Tensor, q: torch.Tensor, faults: frozenset[str]) -> torch.Tensor:
    """Decode one request whose 8 tokens sit on ``pages`` of a pool with a 2**20-element page stride."""
    from reference_impl.attention.triton_backend import TritonBackend

    num_pages = storage.numel() // STRIDE
    k_view = storage.as_strided((num_pages, PAGE_SIZE, HKV, D), (STRIDE, HKV * D, D, 1))
    v_view = storage.as_strided((num_pages, PAGE_SIZE, HKV, D), (STRIDE, HKV * D, D, 1), PAGE_SIZE * HKV * D)
    slots = torch.tensor([p * PAGE_SIZE + o for p in pages for o in range(PAGE_SIZE)], device="cuda")
    batch = ForwardBatch(
        input_ids=torch.zeros(1, dtype=torch.long), positions=torch.zeros(1, dtype=torch.long),
        out_cache_loc=slots[-1:], qo_indptr=[0, 1], kv_indptr=[0, len(slots)], kv_indices=slots,
        prefix_lens=[len(slots) - 1], state_slots=[], checkpoints=[{}], is_decode=True,
    )
    k_new = k_view[pages[-1], -1:].clone()
    v_new = v_view[pages[-1], -1:].clone()
    return TritonBackend(PAGE_SIZE, faults=faults).forward(q, k_new, v_new, k_view, v_view, batch)


def test_int32_offsets_diverge_silently_past_2_31_and_int64_is_bit_exact() -> None:
    storage = torch.zeros((HIGH + 2) * STRIDE, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(5)
    view = storage.view(HIGH + 2, STRIDE)
    real = torch.randn(2, 2 * PAGE_SIZE * HKV * D, device="cuda", generator=gen)
    view[HIGH : HIGH + 2, : real.shape[1]] = real                                             # the request's pages
    view[0:2, : real.shape[1]] = torch.randn(2, real.shape[1], device="cuda", generator=gen)  # what a wrap reads
    view[2:4, : real.shape[1]] = real                                                         # a compact copy
    q = torch.randn(1, HQ, D, device="cuda", generator=gen)
    correct = decode_on([HIGH, HIGH + 1], storage, q, frozenset())
    compact = decode_on([2, 3], storage, q, frozenset())
    wrapped = decode_on([HIGH, HIGH + 1], storage, q, frozenset({"slot_stride_int32"}))
    torch.cuda.synchronize()
    assert torch.equal(correct, compact), "64-bit offsets must read the same bytes wherever the pages sit"
    assert torch.isfinite(wrapped).all(), "the wrap is silent: finite, plausible output"
    assert not torch.allclose(wrapped, correct), "32-bit offsets past 2**31 must read another page"
