"""The report at scale: page size and time to build it in Python, and to load it in headless Chromium.

Synthetic rows (tests/report_rows.py: a nightly-like factor set, ~40% of cells failing by four
known rules, with every evidence kind) at 500 and 5,000 cells. "browser s" is Chromium's
``--dump-dom`` of the page minus the same for an empty page (process start excluded), best of 3.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.results.rows import write_lines  # noqa: E402
from reports.html import write_report  # noqa: E402
from harness.oracles import evidence_kinds  # noqa: E402
from harness.results.locate import analyze  # noqa: E402
from harness.results.reader import summarize  # noqa: E402
from tests import report_rows  # noqa: E402
from tests.reports.test_browser import FLAGS  # noqa: E402

SIZES = (500, 5000)


def browser_seconds(page: Path, profile: Path) -> float | None:
    """Best of 3 wall seconds for Chromium to load ``page`` and dump its DOM; None without chromium."""
    binary = shutil.which("chromium")
    if binary is None:
        return None
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        subprocess.run([binary, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
                       capture_output=True, timeout=300, check=True)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    print(f"load average (1, 5, 15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    work = Path(tempfile.mkdtemp(prefix="kvmatrix-bench-report-"))
    empty = work / "empty.html"
    empty.write_text("<!doctype html><title>empty</title>")
    baseline = browser_seconds(empty, work / "profile")
    print(f"{'cells':>6} {'failing':>7} {'results.jsonl MB':>16} {'index.html MB':>13} {'locate s':>8} "
          f"{'render s':>8} {'browser s':>9}")
    for n in SIZES:
        rows = report_rows.rows(n, seed=0)
        out = work / str(n)
        out.mkdir()
        write_lines(out / "results.jsonl", rows)
        started = time.perf_counter()
        analyze(rows)
        located = time.perf_counter() - started
        started = time.perf_counter()
        write_report(out, rows, summarize(rows, [report_rows.header()], n), kinds=evidence_kinds())
        rendered = time.perf_counter() - started
        browser = browser_seconds(out / "index.html", work / "profile")
        failing = sum(r["status"] in ("fail", "error") for r in rows)
        shown = f"{browser - baseline:9.2f}" if browser is not None else "  (none)"
        print(f"{n:6d} {failing:7d} {(out / 'results.jsonl').stat().st_size / 1e6:16.2f} "
              f"{(out / 'index.html').stat().st_size / 1e6:13.2f} {located:8.2f} {rendered:8.2f} {shown}", flush=True)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
