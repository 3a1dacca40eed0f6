"""The launch geometry audit: ``int32_overflow_risks`` flags a pool-reading launch whose page offset wraps in 32 bits
(max page × stride from 2**31 up), and only those (the geometries the Triton backend records:
test_triton_backend.py)."""
from __future__ import annotations

from reference_impl.attention.launch_audit import LaunchGeometry, int32_overflow_risks


def test_int32_overflow_risks_flags_exactly_the_wrapping_geometries() -> None:
    """Synthetic geometries: flagged from max page × stride = 2**31 up, only for 32-bit offsets."""
    stride = 2**11
    at_wrap = LaunchGeometry("decode_stage1", 2**20, stride, 32)  # 2**20 × 2**11 = 2**31
    below = LaunchGeometry("extend_unified", 2**20 - 1, stride, 32)
    wide = LaunchGeometry("extend_two_stage", 2**40, stride, 64)
    (msg,) = int32_overflow_risks([at_wrap, below, wide])
    assert msg.startswith("decode_stage1") and "1048576" in msg
    assert int32_overflow_risks([below]) == []
    assert len(int32_overflow_risks([below], capacity_pages=2**20 + 1)) == 1, "the pool's last page must count"
