"""`make matrix`'s work, before and after issue 14: the smoke matrix from process start to the report written.

"Before" is main as it was before the first-run work (``BEFORE``, extracted with ``git archive``),
"after" is this tree, both run here with the same Python, one after the other: the command line of
``make matrix`` (``python -m harness run --matrix smoke``; after: its default ``-j``, the cores this
process may use). Prints the wall seconds of each, the cells' statuses, and the speed-up. (No CPU
figure: the workers are forked by a forkserver, not by the measured process, so its rusage misses them.)
Target (issue 14): at most 120 s on an idle 2-core machine.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: main just before issue 14's work was merged (serial cells, Triton cells on the four default workloads).
BEFORE = "86182c9"
TARGET_S = 120.0


def extract(rev: str, into: Path) -> Path:
    """The tree of ``rev`` under ``into``, from this repository's history."""
    archive = into / "before.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def timed_run(tree: Path, report: Path) -> tuple[float, dict]:
    """Wall seconds of the smoke run in ``tree``, and its summary counts."""
    env = {k: v for k, v in os.environ.items() if k not in ("KVMATRIX_JOBS", "PYTHONPATH")}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "harness", "run", "--matrix", "smoke", "--report-dir", str(report)],
                          cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"the smoke run in {tree} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return wall, json.loads((report / "summary.json").read_text())["counts"]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="kvmatrix-first-run-") as tmp:
        try:
            before_tree = extract(BEFORE, Path(tmp))
        except (subprocess.CalledProcessError, FileNotFoundError) as exc:
            print(f"cannot extract {BEFORE} from this checkout's history ({exc}): no before/after figure")
            return
        print(f"smoke matrix, process start to report written; {os.cpu_count()} cores, "
              f"load average {os.getloadavg()[0]:.2f} at start")
        figures = {}
        for label, tree in (("after", ROOT), ("before", before_tree)):
            wall, counts = timed_run(tree, Path(tmp) / f"out-{label}")
            figures[label] = wall
            print(f"  {label:6s} wall {wall:6.1f} s  load average {os.getloadavg()[0]:.2f}  {counts}", flush=True)
        print(f"  speed-up {figures['before'] / figures['after']:.2f}x; after vs the {TARGET_S:.0f} s target: "
              f"{figures['after'] / TARGET_S:.2f}x; load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
