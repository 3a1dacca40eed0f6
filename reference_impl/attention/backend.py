"""The attention backend interface (``backend = torch``, ``triton`` or yours): paged attention over a pool's views.

A backend level names a class built as ``Backend(page_size, *, deterministic, faults)``; the
registry checks it against ``AttentionBackend`` when a matrix file names it.
"""
from __future__ import annotations

from typing import Protocol

import torch

from reference_impl.model.forward_batch import ForwardBatch


class AttentionBackend(Protocol):
    """Reads a layer's K/V pages by the *physical* slots in ``batch``; allocates, frees and writes nothing.

    Ownership. The pool owns the views, the model runner the batch: both are valid for this one
    step only (a physical id may mean another page after the next allocation), so a backend keeps
    no slot across steps. ``batch.out_cache_loc_virtual`` is there for fault injection only: reading
    the pool by it is the bug of SGLang #33517. With ``deterministic`` a request's output must not
    depend on the batch it runs in, nor on how its prompt was chunked. A backend that computes
    offsets in fixed-width arithmetic records its launches in ``launches`` (read by the idle audit).
    """

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_view: torch.Tensor, v_view: torch.Tensor,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """Attention output (T, Hq, D) of the packed queries; new tokens' K/V are in ``k``/``v`` and already in the pool."""
