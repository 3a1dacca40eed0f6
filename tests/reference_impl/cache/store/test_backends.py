"""The file store (``FileStore``) behind the three-call interface: values round-trip bitwise, a missing key is named as
missing, and a store directory that went away raises ``StoreError`` (the Redis store, served: test_storage_cache.py)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from reference_impl.cache.store.backends import FileStore, StoreError


def test_file_store_round_trips_bitwise(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path))
    value = [torch.randn(3, 2), torch.arange(4.0)]
    store.batch_set({"t/kv/abc": value})
    assert store.exists(["t/kv/abc", "t/kv/nope"]) == [True, False]
    got, missing = store.batch_get(["t/kv/abc", "t/kv/nope"])
    assert missing is None and all(torch.equal(a, b) for a, b in zip(got, value))
    shutil.rmtree(tmp_path)
    with pytest.raises(StoreError, match="does not exist"):
        store.exists(["t/kv/abc"])
