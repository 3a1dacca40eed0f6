"""Cache tiers on CPU: per-page cost of loading a page back from L2 (host) and L3 (file, Redis),
next to recomputing it (a prefill of the same page), for the dense and the hybrid model; and
what each cache level keeps of the spill workloads' warm pass under organic L1/L2 pressure."""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.sut.reference.engine import build_engine_config  # noqa: E402
from harness.run.cell import configure_torch  # noqa: E402
from fixtures.workloads import load_workload  # noqa: E402
from reference_impl.cache.store.backends import FileStore, RedisStore, StoreError  # noqa: E402
from reference_impl.engine.llm_engine import Engine  # noqa: E402
from reference_impl.request import TIERS, RequestSpec  # noqa: E402

PAGE = 16
PAGES = 32
REPEATS = 5


def engine(model: str) -> Engine:
    """A dense or hybrid engine with cache=host, page_size 16."""
    config = build_engine_config({"model": model, "cache": "host", "page_size": PAGE}, load_workload("pair"), frozenset())
    return Engine(replace(config, num_pages=4 * PAGES))


def recompute_us(model: str) -> float:
    """Microseconds of target forward per page of a fresh PAGES-page prefill (cache off)."""
    config = build_engine_config({"model": model, "page_size": PAGE}, load_workload("pair"), frozenset())
    best = float("inf")
    for i in range(REPEATS):
        eng = Engine(replace(config, num_pages=4 * PAGES))
        eng.generate([RequestSpec(f"r{i}", tuple((7 * j + i) % 256 for j in range(PAGES * PAGE)), 1)])
        best = min(best, eng.stats.forward_seconds)
    return best / PAGES * 1e6


def load_us(eng: Engine, store: object | None) -> float:
    """Microseconds per page: (L3 batch_get, when given a store, then) L2 → L1 copy into a fresh page."""
    mover = eng.cache.mover
    pages = eng.pools.alloc_pages(PAGES)
    saved = [mover.save_page(p) for p in pages]
    keys = [f"bench/kv/{i}" for i in range(PAGES)]
    if store is not None:
        store.batch_set(dict(zip(keys, saved)))
    best = float("inf")
    for _ in range(REPEATS):
        started = time.perf_counter()
        data = store.batch_get(keys) if store is not None else saved
        for page, value in zip(pages, data):
            mover.load_page(page, value)
        best = min(best, time.perf_counter() - started)
    eng.pools.free_pages(pages)
    return best / PAGES * 1e6


def redis_store(tmp: str) -> tuple[RedisStore | None, subprocess.Popen | None]:
    """A private redis-server on 127.0.0.1, or (None, None) when none is installed."""
    binary = shutil.which("redis-server")
    if binary is None:
        return None, None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", tmp],
                            stdout=subprocess.DEVNULL)
    store = RedisStore(f"redis://127.0.0.1:{port}/0")
    for _ in range(100):
        try:
            store.exists(["ping"])
            return store, proc
        except StoreError:
            time.sleep(0.05)
    return None, proc


def spill_row(workload: str, cache: str) -> str:
    """One table row: the warm pass of ``workload`` on ``cache``, after its cold pass evicted the tails."""
    w = load_workload(workload)
    eng = Engine(build_engine_config({"model": "dense", "cache": cache, "page_size": PAGE}, w, frozenset()))
    eng.generate(w.requests)
    before = (eng.stats.prefill_tokens, eng.stats.forward_seconds)
    warm = eng.generate(w.requests)
    prefill = eng.stats.prefill_tokens - before[0]
    seconds = eng.stats.forward_seconds - before[1]
    split = [sum(o.cached_by_tier()[tier] for o in warm) for tier in TIERS]
    host = getattr(eng.cache, "host", None)
    l2 = f"{len(host)} / {host.evicted}" if host is not None else "–"
    return f"| {workload} | {cache} | {' | '.join(map(str, split))} | {prefill} | {seconds * 1e3:.0f} | {l2} |"


def main() -> None:
    configure_torch()
    print("spill workloads (dense, page_size 16, L1 160 tokens), warm pass after the cold pass pushed the tails out:")
    print("| workload | cache | cached device | cached host | cached storage | prefill tokens computed | forward ms | L2 pages held / evicted |")
    print("|---|---|---|---|---|---|---|---|")
    for workload in ("spill_host", "spill_storage"):
        for cache in ("device", "host", "storage"):
            print(spill_row(workload, cache))
    print()
    with tempfile.TemporaryDirectory() as tmp:
        redis, proc = redis_store(tmp)
        try:
            print(f"per-page cost, page_size {PAGE}, best of {REPEATS} over {PAGES} pages (µs):")
            print("| model | recompute | L2 host | L3 file | L3 redis |")
            print("|---|---|---|---|---|")
            for model in ("dense", "hybrid"):
                eng = engine(model)
                row = [recompute_us(model), load_us(eng, None), load_us(eng, FileStore(f"{tmp}/{model}"))]
                row.append(load_us(eng, redis) if redis else None)
                cells = " | ".join(f"{v:.0f}" if v is not None else "n/a (no redis-server)" for v in row)
                print(f"| {model} | {cells} |")
        finally:  # the private redis-server never outlives the benchmark, even when it fails
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=10)


if __name__ == "__main__":
    main()
