"""PD transfer bandwidth on CPU: the same pages moved in-process, over NIXL and over Mooncake, next to one memcpy.

For each layout (a static pool page by page, the same pool cut into head slices for two decode
shards, a unified pool's whole envelopes) and each transport, the KV of every page of a 4,096-page
pool (512 for head slices) goes from the prefill side's pool into the decode side's through ``transport.write``, cut
into blocks exactly as a chunk is (pages in a scattered order, as a busy pool hands them out); a
plain ``torch`` copy of the same number of bytes in one piece sets the ceiling. Best and median of
REPEATS, one run, GiB/s; the ratio is to the memcpy.
"""
from __future__ import annotations

import importlib
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fixtures.workloads import load_workload  # noqa: E402
from harness.sut.reference.engine import build_engine_config  # noqa: E402
from harness.run.cell import configure_torch  # noqa: E402
from reference_impl import registry  # noqa: E402
from reference_impl.pd.disagg import DisaggEngine  # noqa: E402
from reference_impl.pd.inproc.conn import InprocTransport  # noqa: E402

REPEATS = 5
#: layout → (levels, pages moved): head slices are 64-byte blocks, so fewer pages keep the run short
LAYOUTS = {
    "static, page blocks": ({"pool": "static"}, 4096),
    "static, head slices (decode_tp 2)": ({"pool": "static", "decode_tp": 2}, 512),
    "unified, envelopes": ({"pool": "unified"}, 4096),
}


def engine(transport: type, levels: dict[str, object], pages: int) -> DisaggEngine:
    config = build_engine_config({"page_size": 16, **levels}, load_workload("pair"), frozenset())
    return DisaggEngine(replace(config, pd=transport, num_pages=pages))


def all_pages(pd: DisaggEngine, pages: int) -> list:
    """Block pairs of every page, in the scattered order a busy pool hands pages out (seeded permutations)."""
    src, dst = (torch.randperm(pages, generator=torch.Generator().manual_seed(seed)).tolist() for seed in (1, 2))
    return pd.sender.page_pairs(src, dst)


def timed(fn: object) -> list[float]:
    out = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def gib_s(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 2**30


def main() -> None:
    configure_torch()
    transports = {"inproc": InprocTransport}
    for level, probe in (("nixl", "nixl._api"), ("mooncake", "mooncake.engine")):
        try:
            transport = registry.resolve("pd", level)  # first: it quiets the library's logging before its import
            importlib.import_module(probe)
            transports[level] = transport
        except ImportError as exc:
            print(f"pd={level} cannot run here ({exc}): its rows are missing (make installs it)")
    print(f"{'layout':36s} {'transport':9s} {'blocks':>7s} {'MiB':>6s} {'best GiB/s':>10s} {'median':>7s} "
          f"{'memcpy GiB/s':>12s} {'ratio':>6s}")
    for layout, (levels, pages) in LAYOUTS.items():
        for name, transport in transports.items():
            pd = engine(transport, levels, pages)
            try:
                pairs = all_pages(pd, pages)
                nbytes = sum(src[2] for src, _ in pairs)
                seconds = timed(lambda: pd.transport.write(pairs, None))
            finally:
                pd.close()
            src, dst = torch.empty(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
            copy = min(timed(lambda: dst.copy_(src)))
            best, median = min(seconds), statistics.median(seconds)
            print(f"{layout:36s} {name:9s} {len(pairs):7d} {nbytes / 2**20:6.1f} {gib_s(nbytes, best):10.3f} "
                  f"{gib_s(nbytes, median):7.3f} {gib_s(nbytes, copy):12.2f} {copy / best:6.3f}", flush=True)
    print(f"memcpy: one torch copy of the same bytes in one piece, best of {REPEATS}, measured next to each row; "
          "ratio = transport best / memcpy best")


if __name__ == "__main__":
    main()
