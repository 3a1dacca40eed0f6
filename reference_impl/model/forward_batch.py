"""ForwardBatch: what one model step reads, in physical ids, packed CSR-style like SGLang."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


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
    #: verify steps: (mamba layer, request) -> (conv, ssm) state after each of its tokens, for exact rollback
    mamba_trail: dict[tuple[int, int], list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return len(self.prefix_lens)

    def extend_len(self, r: int) -> int:
        return self.qo_indptr[r + 1] - self.qo_indptr[r]

    def seq_len(self, r: int) -> int:
        return self.kv_indptr[r + 1] - self.kv_indptr[r]
