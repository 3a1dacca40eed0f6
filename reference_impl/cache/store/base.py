"""The L3 store interface (``store = file``, ``redis`` or yours), read and written by ``cache = storage``.

A store level names a class built as ``Store(location)`` (a directory, a URL, or None for the
backend's default); the registry checks it against ``Store`` when a matrix file names it.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch


class Store(Protocol):
    """Lists of CPU tensors under ``tenant/pool/page-hash`` keys; the storage cache owns what it reads.

    Ownership. A value passed to ``batch_set`` is the store's copy from then on (the caller may
    reuse its tensors); a value ``batch_get`` returns is the caller's. A store that cannot answer
    raises ``StoreError``: the cache counts a miss, never a guess, so a store error is never a wrong
    token. A key ``exists`` named may be gone by ``batch_get`` (None in its place).
    """

    def exists(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is stored."""

    def batch_get(self, keys: Sequence[str]) -> list[list[torch.Tensor] | None]:
        """The value of each key, None where missing."""

    def batch_set(self, items: Mapping[str, Sequence[torch.Tensor]]) -> None:
        """Store every item."""
