"""ForwardBatch: what one model step reads, in physical ids, packed CSR-style like SGLang."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_impl.config import Mamba2Config


@dataclass(slots=True)
class VerifyScratch:
    """The Mamba state after every token of a verify step, per layer and batch row, for exact rollback.

    SGLang's ``intermediate_ssm_state_cache``: (k + 1) states per running request and Mamba layer,
    allocated once with the engine. Only an engine that verifies needs it; a PD prefill server
    never runs a verify step and must not pay for it (SGLang #34191: 24 GB per rank).
    """

    conv: list[torch.Tensor]  # per Mamba layer: (rows, positions, *conv_state_shape)
    ssm: list[torch.Tensor]   # per Mamba layer: (rows, positions, *ssm_state_shape)

    @classmethod
    def allocate(
        cls, mamba: Mamba2Config, layers: int, rows: int, positions: int, device: str, dtype: torch.dtype
    ) -> VerifyScratch:
        """Scratch for ``rows`` requests verifying up to ``positions`` tokens each, in ``layers`` Mamba layers."""
        conv = [torch.zeros(rows, positions, *mamba.conv_state_shape(), device=device, dtype=dtype) for _ in range(layers)]
        ssm = [torch.zeros(rows, positions, *mamba.ssm_state_shape(), device=device, dtype=dtype) for _ in range(layers)]
        return cls(conv, ssm)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.conv, *self.ssm))


@dataclass(slots=True)
class ForwardBatch:
    """One step over B requests; request r owns packed tokens ``qo_indptr[r]:qo_indptr[r+1]``.

    Every id here is physical: the model runner translates at construction, so kernels
    never see a virtual id. ``kv_indices[kv_indptr[r]:kv_indptr[r+1]]`` lists the token
    slots of request r's whole sequence (prefix first, then the new tokens).
    """

    input_ids: torch.Tensor        # (T,) packed new tokens
    positions: torch.Tensor        # (T,) absolute positions
    out_cache_loc: torch.Tensor    # (T,) physical slot for each new token's K/V; -1 = do not write
    qo_indptr: list[int]           # (B+1,) prefix sums of extend lengths
    kv_indptr: list[int]           # (B+1,) prefix sums of sequence lengths
    kv_indices: torch.Tensor       # (sum seq_lens,) physical token slots
    prefix_lens: list[int]         # tokens already in the pool before this step
    state_slots: list[int]         # physical Mamba state slot per request (hybrid models)
    checkpoints: list[dict[int, int]]  # per request: absolute position -> physical slot to snapshot into
    is_decode: bool                # every request adds exactly one token after a prefix
    out_cache_loc_virtual: torch.Tensor | None = None  # the untranslated slots, kept only to model missed translations
    verify: bool = False           # speculative verify step: the last token plus drafts, Mamba stepped token by token
    verify_scratch: VerifyScratch | None = None  # verify steps of hybrid models: where each token's Mamba state goes

    @property
    def batch_size(self) -> int:
        return len(self.prefix_lens)

    def extend_len(self, r: int) -> int:
        return self.qo_indptr[r + 1] - self.qo_indptr[r]

    def seq_len(self, r: int) -> int:
        return self.kv_indptr[r + 1] - self.kv_indptr[r]
