"""The boundary stage on the live reference engine (issue 42): a fault that shows only at an exact page multiple is
missed by smoke's fixed workloads and caught by the family, shrunk to at most two requests; ``--cell`` draws the
same again and the row says what; a failing draw is replayed first from the example database."""
from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import Phase, given, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from fixtures.workloads.boundary import Draw, draws
from harness import oracles
from harness.cli.main import main
from harness.matrix.file import load_matrix
from harness.matrix.model import Matrix, generate
from harness.oracles.view import Oracle
from harness.results.rows import Verdict
from harness.run.boundary import SECONDARY, cell_seams, database_key, preview
from harness.run.cell import run_plan
from harness.run.golden import GoldenRuns
from harness.run.plan import CellPlan, plan_cell

FAULT = "full_hit_last_token_only"
#: a cell the fault triggers (dense, a cache, page 16), on the workloads smoke's torch cells run
CELL = """
[matrix]
name = "{name}"
mode = "full"
workloads = {workloads}

[factors]
model = ["dense"]
cache = ["device"]
page_size = [16]
{boundary}
"""
SMOKE_WORKLOADS = '["system_prompt", "multi_turn", "long_prompts", "burst"]'


def _matrix(tmp_path: Path, name: str, workloads: str = "[]", draws: int | None = 3) -> Matrix:
    path = tmp_path / f"{name}.toml"
    boundary = f"[boundary]\ndraws = {draws}" if draws else ""
    path.write_text(CELL.format(name=name, workloads=workloads, boundary=boundary))
    return load_matrix(str(path))


def _plan(matrix: Matrix, faults: frozenset[str] = frozenset(), db: Path | None = None) -> CellPlan:
    (cell,) = generate(matrix)
    return replace(plan_cell(matrix, cell, faults), examples_db=str(db) if db else None)


def test_the_page_multiple_fault_is_missed_by_smokes_workloads_and_caught_by_the_family(tmp_path: Path) -> None:
    fixed = run_plan(_plan(_matrix(tmp_path, "fixed", SMOKE_WORKLOADS, draws=None), frozenset({FAULT})), GoldenRuns())
    assert fixed.status == "pass", fixed.oracles["cached_tokens"].message
    drawn = run_plan(_plan(_matrix(tmp_path, "drawn"), frozenset({FAULT})), GoldenRuns())
    assert drawn.status == "fail" and [n for n, v in drawn.oracles.items() if v.status == "fail"] == ["cached_tokens"]
    shrunk = drawn.metrics["boundary"]["shrunk"]
    assert shrunk is not None and shrunk["requests"] <= 2, shrunk
    assert any(n % 16 == 0 for n in shrunk["prompt_tokens"]), shrunk
    assert "boundary-" in drawn.oracles["cached_tokens"].message


def test_a_rerun_of_the_cell_draws_the_same_and_its_row_says_what(tmp_path: Path) -> None:
    matrix = _matrix(tmp_path, "rerun")
    (cell,) = generate(matrix)
    rows = []
    for n in (1, 2):
        out = tmp_path / f"run{n}"
        assert main(["run", "--matrix", str(matrix.path), "--cell", cell.cell_id, "--report-dir", str(out), "-j", "1"]) == 0
        rows.append(json.loads((out / "results.jsonl").read_text().splitlines()[0])["metrics"]["boundary"])
    first, second = ([d["draw"] for d in row["draws"]] for row in rows)
    assert first == second and len(first) == 3
    plan = _plan(matrix)
    assert [Draw.from_json(d) for d in first] == preview(plan, cell_seams(plan))
    assert all(d["shapes"] and d["failed"] == [] and d["phase"] == "draw" for d in rows[0]["draws"])
    assert rows[0]["seams"]["page"] == 16 and rows[0]["shrunk"] is None


def _written_for_it(views) -> Verdict:
    """A whole-cell check as ``pressure`` is: some workload of the cell, the one written for it, met it."""
    met = any(view.workload == "system_prompt" for view in views)
    return Verdict("written_for_it", "pass" if met else "fail", "system_prompt served" if met else "no system_prompt")


def test_a_draw_is_judged_beside_the_fixed_workloads_so_a_whole_cell_check_they_meet_fails_no_draw(
        tmp_path: Path) -> None:
    oracles.register(Oracle("written_for_it", "no system_prompt served", _written_for_it))
    try:
        alone = run_plan(_plan(_matrix(tmp_path, "alone")), GoldenRuns())
        beside = run_plan(_plan(_matrix(tmp_path, "beside", SMOKE_WORKLOADS)), GoldenRuns())
    finally:
        oracles.unregister("written_for_it")
    assert alone.status == "fail" and alone.metrics["boundary"]["draws"][0]["failed"] == ["written_for_it"]
    assert beside.status == "pass", beside.oracles
    assert [d["failed"] for d in beside.metrics["boundary"]["draws"]] == [[], [], []]


def _plant(db: Path, plan: CellPlan, key: bytes) -> Draw:
    """Save in ``db`` under ``key`` a draw of three shapes or more holding an exact page multiple, as an earlier run
    that failed on it would have (Hypothesis saves a failing example as it finds it)."""
    seams = cell_seams(plan)
    found: list[Draw] = []

    @settings(database=DirectoryBasedExampleDatabase(str(db)), phases=(Phase.generate,), max_examples=500,
              deadline=None)
    @given(draws(seams, plan.boundary.shapes))
    def earlier_run(draw: Draw) -> None:
        if len(draw.shapes) >= 3 and any(len(r.prompt) % 16 == 0 for r in draw.requests(seams)):
            found.append(draw)
            raise AssertionError("failed")

    earlier_run._hypothesis_internal_use_seed = random.Random(5).getrandbits(64)
    earlier_run._hypothesis_internal_database_key = key
    with pytest.raises(AssertionError):
        earlier_run()
    return found[-1]


def test_a_failing_draw_is_replayed_first_from_the_database(tmp_path: Path) -> None:
    db = tmp_path / "hypothesis"
    plan = _plan(_matrix(tmp_path, "replay"), frozenset({FAULT}), db)
    planted = _plant(db, plan, database_key(plan))
    boundary = run_plan(plan, GoldenRuns()).metrics["boundary"]
    assert boundary["saved"] == 1 and len(boundary["draws"]) == 1 and boundary["draws"][0]["phase"] == "replay"
    assert Draw.from_json(boundary["draws"][0]["draw"]) == planted and boundary["draws"][0]["failed"] == ["cached_tokens"]
    # a shrunk draw (the primary key's) that fails again is reported as it was saved, as Hypothesis does
    assert boundary["shrunk"]["draw"] == planted.to_json() and boundary["shrink_runs"] == 0


def test_a_larger_failing_draw_is_replayed_and_shrunk_on_the_engine(tmp_path: Path) -> None:
    db = tmp_path / "hypothesis"
    plan = _plan(_matrix(tmp_path, "shrink"), frozenset({FAULT}), db)
    planted = _plant(db, plan, database_key(plan) + SECONDARY)  # where a shrink leaves the draws it superseded
    boundary = run_plan(plan, GoldenRuns()).metrics["boundary"]
    assert boundary["draws"][0]["phase"] == "replay" and Draw.from_json(boundary["draws"][0]["draw"]) == planted
    assert len(planted.shapes) >= 3 and boundary["shrunk"]["requests"] <= 2 and boundary["shrink_runs"] > 0
    again = run_plan(plan, GoldenRuns()).metrics["boundary"]  # the shrunk draw is the one replayed now
    assert again["draws"][0]["phase"] == "replay" and again["draws"][0]["draw"] == boundary["shrunk"]["draw"]


def test_harness_repro_writes_the_shrunk_draw_as_the_script(tmp_path: Path) -> None:
    matrix = _matrix(tmp_path, "repro")
    out = tmp_path / "run"
    assert main(["run", "--matrix", str(matrix.path), "--inject-fault", FAULT, "--report-dir", str(out), "-j", "1"]) == 1
    row = json.loads((out / "results.jsonl").read_text().splitlines()[0])
    assert main(["repro", str(out), "--out", str(tmp_path / "finding")]) == 0
    finding = json.loads((tmp_path / "finding" / "finding.json").read_text())
    assert finding["script_exit"] == 1 and finding["check"].startswith("cached_tokens")
    assert finding["shrink"]["after"]["requests"] == row["metrics"]["boundary"]["shrunk"]["requests"] <= 2
    assert finding["shrink"]["after"]["prompt_tokens"] == sum(row["metrics"]["boundary"]["shrunk"]["prompt_tokens"])
