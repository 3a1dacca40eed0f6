"""``make bench``: every benchmark, one after the other, each in its own process (clean memory figures)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ["bench_covering.py", "bench_first_run.py", "bench_smoke.py", "bench_kernels.py", "bench_pools.py",
              "bench_kill.py", "bench_spec.py", "bench_tiers.py", "bench_pd.py", "bench_report.py", "bench_engines.py"]


def main() -> int:
    failed = 0
    for name in BENCHMARKS:
        print(f"== {name}", flush=True)
        failed += subprocess.call([sys.executable, str(HERE / name)]) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
