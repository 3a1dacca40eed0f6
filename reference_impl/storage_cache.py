"""cache=storage: L1 over L2 over an L3 store (HiCache's storage backends, Mooncake-style).

Every page and snapshot that reaches L2 is written through to the store, keyed by
``tenant/pool/chained-page-hash``; ``demote_all`` empties L1 and L2 (both are copies of what
the store holds). A match that L1 and L2 cannot cover asks the store (``exists``, then
``batch_get``), moves what it returns into L2, and loads it back into L1 like any L2 page.
A store error is a miss, recorded in ``store_errors``: never a guess, so never a wrong token.
"""
from __future__ import annotations

from collections.abc import Sequence

from reference_impl.host_pool import page_hashes
from reference_impl.stores import StoreError
from reference_impl.tiered_cache import HostCache


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

    def demote_all(self) -> None:
        """Evict L1 to L2, then drop L2: the store holds every page and snapshot written through."""
        super().demote_all()
        self.host.pages.clear()
        self.host.snapshots.clear()

    def _save(self, tokens: Sequence[int], start: int, pages: list[int], snapshots: dict[int, int]) -> None:
        """Save to L2, then write what the store lacks through to it."""
        super()._save(tokens, start, pages, snapshots)
        keys = page_hashes(tokens, self.page_size, start // self.page_size + len(pages))
        items = {self._key("kv", k): self.host.pages[k] for k in keys[start // self.page_size:]}
        for pos in snapshots:
            k = keys[pos // self.page_size - 1]
            if k in self.host.snapshots:
                items[self._key("mamba", k)] = self.host.snapshots[k]
        items = {k: v for k, v in items.items() if k not in self._written}
        try:
            self.store.batch_set(items)
        except StoreError as exc:
            self.store_errors.append(str(exc))
            return
        self._written.update(items)

    def _fetch_below(self, keys: list[str], covered: int) -> int:
        """Move the store's pages past ``covered`` (and missing snapshots up to them) into L2."""
        want = keys[covered:]
        try:
            present = self.store.exists([self._key("kv", k) for k in want]) if want else []
            n = present.index(False) if False in present else len(present)
            pages = self.store.batch_get([self._key("kv", k) for k in want[:n]])
            snap_keys = [k for k in keys[: covered + n] if k not in self.host.snapshots] if self.is_hybrid else []
            snaps = self.store.batch_get([self._key("mamba", k) for k in snap_keys])
        except StoreError as exc:
            self.store_errors.append(str(exc))
            return covered
        for key, value in zip(want[:n], pages):
            if value is None:
                break
            self.host.pages[key] = value
            self._fetched.add(key)
            covered += 1
        for key, value in zip(snap_keys, snaps):
            if value is not None:
                self.host.snapshots[key] = value
        return covered
