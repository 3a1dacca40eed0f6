"""Pools and kernels on CPU: seconds per cell torch vs Triton (interpreter), and the unified pool's
allocation + compaction cost per page next to the static pool's, side by side in one run."""
from __future__ import annotations

import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fixtures.workloads import load_workload  # noqa: E402
from harness.run.cell import configure_torch  # noqa: E402
from harness.run.serve import run_workload  # noqa: E402
from reference_impl.config import DENSE, HYBRID  # noqa: E402
from reference_impl.memory.static import StaticPools  # noqa: E402
from reference_impl.memory.unified import UnifiedPool  # noqa: E402

PAGES = 4096


def seconds_per_cell() -> None:
    """One workload cold + warm (+ alone, deterministic) on each backend; the ratio is the interpreter's cost."""
    workload = load_workload("system_prompt")
    print(f"seconds per workload run ({workload.name}, cold + warm, + each request alone when deterministic):")
    for model in ("dense", "hybrid"):
        for deterministic in ("off", "on"):
            times = {}
            for backend in ("torch", "triton"):
                levels = {"model": model, "backend": backend, "deterministic": deterministic,
                          "cache": "device", "page_size": 16}
                started = time.perf_counter()
                run_workload(levels, workload, frozenset())
                times[backend] = time.perf_counter() - started
            print(f"  {model:6s} deterministic={deterministic:3s}  torch {times['torch']:6.2f} s  "
                  f"triton {times['triton']:6.2f} s  ratio {times['triton'] / times['torch']:6.1f}x")


def churn(pool, rng: random.Random) -> tuple[float, float, float]:
    """Fill the pool, free a random half, refill: µs per page for alloc, free and compact."""
    started = time.perf_counter()
    live = [pool.alloc_pages(1)[0] for _ in range(PAGES)]
    alloc = time.perf_counter() - started
    rng.shuffle(live)
    started = time.perf_counter()
    for page in live[: PAGES // 2]:
        pool.free_pages([page])
    free = time.perf_counter() - started
    compact = 0.0
    if hasattr(pool, "compact"):
        started = time.perf_counter()
        moved = pool.compact()
        compact = (time.perf_counter() - started) / max(moved, 1)
    return alloc / PAGES * 1e6, free / (PAGES // 2) * 1e6, compact * 1e6


def pool_costs() -> None:
    print(f"pool cost per page ({PAGES} pages, page_size 16, fill / free a random half / compact):")
    for model in (DENSE, HYBRID):
        for name, make in (
            ("static", lambda m, p: StaticPools(m, page_size=16, num_pages=PAGES, num_state_slots=8, poison=p)),
            ("unified lazy", lambda m, p: UnifiedPool(m, page_size=16, num_pages=PAGES, num_state_slots=8, poison=p)),
            ("unified eager", lambda m, p: UnifiedPool(m, page_size=16, num_pages=PAGES, num_state_slots=8,
                                                       poison=p, compaction="eager")),
        ):
            for poison in (False, True):
                alloc, free, compact = churn(make(model, poison), random.Random(0))
                print(f"  {model.name:6s} {name:13s} poison={'on ' if poison else 'off'}  alloc {alloc:7.1f} µs  "
                      f"free {free:7.1f} µs  compact {compact:7.1f} µs/moved page")


if __name__ == "__main__":
    configure_torch()
    pool_costs()
    seconds_per_cell()
