"""NaN poison for pool memory: fill buffers with a NaN bit pattern so a stale or unzeroed read shows.

SGLang's ``SGLANG_DEBUG_POISON_POOL`` (#33974) fills the pool with the bf16 NaN pattern
0x7FC1 at start-up instead of zeros. That turns "does recycled memory happen to hold a
NaN?" into a deterministic switch: any read of memory the reader does not own (a freed
page, the unwritten tail of a re-issued page) yields NaN, and the NaN oracle sees it.

Every pattern is a quiet NaN with payload 1, so a dump can tell poison (payload 1) from a
NaN the arithmetic made (payload 0).
"""
from __future__ import annotations

import torch

#: dtype → the NaN bit pattern written for it, as an integer of the same width.
NAN_PATTERNS: dict[torch.dtype, int] = {
    torch.float64: 0x7FF8000000000001,
    torch.float32: 0x7FC00001,
    torch.bfloat16: 0x7FC1,  # SGLang's pattern
    torch.float16: 0x7E01,
    torch.float8_e5m2: 0x7E,
    torch.float8_e4m3fn: 0x7F,  # the format's only NaN (it has no payload bits to spare)
}

_SAME_WIDTH_INT: dict[int, torch.dtype] = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class UnsupportedPoisonDtypeError(ValueError):
    """A dtype with no NaN (an integer type) or no known pattern."""


def nan_fill(dtype: torch.dtype) -> tuple[torch.dtype, int]:
    """The integer dtype of ``dtype``'s width and the NaN bit pattern to fill it with."""
    if dtype not in NAN_PATTERNS:
        known = ", ".join(str(d) for d in NAN_PATTERNS)
        raise UnsupportedPoisonDtypeError(f"cannot poison dtype {dtype}: it has no NaN pattern (known: {known})")
    return _SAME_WIDTH_INT[dtype.itemsize], NAN_PATTERNS[dtype]


def poison_(tensor: torch.Tensor) -> torch.Tensor:
    """Fill ``tensor`` (any strides) with its dtype's NaN pattern, in place."""
    int_dtype, pattern = nan_fill(tensor.dtype)
    tensor.view(int_dtype).fill_(pattern)
    return tensor


def poison_rows_(tensor: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """Fill the entries ``index`` along ``dim`` of ``tensor`` with NaN poison, in place."""
    int_dtype, pattern = nan_fill(tensor.dtype)
    tensor.view(int_dtype).index_fill_(dim, index, pattern)
    return tensor
