"""The staging ring (``pd_staging = on``): chunks cut on the even grid, regions handed out first in first out behind a
watermark, and one not drained or released twice refused."""
from __future__ import annotations

import pytest

from reference_impl.pd.staging import StagingIntegrityError, StagingRing, grid_cells


def test_grid_cells_cut_on_the_even_grid() -> None:
    assert grid_cells(3, 9, 2) == [(1, 3, 1), (2, 4, 2), (3, 6, 2), (4, 8, 1)]
    assert grid_cells(0, 4, 4) == [(0, 0, 4)]
    assert grid_cells(5, 5, 4) == []


def test_the_staging_ring_hands_out_regions_fifo_behind_a_watermark() -> None:
    ring = StagingRing(slots=5, chunk_pages=2)
    first = ring.reserve(decode_prefix_pages=3, total_pages=8)  # pages 3..7: cells 1..3
    assert (first.first_cell, first.cells) == (1, 3)
    second = ring.reserve(0, 4)                                 # cells 0..1: 2 slots, ring full
    assert ring.reserve(0, 1) is None, "no room before the watermark"
    ring.release(second)
    assert ring.reserve(0, 1) is None, "the watermark waits for the oldest region"
    ring.release(first)
    third = ring.reserve(0, 6)                                  # wraps around the ring end
    assert [ring.slot(third, cell) for cell in range(3)] == [0, 1, 2]
    with pytest.raises(StagingIntegrityError, match="not drained"):
        ring.check_integrity()
    ring.release(third)
    ring.check_integrity()
    with pytest.raises(StagingIntegrityError, match="twice"):
        ring.release(third)
