"""Each of issue 12's blind spots, planted as a fault: a matrix cell now fails through the right oracle,
and the same matrix without the fault passes.

(``test_faults`` checks that each fails exactly its trigger cells, through its oracle.)

1. a proposer bug the golden run shares (ngram_prompt_only, injected on both sides);
2. no isolation workload (tenant_namespace_dropped);
3. random prompts never put a page under two prefixes (page_key_forgets_prefix);
4. no pressure while speculating (draft_pages_kept_on_preempt);
5. divergence only on node boundaries (split_snapshot_to_head);
6. no request holding a locked prefix while others evict around it (evict_ignores_lock).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.workloads import Workload, load_workload
from harness.sut.reference import LEVELS
from harness.matrix.model import generate
from harness.run.golden import GoldenKey, GoldenRuns
from harness.run.serve import WorkloadRun, run_workload
from harness.run.cell import run_cell
from reference_impl.faults import FAULTS
from tests.reference_impl.test_faults import fault_matrix

pytestmark = pytest.mark.slow

CAUSES = ["ngram_prompt_only", "tenant_namespace_dropped", "page_key_forgets_prefix", "draft_pages_kept_on_preempt",
          "split_snapshot_to_head", "evict_ignores_lock"]


@pytest.mark.parametrize("fault", CAUSES)
def test_the_clean_matrix_of_each_planted_bug_passes(fault: str, tmp_path: Path) -> None:
    """Without the fault its trigger cells pass, so the failures ``test_faults`` sees there (exactly the trigger
    cells, through the fault's oracle) come from the planted bug and not from the workload. (The other cells
    pass with the fault injected: ``test_faults`` fails on any cell it cannot reach.)"""
    matrix, goldens = fault_matrix(fault, tmp_path), GoldenRuns()
    triggers = [c for c in generate(matrix) if FAULTS[fault].triggered_by(LEVELS.full(c.as_dict()))]
    assert triggers, f"the matrix of {fault} has no trigger cell"
    clean = {cell.cell_id: run_cell(matrix, cell, faults=frozenset(), goldens=goldens) for cell in triggers}
    assert all(r.status == "pass" for r in clean.values()), {c: r.status for c, r in clean.items()}


class BuggyGoldens(GoldenRuns):
    """Golden runs with the same code bug as the cell: what a one-line slip in a proposer looks like."""

    def __init__(self, faults: frozenset[str]) -> None:
        super().__init__()
        self.faults = faults

    def get(self, key: GoldenKey, workload: Workload | None = None) -> WorkloadRun:
        _, _, levels, name = key
        return run_workload(dict(levels), workload or load_workload(name), self.faults, self.device)


def test_a_proposer_bug_in_golden_too_is_still_seen_by_the_prompt_lookup_replay(tmp_path: Path) -> None:
    fault = frozenset({"ngram_prompt_only"})
    matrix = fault_matrix("ngram_prompt_only", tmp_path)
    cell = next(c for c in generate(matrix) if c.as_dict()["spec"] == "ngram" and c.as_dict()["model"] == "dense")
    verdict = run_cell(matrix, cell, faults=fault, goldens=BuggyGoldens(fault)).oracles["accept_length"]
    checks = {finding["check"] for finding in verdict.detail}
    assert verdict.status == "fail" and checks == {"trace"}, verdict.detail  # golden agrees: no "relative" finding
    assert FAULTS["ngram_prompt_only"].oracle == "accept_length"


# -- issue 20: one new fault per cause, each seen by the oracle that should see it ---------------------
#: 1 PD's bookkeeping unjudged, 2 bands under pressure, 3 pd deterministic-only and loss-free, 4 tiers masking
#: each other, 5 accept bands at k = 3 only.
CAUSES_20 = ["pd_prefill_verify_scratch", "evict_counts_leaves", "pd_partial_page_early", "pd_abort_caches_pages",
             "host_demotes_as_oldest", "draft_chain_default_steps"]
#: those whose trigger needs two or more factors off their golden level
MULTI_FACTOR = ["pd_prefill_verify_scratch", "pd_partial_page_early", "pd_abort_caches_pages", "draft_chain_default_steps"]


@pytest.mark.parametrize("fault", CAUSES_20)
def test_the_clean_matrix_of_each_issue_20_fault_passes(fault: str, tmp_path: Path) -> None:
    test_the_clean_matrix_of_each_planted_bug_passes(fault, tmp_path)


def ofat_matrix(fault: str, tmp_path: Path) -> object:
    """The fault's check matrix generated one factor at a time from its golden cell, as most CI suites test."""
    from harness.matrix.file import load_matrix
    from tests.reference_impl.test_faults import MATRIX_OF

    text = MATRIX_OF[fault].replace('mode = "t-wise"', 'mode = "ofat"').replace('mode = "full"', 'mode = "ofat"')
    text = "\n".join(line for line in text.splitlines() if not line.startswith("strength"))
    name = text.split('name = "')[1].split('"')[0]
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return load_matrix(str(path))


@pytest.mark.parametrize("fault", MULTI_FACTOR)
def test_one_factor_at_a_time_misses_each_multi_factor_fault(fault: str, tmp_path: Path) -> None:
    """No cell of the one-factor-at-a-time array triggers it, and every one passes with it injected; the full (or
    t-wise) matrix of the same factors fails exactly its trigger cells (test_faults)."""
    matrix, goldens = ofat_matrix(fault, tmp_path), GoldenRuns()
    cells = generate(matrix)
    assert not [c for c in cells if FAULTS[fault].triggered_by(LEVELS.full(c.as_dict()))]
    results = {c.cell_id: run_cell(matrix, c, faults=frozenset({fault}), goldens=goldens).status for c in cells}
    assert set(results.values()) == {"pass"}, results
