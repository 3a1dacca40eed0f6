"""Results files that CI can trust: shards never truncate each other, bad lines are named, JSON is strict."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.results.rows import CellResult, Verdict, as_float, dumps, loads
from harness.results.store import ResultsStore, RunInfo
from tests.harness.cli.test_main import records, write_matrix

ROOT = Path(__file__).resolve().parents[3]


def strict_json(text: str) -> object:
    """Parse as JavaScript's JSON.parse would: NaN and Infinity are errors."""
    def reject(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=reject)


@pytest.mark.parametrize("resume", [False, True])
def test_second_shard_keeps_the_first_shards_rows(tmp_path: Path, resume: bool) -> None:
    path, report = write_matrix(tmp_path), tmp_path / "out"
    assert main(["run", "--matrix", str(path), "--report-dir", str(report), "--shard", "1/2"]) == 0
    first = records(report)
    assert len(first) == 1
    assert main(["run", "--matrix", str(path), "--report-dir", str(report), "--shard", "2/2",
                 *(["--resume"] if resume else [])]) == 0
    rows = records(report)
    assert [r["cell_id"] for r in rows] == [first[0]["cell_id"], rows[1]["cell_id"]] and rows[0] == first[0]
    summary = json.loads((report / "summary.json").read_text())
    assert summary["cells_done"] == 2 and summary["cells_planned"] == 2
    assert [r["shard"] for r in summary["runs"]] == ["1/2", "2/2"]


def test_run_cell_selects_one_cell_and_names_an_unknown_one(tmp_path: Path, capsys) -> None:
    path, report = write_matrix(tmp_path), tmp_path / "out"
    cell = "/model:dense/scheduler:priority/page_size:16/"
    assert main(["run", "--matrix", str(path), "--report-dir", str(report), "--cell", cell]) == 0
    assert [r["cell_id"] for r in records(report)] == [cell]
    assert main(["run", "--matrix", str(path), "--report-dir", str(report), "--cell", cell + "x"]) == 2
    assert "closest: " + cell in capsys.readouterr().err


BAD_LINES = {
    "missing key": '{"cell_id": "a", "factors": {}, "status": "pass"}',
    "wrong type": '{"cell_id": 7, "factors": {}, "status": "pass", "oracles": {}}',
    "not JSON": "{this is not json",
    "NaN literal": '{"cell_id": "n", "factors": {}, "status": "pass", "oracles": {}, "metrics": {"x": NaN}}',
}


def good_row(cell_id: str) -> str:
    return dumps({"cell_id": cell_id, "matrix": "m", "factors": {"f": cell_id}, "status": "pass", "oracles": {},
                  "metrics": {}, "faults": [], "error": None})


@pytest.mark.parametrize("kind", [*BAD_LINES, "BOM"])
def test_report_names_file_and_line_of_a_malformed_row_and_exits_2(tmp_path: Path, capsys, kind: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    bad = "\ufeff" + good_row("bom") if kind == "BOM" else BAD_LINES[kind]
    lines = [good_row("one"), bad, good_row("two")] if kind != "BOM" else [bad, good_row("two")]
    (run / "results.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    line = 1 if kind == "BOM" else 2
    assert f"{run / 'results.jsonl'}:{line}:" in err and "error:" in err and "Traceback" not in err
    assert ("byte-order mark" in err) if kind == "BOM" else ("line skipped" in err)
    assert "two" in (run / "index.html").read_text()


def test_resume_moves_an_unreadable_line_aside_and_says_so(tmp_path: Path, capsys) -> None:
    path, report = write_matrix(tmp_path), tmp_path / "out"
    assert main(["run", "--matrix", str(path), "--report-dir", str(report), "--shard", "1/2"]) == 0
    with open(report / "results.jsonl", "a") as out:
        out.write("{torn line\n")
    assert main(["run", "--matrix", str(path), "--report-dir", str(report), "--resume"]) == 0
    err = capsys.readouterr().err
    assert f"{report / 'results.jsonl'}:2:" in err and "results.rejected.jsonl" in err
    assert (report / "results.rejected.jsonl").read_text() == "{torn line\n"
    assert len(records(report)) == 2


def test_a_nan_logprob_is_written_as_strict_json(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path, RunInfo("m", "full", None, [], 1))
    store.start(resume=False, planned={"c"})
    verdict = Verdict("logprobs", "fail", "Δ nan", [{"step": 3, "expected": -0.5, "got": math.nan, "delta": math.nan}])
    store.add(CellResult(cell_id="c", matrix="m", factors={"f": 1}, status="fail", oracles={"logprobs": verdict},
                         metrics={"mean_accept_length": math.inf, "worst": -math.inf}))
    store.finish()
    (row,) = [strict_json(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert row["oracles"]["logprobs"]["detail"][0]["got"] == "NaN"
    assert row["metrics"] == {"mean_accept_length": "Infinity", "worst": "-Infinity"}
    assert math.isnan(as_float("NaN")) and as_float("Infinity") == math.inf
    strict_json((tmp_path / "summary.json").read_text())
    with pytest.raises(ValueError):
        loads('{"x": NaN}')


def test_list_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`harness list --matrix nightly | head`: the reader goes away; no BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "harness", "list", "--matrix", str(write_matrix(tmp_path))],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err
