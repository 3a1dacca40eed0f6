"""What a reproducer is of: the cell, the check it keeps (the planted fault's oracle first, an error's type, an xfail's
declaration) and the settings it tries to toggle (the located combination's factors first)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.matrix.file import load_matrix
from harness.repro.finding import ReproError, Toggle, asked_toggle, pick_check, pick_row, toggle_candidates
from harness.repro.report import first_notes
from harness.results.locate import Combination
from harness.results.rows import Verdict
from harness.run.trial import Check, Outcome
from reference_impl.faults import PRIORITY_SCHEDULER_DROP


def row(cell: str, status: str, oracles: dict, **extra) -> dict:
    return {"cell_id": cell, "factors": {}, "status": status, "oracles": oracles, **extra}


FAIL = {"verdict": "fail", "message": "", "detail": []}


def test_pick_row_takes_the_named_cell_or_the_first_failing_one() -> None:
    rows = [row("/a/", "pass", {}), row("/b/", "xfail", {}), row("/c/", "fail", {})]
    assert pick_row(rows, None)["cell_id"] == "/b/" and pick_row(rows, "/c/")["cell_id"] == "/c/"
    with pytest.raises(ReproError, match="status is pass"):
        pick_row(rows, "/a/")
    with pytest.raises(ReproError, match="no such cell"):
        pick_row(rows, "/z/")


def test_pick_check_prefers_the_planted_faults_oracle_and_reads_the_check_field() -> None:
    oracles = {"cached_tokens": FAIL, "completeness": FAIL,
               "accept_length": {**FAIL, "detail": [{"workload": "w", "check": "relative"}]}}
    planted = row("/x/", "fail", oracles, faults=[PRIORITY_SCHEDULER_DROP.name])
    assert pick_check(planted) == Check("completeness")
    assert pick_check(row("/x/", "fail", oracles)) == Check("cached_tokens")
    assert pick_check(row("/x/", "fail", oracles), "accept_length") == Check("accept_length", "relative")
    error = row("/x/", "error", {}, error="Traceback (most recent call last):\nIndexError: tuple index out of range")
    assert pick_check(error) == Check("error", "IndexError")
    declared = row("/x/", "xfail", {"accept_length": {"verdict": "pass", "excused": {"3": 2}}},
                   expected={"fails": ["accept_length"], "declarations": [{"signature": {"check": ["replay"]}}]})
    assert pick_check(declared) == Check("accept_length", "replay")


def test_pick_check_keeps_the_check_asked_and_refuses_one_no_finding_names() -> None:
    """inputs names each field a check: a cell whose engine changes two fields is reproduced for the one asked."""
    changed = {**FAIL, "detail": [{"check": "sampling_params.output_kind"}, {"check": "prompt.prompt_token_ids[]"}]}
    cell = row("/x/", "fail", {"inputs": changed})
    assert pick_check(cell) == Check("inputs", "sampling_params.output_kind")
    assert pick_check(cell, "inputs", "prompt.prompt_token_ids[]") == Check("inputs", "prompt.prompt_token_ids[]")
    with pytest.raises(ReproError, match="names the check 'priority'.*output_kind, prompt"):
        pick_check(cell, "inputs", "priority")


def test_a_check_fails_on_its_own_findings_only() -> None:
    outcome = Outcome({"accept_length": Verdict("accept_length", "fail", "", [{"check": "band"}])})
    assert Check("accept_length").failed(outcome) and Check("accept_length", "band").failed(outcome)
    assert not Check("accept_length", "relative").failed(outcome)
    assert Check("error", "KeyError").failed(Outcome(error="Traceback\nKeyError: 'x'"))
    assert not Check("error", "KeyError").failed(outcome)
    assert Check("accept_length", "relative").cured(outcome) and not Check("accept_length").cured(outcome)
    raised_other = Outcome(error="Traceback\nIndexError: 2")
    assert not Check("error", "KeyError").failed(raised_other) and not Check("error", "KeyError").cured(raised_other)
    assert not Check("tokens").cured(raised_other)  # a run that raised is no cure of any check


def test_toggle_candidates_put_the_located_factors_first(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text('[matrix]\nname = "m"\nmode = "full"\nworkloads = ["pair"]\n\n[factors]\n'
                    'cache = ["off", "device"]\nspec = ["none", "draft"]\npool = ["static", "unified"]\n'
                    'scheduler = ["fcfs"]\n')
    matrix = load_matrix(str(path))
    levels = {"cache": "device", "spec": "draft", "pool": "unified", "scheduler": "fcfs"}
    assert [t.factor for t in toggle_candidates(matrix, levels, None)] == ["cache", "spec", "pool"]
    located = Combination((("spec", ("draft",)), ("pool", ("unified",))))
    toggles = toggle_candidates(matrix, levels, located)
    assert [t.text() for t in toggles] == ["spec draft → none", "pool unified → static", "cache device → off"]


def test_an_asked_toggle_goes_to_any_level_the_engine_takes_and_says_so(tmp_path: Path) -> None:
    """``--toggle cache=device``: the disk tier against the prefix cache alone, whose rule the tier's save path
    shares, where the golden level (no cache) would contrast nothing; a probe matrix that lists storage alone may
    still toggle to it."""
    path = tmp_path / "m.toml"
    path.write_text('[matrix]\nname = "m"\nmode = "full"\nworkloads = ["pair"]\n\n[factors]\n'
                    'cache = ["storage"]\npage_size = [32]\n')
    matrix, levels = load_matrix(str(path)), {"cache": "storage", "page_size": 32}
    toggle = asked_toggle(matrix, levels, "cache=device")
    assert toggle == Toggle("cache", "storage", "device", asked=True)
    assert toggle.to_json() == {"factor": "cache", "level": "storage", "golden": "device", "asked": True}
    assert asked_toggle(matrix, levels, "page_size=16").golden == 16  # typed as a matrix file types it
    assert Toggle("cache", "storage", "off").to_json() == {"factor": "cache", "level": "storage", "golden": "off"}
    with pytest.raises(ReproError, match="no factor 'pool'"):
        asked_toggle(matrix, levels, "pool=static")
    with pytest.raises(ReproError, match="unknown level 'disk' of 'cache'"):
        asked_toggle(matrix, levels, "cache=disk")
    with pytest.raises(ReproError, match="the cell's own level"):
        asked_toggle(matrix, levels, "cache=storage")


def test_a_new_findings_notes_take_the_cause_of_the_declarations_of_its_check_alone() -> None:
    """An error cell also matched by another oracle's declaration (vLLM's ``inputs`` entry covers every cell) gets no
    cause from it: that declaration explains another failure."""
    declarations = [{"fails": ["inputs"], "reason": "output_kind set in place"},
                    {"fails": ["error: FileNotFoundError"], "reason": "a false hit one block short"}]
    repro = SimpleNamespace(plan=SimpleNamespace(faults=()), row={"expected": {"declarations": declarations}},
                            check=Check("error", "FileNotFoundError"),
                            toggle=SimpleNamespace(factor="spec", level="eagle"))
    notes = first_notes(repro, SimpleNamespace(engine="vllm"))
    assert notes.sections == {"Cause": "a false hit one block short"}
    assert first_notes(SimpleNamespace(**{**vars(repro), "row": {"expected": {"declarations": declarations[:1]}}}),
                       SimpleNamespace(engine="vllm")).sections == {}
    assert Check("error", "IndexError").failure_name() == "error: IndexError"
    assert Check("accept_length", "relative").failure_name() == "accept_length"
