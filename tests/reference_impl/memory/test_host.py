"""The L2 host pool's own parts (the tiers on top: tests/reference_impl/cache/test_host_cache.py): page keys chain the
prefix, the pool drops the oldest copy L1 no longer holds, and copies of CUDA pages are pinned."""
from __future__ import annotations

import pytest
import torch

from reference_impl.memory.host import HostPool, PageMover, page_hashes


def test_page_hashes_chain_the_prefix() -> None:
    a, b = page_hashes([1, 2, 3, 4], 2, 2), page_hashes([9, 9, 3, 4], 2, 2)
    assert a[0] != b[0] and a[1] != b[1]  # same second page, different prefix
    assert page_hashes([1, 2, 3, 4, 5], 2, 2) == a


def test_host_pool_drops_the_oldest_copy_l1_no_longer_holds() -> None:
    pool = HostPool(capacity=2)
    pool.resident.add("a")
    assert pool.put("a", []) and pool.put("b", [])
    assert pool.put("c", []) and list(pool.pages) == ["a", "c"] and pool.evicted == 1  # "a" is still in L1
    pool.resident.add("c")
    assert not pool.put("d", []) and pool.refused == 1  # every copy is one L1 relies on
    pool.resident.discard("a")
    pool.touch(["a"])  # demoted: now the freshest copy, yet the only one L2 may drop
    assert pool.put("d", []) and list(pool.pages) == ["c", "d"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="page-locked host memory needs a CUDA device")
def test_host_copies_of_cuda_pages_are_pinned() -> None:
    copies = PageMover(None, 1, 0, pin=True).to_host([torch.ones(4, device="cuda")])
    assert copies[0].device.type == "cpu" and copies[0].is_pinned() and torch.equal(copies[0], torch.ones(4))
