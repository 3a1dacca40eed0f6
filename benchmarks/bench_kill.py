"""The kill matrix: fault × generation mode → detected?, cells run, seconds.

One factor at a time (what most CI suites do), 2-wise and 3-wise covering arrays of the same
matrix, each run with one fault injected. A fault that needs three factors at once (SGLang
#33517: unified pool × Triton × deterministic) is invisible to OFAT and guaranteed to 3-wise.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.killmatrix import check_fault  # noqa: E402
from harness.matrix_file import load_matrix  # noqa: E402
from harness.runner import GoldenRuns, configure_torch  # noqa: E402

FAULTS = ["unified_extend_virtual_loc", "unified_no_zero_on_issue", "slot_stride_int32"]


def main() -> None:
    configure_torch()
    base = load_matrix("kill", matrices_dir=ROOT / "matrices")
    modes = {"ofat": dataclasses.replace(base, mode="ofat"), "2-wise": base.with_strength(2), "3-wise": base.with_strength(3)}
    goldens = GoldenRuns()
    print(f"{'fault':28s} {'mode':7s} {'detected':8s} {'trigger cells hit':17s} {'cells':5s} {'seconds':7s}")
    for fault in FAULTS:
        for mode, spec in modes.items():
            check = check_fault(spec, fault, goldens)
            hit = len(check.triggered & check.seen_by_oracle)
            print(f"{fault:28s} {mode:7s} {'yes' if check.detected else 'NO':8s} {hit:17d} {check.cells:5d} "
                  f"{check.seconds:7.1f}", flush=True)


if __name__ == "__main__":
    main()
