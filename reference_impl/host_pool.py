"""The L2 host pool: copies of device pages and Mamba snapshots, keyed by a prefix-chained page hash.

A page's key hashes its tokens chained onto its parent page's key, so equal keys mean equal
prefixes (SGLang HiCache's ``get_hash_str``). Copies go through the pools' own translation
(``kv_views`` + ``to_physical``, ``state_views`` + ``to_physical_state``): every id the cache
hands in is virtual, so the static and the unified pool work alike. Every pool that holds state
of a page moves with it: target K/V, the draft's K/V (draft pool or MTP tail layer), and the
Mamba snapshot that ends a cached prefix.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

#: fault (SGLang #30393): load-back restores the target K/V only; the draft's K/V of the page is missing.
HICACHE_DRAFT_NOT_RESTORED = "hicache_draft_not_restored"
#: fault (vLLM #50507 before the fix): hybrid offload keeps Mamba snapshots at whole blocks only.
MAMBA_WHOLE_BLOCK_OFFLOAD = "mamba_whole_block_offload"
#: the block (tokens) the faulty offload rounds Mamba snapshots to.
MAMBA_OFFLOAD_BLOCK = 32


def page_hashes(tokens: Sequence[int], page_size: int, pages: int) -> list[str]:
    """The chained key of each of the first ``pages`` whole pages of ``tokens``."""
    keys, prev = [], b""
    for i in range(pages):
        chunk = ",".join(str(t) for t in tokens[i * page_size : (i + 1) * page_size]).encode()
        prev = hashlib.sha256(prev + b"|" + chunk).hexdigest().encode()
        keys.append(prev.decode())
    return keys


@dataclass(slots=True)
class PageMover:
    """Reads and writes one virtual page (or state slot) of every pool a cached prefix spans."""

    pools: object
    page_size: int
    target_layers: int                                   # the target model's attention layers
    draft: list[tuple[object, int]] = field(default_factory=list)  # (pool, layer) of draft K/V
    mamba_layers: int = 0
    faults: frozenset[str] = frozenset()

    def _phys_page(self, pool: object, page: int) -> int:
        slot = torch.tensor([page * self.page_size])
        return int(pool.to_physical(slot)[0]) // self.page_size

    def _kv(self) -> list[tuple[object, int]]:
        return [(self.pools, layer) for layer in range(self.target_layers)] + self.draft

    def save_page(self, page: int) -> list[torch.Tensor]:
        """Host copies of K and V of ``page`` in every layer of every pool (target first, then draft)."""
        out = []
        for pool, layer in self._kv():
            phys = self._phys_page(pool, page)
            for view in pool.kv_views(layer):
                out.append(view[phys].detach().to("cpu", copy=True))
        return out

    def load_page(self, page: int, data: list[torch.Tensor]) -> None:
        """Write host copies back into ``page``; under the fault the draft's K/V is left zeroed."""
        items = iter(data)
        for index, (pool, layer) in enumerate(self._kv()):
            phys = self._phys_page(pool, page)
            for view in pool.kv_views(layer):
                saved = next(items)
                if index >= self.target_layers and HICACHE_DRAFT_NOT_RESTORED in self.faults:
                    view[phys] = 0
                else:
                    view[phys] = saved.to(view.device)

    def save_state(self, slot: int) -> list[torch.Tensor]:
        """Host copies of conv and SSM state of ``slot`` in every Mamba layer."""
        (phys,) = self.pools.to_physical_state([slot])
        return [v[phys].detach().to("cpu", copy=True) for i in range(self.mamba_layers) for v in self.pools.state_views(i)]

    def load_state(self, slot: int, data: list[torch.Tensor]) -> None:
        """Write a saved snapshot into ``slot``."""
        (phys,) = self.pools.to_physical_state([slot])
        items = iter(data)
        for i in range(self.mamba_layers):
            for view in self.pools.state_views(i):
                view[phys] = next(items).to(view.device)

    def keeps_snapshot(self, position: int) -> bool:
        """Whether offload keeps a snapshot at ``position`` (the fault keeps whole blocks only)."""
        return MAMBA_WHOLE_BLOCK_OFFLOAD not in self.faults or position % MAMBA_OFFLOAD_BLOCK == 0


class HostPool:
    """Page and snapshot copies in host memory, keyed by chained page hash (unbounded: L2 never evicts here)."""

    def __init__(self) -> None:
        self.pages: dict[str, list[torch.Tensor]] = {}
        self.snapshots: dict[str, list[torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self.pages)
