"""Triton paged attention as a backend: SGLang's split-KV decode, two-stage extend and unified extend.

Which kernel runs. Decode batches take the two-stage split-KV decode kernel; extend batches
take the two-stage extend kernel (prefix from the pool, new K/V from the inputs), or, with
``deterministic=True``, the unified single-stage kernel (everything from the pool), as
SGLang's ``--enable-deterministic-inference`` does. Deterministic decode uses a fixed split
tile, so a request's reduction order never depends on the batch; otherwise the split count
follows the batch (more splits for small batches), like SGLang's ``num_kv_splits``.

Faults. ``unified_extend_virtual_loc`` (SGLang #33517): the unified kernel reads the new
tokens' K/V by ``batch.out_cache_loc_virtual``, untranslated. ``slot_stride_int32``
(SGLang #33974 root cause 2): every pool-reading kernel computes page × stride in int32.
Each pool-reading launch is recorded in ``launches`` for ``int32_overflow_risks``.

Kernels run compiled on CUDA and under Triton's interpreter on CPU (see ``triton_ops.common``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_impl.attention.launch_audit import LaunchGeometry
from reference_impl.attention.triton_ops.common import SHAPES, LaunchShapes
from reference_impl.attention.triton_ops.decode import decode_attention
from reference_impl.attention.triton_ops.extend import extend_attention
from reference_impl.faults import SLOT_STRIDE_INT32, UNIFIED_EXTEND_VIRTUAL_LOC
from reference_impl.model.forward_batch import ForwardBatch

class PageAlignmentError(ValueError):
    """A sequence position sits at a slot whose offset in its page differs from position % page_size."""


@dataclass(slots=True)
class _StepMeta:
    """Device copies of one batch's CSR metadata, shared by every attention layer of the step."""

    batch: ForwardBatch
    csr: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # qo_indptr, kv_indptr, prefix_lens (int32)
    new_positions: torch.Tensor  # index into kv_indices of each packed new token


class TritonBackend:
    """Paged attention through Triton kernels that read whole pages and mask arithmetically.

    ``launches`` keeps, per pool-reading kernel, the launch geometry with the largest page
    id × page stride seen so far: the input of ``int32_overflow_risks``.
    """

    name = "triton"
    #: tokens per decode split in deterministic mode (SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE, 256 there).
    decode_split_tile = 64
    #: most decode splits per request in batch-dependent mode (--triton-attention-num-kv-splits).
    max_kv_splits = 8

    def __init__(self, page_size: int, *, deterministic: bool = True, faults: frozenset[str] = frozenset(),
                 shapes: LaunchShapes = SHAPES) -> None:
        self.page_size = page_size
        self.shapes = shapes
        self.deterministic = deterministic
        self.virtual_new_loc = UNIFIED_EXTEND_VIRTUAL_LOC.name in faults
        self.index_int32 = SLOT_STRIDE_INT32.name in faults
        self.launches: list[LaunchGeometry] = []
        self._step: _StepMeta | None = None

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
        step = self._step_meta(batch, q.device)
        q = q.contiguous()
        if batch.is_decode:
            return self._decode(q, k_view, v_view, batch, step)
        max_extend = max(batch.extend_len(r) for r in range(batch.batch_size))
        indices, kernel = batch.kv_indices, "extend_two_stage"
        if self.deterministic:
            indices, kernel = self._unified_indices(batch, step), "extend_unified"
        self._record(kernel, indices, k_view)
        return extend_attention(q, k.contiguous(), v.contiguous(), k_view, v_view, step.csr, indices, max_extend,
                                unified=self.deterministic, index_int32=self.index_int32, shapes=self.shapes)

    def _unified_indices(self, batch: ForwardBatch, step: _StepMeta) -> torch.Tensor:
        """One index list per request, prefix slots then the new tokens' ``out_cache_loc``, as SGLang builds it."""
        new_loc = batch.out_cache_loc
        if self.virtual_new_loc and batch.out_cache_loc_virtual is not None:
            new_loc = batch.out_cache_loc_virtual  # the #33517 bug: the allocator's id, never translated
        unified = batch.kv_indices.clone()
        unified[step.new_positions] = new_loc.to(unified.device, unified.dtype)
        return unified

    def _decode(
        self, q: torch.Tensor, k_view: torch.Tensor, v_view: torch.Tensor, batch: ForwardBatch, step: _StepMeta
    ) -> torch.Tensor:
        """Split-KV decode; the split size per request comes from ``split_pages``."""
        pages = [-(-batch.seq_len(r) // self.page_size) for r in range(batch.batch_size)]
        per_split = self.split_pages(pages, num_kv_heads=k_view.shape[2], device=q.device)
        max_splits = max(-(-n // s) for n, s in zip(pages, per_split))
        split_pages = torch.tensor(per_split, dtype=torch.int32, device=q.device)
        self._record("decode_stage1", batch.kv_indices, k_view)
        return decode_attention(q, k_view, v_view, step.csr[1], batch.kv_indices, split_pages, max_splits,
                                index_int32=self.index_int32, shapes=self.shapes)

    def split_pages(self, pages: list[int], *, num_kv_heads: int, device: torch.device) -> list[int]:
        """Pages per decode split for each request: a fixed tile, or a batch-dependent split count."""
        if self.deterministic:
            return [-(-self.decode_split_tile // self.page_size)] * len(pages)
        cores = self.shapes.kv_split_cores or torch.cuda.get_device_properties(device).multi_processor_count
        splits = min(self.max_kv_splits, max(1, cores // (len(pages) * num_kv_heads)))
        return [max(1, -(-n // splits)) for n in pages]

    def _step_meta(self, batch: ForwardBatch, device: torch.device) -> _StepMeta:
        """CSR metadata on ``device`` for ``batch``, built (and checked) once per step."""
        if self._step is not None and self._step.batch is batch:
            return self._step
        self._check_page_aligned(batch)
        as_int32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
        csr = (as_int32(batch.qo_indptr), as_int32(batch.kv_indptr), as_int32(batch.prefix_lens))
        new_positions = [  # where each packed new token sits in kv_indices
            batch.kv_indptr[r] + batch.prefix_lens[r] + i
            for r in range(batch.batch_size)
            for i in range(batch.extend_len(r))
        ]
        self._step = _StepMeta(batch, csr, torch.tensor(new_positions, dtype=torch.long, device=device))
        return self._step

    def _check_page_aligned(self, batch: ForwardBatch) -> None:
        """Whole-page reads assume position p of a sequence sits at offset p % page_size of its page."""
        if self.page_size == 1:
            return
        seq_lens = torch.tensor([batch.seq_len(r) for r in range(batch.batch_size)])
        starts = torch.repeat_interleave(torch.tensor(batch.kv_indptr[:-1]), seq_lens)
        positions = torch.arange(len(starts)) - starts
        slots = batch.kv_indices.cpu()
        bad = (slots % self.page_size != positions % self.page_size).nonzero()
        if len(bad):
            i = int(bad[0])
            r = int(torch.searchsorted(torch.tensor(batch.kv_indptr), i, right=True)) - 1
            raise PageAlignmentError(
                f"request {r} of the batch: sequence position {int(positions[i])} sits at slot {int(slots[i])}, offset "
                f"{int(slots[i]) % self.page_size} of its page, not {int(positions[i]) % self.page_size}; the Triton "
                "kernels read whole pages and need page-aligned sequences"
            )

    def _record(self, kernel: str, indices: torch.Tensor, k_view: torch.Tensor) -> None:
        """Keep, per kernel, the launch with the largest page id × page stride."""
        max_page = int(indices.max()) // self.page_size if indices.numel() else 0
        geometry = LaunchGeometry(kernel, max_page, k_view.stride(0), 32 if self.index_int32 else 64)
        for i, seen in enumerate(self.launches):
            if seen.kernel == kernel:
                if geometry.max_index * geometry.stride > seen.max_index * seen.stride:
                    self.launches[i] = geometry
                return
        self.launches.append(geometry)
