"""Launch-geometry audit: where would a kernel's 32-bit offset arithmetic wrap (SGLang #33974 root cause 2).

A kernel that folds ``page * page_stride`` into 32 bits is exact until that product passes
2**31, which only load on a large pool reaches; a CPU test pool never does. So every
pool-reading launch records its geometry, and the audit asks whether the same layout, sized
for a deployment KV budget (``AUDIT_KV_BYTES``), could wrap.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: the KV budget audited: a 24 GiB pool, small for an 80-141 GiB GPU. Every static layout of
#: the reference models fits 32-bit offsets there; page-major envelopes (the unified pool's
#: stride covers every layer) do not.
AUDIT_KV_BYTES = 24 * 2**30


@dataclass(frozen=True, slots=True)
class LaunchGeometry:
    """Index geometry of a pool-reading kernel: largest page id read × page stride (elements), and offset width."""

    kernel: str
    max_index: int
    stride: int
    index_bits: int


def int32_overflow_risks(launches: Iterable[LaunchGeometry], capacity_pages: int | None = None) -> list[str]:
    """One message per kernel whose 32-bit offset arithmetic can wrap (SGLang #33974 root cause 2).

    The page id checked is the largest seen, or the pool's last page when ``capacity_pages``
    is given (load pushes page ids there, so a short test run would not see it).
    """
    risks = []
    for launch in launches:
        if launch.index_bits != 32:
            continue
        page = launch.max_index if capacity_pages is None else max(launch.max_index, capacity_pages - 1)
        if page * launch.stride >= 2**31:
            first = -(-(2**31) // launch.stride)
            risks.append(
                f"{launch.kernel}: page {page} × page stride {launch.stride} = {page * launch.stride} ≥ 2**31 "
                f"with 32-bit offsets: from page {first} on, offsets wrap onto other pages' bytes or out of the pool; "
                "promote the page id to int64 before multiplying by the stride"
            )
    return risks
