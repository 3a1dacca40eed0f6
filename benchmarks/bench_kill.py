"""The kill matrix: fault × generation mode → detected?, cells run, seconds.

One factor at a time (what most CI suites do), 2-wise and 3-wise covering arrays of the same
matrix, each run with one fault injected. A fault that needs three factors at once (SGLang
#33517: unified pool × Triton × deterministic; SGLang #30545: PD × staging × a decode-side hit)
is invisible to OFAT and guaranteed to 3-wise.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.run.faultcheck import check_fault  # noqa: E402
from harness.matrix.file import load_matrix  # noqa: E402
from harness.run.golden import GoldenRuns  # noqa: E402
from harness.run.cell import configure_torch  # noqa: E402

#: matrix → the faults judged on it: the seed faults of the unified pool × Triton, and PD's grid shift
#: (which needs PD, the staging buffer and a decode-side cache hit at once).
FAULTS = {
    "kill": ["unified_extend_virtual_loc", "unified_no_zero_on_issue", "slot_stride_int32"],
    "kill_pd": ["pd_staging_grid_shift"],
}


def main() -> None:
    configure_torch()
    goldens = GoldenRuns()
    print(f"{'fault':28s} {'mode':7s} {'detected':8s} {'trigger cells hit':17s} {'cells':5s} {'seconds':7s}")
    for matrix, faults in FAULTS.items():
        base = load_matrix(matrix, matrices_dir=ROOT / "matrices")
        modes = {"ofat": dataclasses.replace(base, mode="ofat"), "2-wise": base.with_strength(2),
                 "3-wise": base.with_strength(3)}
        for fault in faults:
            for mode, matrix in modes.items():
                check = check_fault(matrix, fault, goldens)
                hit = len(check.triggered & check.seen_by_oracle)
                print(f"{fault:28s} {mode:7s} {'yes' if check.detected else 'NO':8s} {hit:17d} {check.cells:5d} "
                      f"{check.seconds:7.1f}", flush=True)


if __name__ == "__main__":
    main()
