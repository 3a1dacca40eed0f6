"""cache=storage: L1 over L2 over an L3 store (HiCache's storage backends, Mooncake-style).

Every page and snapshot L2 is given is written through to the store, keyed by
``tenant/pool/chained-page-hash``, so L2 may drop any copy under pressure: the store still
holds it. A match that L1 and L2 cannot cover asks the store (``exists``, then ``batch_get``);
what it returns is loaded into L1 and kept in L2 (L3 → L2 → L1). A store error is a miss,
recorded in ``store_errors``: never a guess, so never a wrong token.
"""
from __future__ import annotations

import torch

from reference_impl.stores import StoreError
from reference_impl.tiered_cache import Copies, HostCache


class StorageCache(HostCache):
    """HostCache whose L2 writes through to an L3 store, and whose misses ask it."""

    lower_tiers = ("host", "storage")

    def attach_store(self, store: object, tenant: str, layout: str) -> None:
        """Use ``store`` under namespace ``tenant``; ``layout`` names the pools' tensor layout."""
        self.store, self.tenant, self.layout = store, tenant, layout
        self.store_errors: list[str] = []
        self._written: set[str] = set()

    def _key(self, pool: str, page_hash: str) -> str:
        return f"{self.tenant}/{self.layout}.{pool}/{page_hash}"

    def _keep(self, pages: Copies, snapshots: Copies) -> None:
        """Keep copies in L2, and write what the store lacks through to it."""
        super()._keep(pages, snapshots)
        items = {self._key("kv", k): v for k, v in pages.items()}
        items.update({self._key("mamba", k): v for k, v in snapshots.items()})
        items = {k: v for k, v in items.items() if k not in self._written}
        try:
            self.store.batch_set(items)
        except StoreError as exc:
            self.store_errors.append(str(exc))
            return
        self._written.update(items)

    def _fetch_below(self, keys: list[str], covered: int) -> tuple[Copies, Copies]:
        """The store's consecutive pages past ``covered``, and the snapshots L2 lacks up to their end."""
        want = keys[covered:]
        try:
            present = self.store.exists([self._key("kv", k) for k in want]) if want else []
            n = present.index(False) if False in present else len(present)
            values = self.store.batch_get([self._key("kv", k) for k in want[:n]])
            snap_keys = [k for k in keys[: covered + n] if k not in self.host.snapshots] if self.is_hybrid else []
            snaps = self.store.batch_get([self._key("mamba", k) for k in snap_keys])
        except StoreError as exc:
            self.store_errors.append(str(exc))
            return {}, {}
        pages: Copies = {}
        for key, value in zip(want[:n], values):
            if value is None:  # removed between exists and get: the prefix ends here
                break
            pages[key] = self._pinned(value)
        snapshots = {k: self._pinned(v) for k, v in zip(snap_keys, snaps) if v is not None}
        return pages, snapshots

    def _pinned(self, value: list[torch.Tensor]) -> list[torch.Tensor]:
        """A value the store decoded, in pinned memory when L2 is (a CUDA engine)."""
        return self.mover.to_host(value) if self.mover.pin else value
