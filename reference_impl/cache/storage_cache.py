"""cache=storage: L1 over L2 over an L3 store (HiCache's storage backends, Mooncake-style).

Every page and snapshot L2 is given is written through to the store, keyed by
``tenant/pool/chained-page-hash``, so L2 may drop any copy under pressure: the store still
holds it. A match that L1 and L2 cannot cover asks the store which pages it has (``exists``);
once the request fits, ``load_back`` reads them (one ``batch_get``), loads them into L1 and
keeps them in L2 (L3 → L2 → L1). A store error is a miss,
recorded in ``store_errors``: never a guess, so never a wrong token.
"""
from __future__ import annotations

import torch

from reference_impl.cache.host_cache import Copies, HostCache, LoadPlan
from reference_impl.cache.store.backends import StoreError
from reference_impl.faults import TENANT_NAMESPACE_DROPPED


class StorageCache(HostCache):
    """HostCache whose L2 writes through to an L3 store, and whose misses ask it."""

    lower_tiers = ("host", "storage")

    def attach_store(self, store: object, tenant: str, layout: str) -> None:
        """Use ``store`` under namespace ``tenant``; ``layout`` names the pools' tensor layout."""
        dropped = TENANT_NAMESPACE_DROPPED.name in self.mover.faults
        self.store, self.tenant, self.layout = store, "default" if dropped else tenant, layout
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

    def _below(self, keys: list[str], covered: int) -> tuple[int, set[str]]:
        """The store's consecutive pages past ``covered``, and which keys up to them have a snapshot L2 lacks."""
        want = keys[covered:]
        try:
            present = self.store.exists([self._key("kv", k) for k in want]) if want else []
            n = present.index(False) if False in present else len(present)
            lacking = [k for k in keys[: covered + n] if k not in self.host.snapshots] if self.is_hybrid else []
            has = self.store.exists([self._key("mamba", k) for k in lacking]) if lacking else []
        except StoreError as exc:
            self.store_errors.append(str(exc))
            return 0, set()
        return n, {k for k, held in zip(lacking, has) if held}

    def _fetch(self, plan: LoadPlan) -> bool:
        """Read the plan's L3 pages (and snapshot) in one batch_get; False on a store error or a vanished key."""
        below = [k for k in plan.pages if k in plan.below]  # in page order
        names = [self._key("kv", k) for k in below] + ([self._key("mamba", plan.keys[-1])] if plan.snapshot_below else [])
        if not names:
            return True
        try:
            values = self.store.batch_get(names)
        except StoreError as exc:
            self.store_errors.append(str(exc))
            return False
        if any(value is None for value in values):  # dropped since exists: a miss, never a guess
            return False
        values = [self._pinned(value) for value in values]
        plan.pages.update(zip(below, values))
        if plan.snapshot_below:
            plan.snapshot = values[-1]
        return True

    def _pinned(self, value: list[torch.Tensor]) -> list[torch.Tensor]:
        """A value the store decoded, in pinned memory when L2 is (a CUDA engine)."""
        return self.mover.to_host(value) if self.mover.pin else value
