"""The pytest plugin end to end, in a child pytest: one item per cell, -k, failures with evidence."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

MATRIX = """
[matrix]
name = "tiny"
mode = "full"
workloads = ["burst"]

[factors]
model = ["dense"]
scheduler = ["fcfs", "priority"]
page_size = [1, 16]

[golden]
page_size = 16
"""


@pytest.fixture
def tiny(pytester: pytest.Pytester) -> Path:
    path = pytester.path / "tiny.toml"
    path.write_text(MATRIX)
    return path


def test_one_item_per_cell_named_by_cell_id(pytester: pytest.Pytester, tiny: Path) -> None:
    result = pytester.runpytest("-m", "matrix", "--matrix", str(tiny), "--collect-only", "-q")
    items = [line for line in result.outlines if "::" in line]
    assert items == [
        "tiny.toml::/model:dense/scheduler:fcfs/page_size:1/",
        "tiny.toml::/model:dense/scheduler:fcfs/page_size:16/",
        "tiny.toml::/model:dense/scheduler:priority/page_size:1/",
        "tiny.toml::/model:dense/scheduler:priority/page_size:16/",
    ]


def test_k_with_a_bracketed_pair_selects_exactly_that_level(pytester: pytest.Pytester, tiny: Path) -> None:
    """``-k "/page_size:1/"`` must not also select page_size:16 (the prefix match the delimiters end)."""
    result = pytester.runpytest("-m", "matrix", "--matrix", str(tiny), "--collect-only", "-q", "-k", "/page_size:1/")
    items = [line for line in result.outlines if "::" in line]
    assert items == ["tiny.toml::/model:dense/scheduler:fcfs/page_size:1/",
                     "tiny.toml::/model:dense/scheduler:priority/page_size:1/"]


def test_collect_only_leaves_a_finished_run_untouched(pytester: pytest.Pytester, tiny: Path) -> None:
    """Looking at a finished run's test ids must not restart its report: results.jsonl stays byte for byte."""
    report = pytester.path / "out"
    pytester.runpytest("-m", "matrix", "--matrix", str(tiny), "-k", "/scheduler:fcfs/page_size:16/",
                       "--report-dir", str(report)).assert_outcomes(passed=1, deselected=3)
    before = {path.name: path.read_bytes() for path in report.iterdir()}
    assert b"/page_size:16/" in before["results.jsonl"]
    result = pytester.runpytest("-m", "matrix", "--matrix", str(tiny), "--collect-only", "-q", "--report-dir", str(report))
    assert result.ret == pytest.ExitCode.OK and "kvmatrix report" not in result.stdout.str()
    assert {path.name: path.read_bytes() for path in report.iterdir()} == before


def test_collect_only_creates_no_report_dir(pytester: pytest.Pytester, tiny: Path) -> None:
    report = pytester.path / "never"
    pytester.runpytest("-m", "matrix", "--matrix", str(tiny), "--collect-only", "--report-dir", str(report))
    assert not report.exists()


def test_a_bad_matrix_shard_names_the_option_typed(pytester: pytest.Pytester, tiny: Path) -> None:
    result = pytester.runpytest("-m", "matrix", "--matrix", str(tiny), "--matrix-shard", "3/2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--matrix-shard '3/2': need 1 <= I <= N*"])
    assert "--shard " not in result.stderr.str()


def test_fault_fails_only_priority_cells_with_evidence(pytester: pytest.Pytester, tiny: Path) -> None:
    report = pytester.path / "out"
    result = pytester.runpytest(
        "-m", "matrix", "--matrix", str(tiny), "-k", "page_size:16",
        "--inject-fault", "priority_scheduler_drop", "--report-dir", str(report),
    )
    result.assert_outcomes(passed=1, failed=1, deselected=2)
    result.stdout.fnmatch_lines([
        "*cell /model:dense/scheduler:priority/page_size:16/: fail*",
        "*completeness:*never finished (lost)*",
        "*reproduce: pytest -m matrix --matrix * --device cpu --report-dir * --inject-fault priority_scheduler_drop "
        "tiny.toml::/model:dense/scheduler:priority/page_size:16/",
    ])
    rows = [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines()]
    assert sorted((r["cell_id"], r["status"]) for r in rows) == [
        ("/model:dense/scheduler:fcfs/page_size:16/", "pass"),
        ("/model:dense/scheduler:priority/page_size:16/", "fail"),
    ]


def test_bad_matrix_is_a_usage_error(pytester: pytest.Pytester, tiny: Path) -> None:
    tiny.write_text(MATRIX.replace("scheduler =", "schedular ="))
    result = pytester.runpytest("-m", "matrix", "--matrix", str(tiny))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*tiny.toml*schedular*unknown factor*"])


def test_last_failed_reruns_only_the_failing_cell(pytester: pytest.Pytester, tiny: Path) -> None:
    args = ("-m", "matrix", "--matrix", str(tiny), "-k", "page_size:16", "--inject-fault", "priority_scheduler_drop",
            "--report-dir", str(pytester.path / "out"))
    pytester.runpytest(*args).assert_outcomes(passed=1, failed=1, deselected=2)
    rerun = pytester.runpytest(*args, "--lf")
    rerun.assert_outcomes(failed=1)
    rerun.stdout.fnmatch_lines(["*/model:dense/scheduler:priority/page_size:16/*"])


def reproduce_lines(result: pytest.RunResult) -> list[str]:
    """The distinct reproduce lines a run printed (under CI=true pytest repeats them untruncated in its summary)."""
    return list(dict.fromkeys(line.split("reproduce: ", 1)[1] for line in result.outlines
                              if line.startswith("reproduce: ")))


def test_reproduce_line_round_trips_every_option(pytester: pytest.Pytester, tiny: Path) -> None:
    """Running the printed line reruns exactly that cell, with the same options, and prints the same line."""
    first = pytester.runpytest("-m", "matrix", "--matrix", str(tiny), "--strength", "2", "--matrix-shard", "2/2",
                               "--device", "cpu", "--inject-fault", "priority_scheduler_drop",
                               "--report-dir", str(pytester.path / "out"))
    (line,) = reproduce_lines(first)
    args = shlex.split(line)
    for option, value in (("--strength", "2"), ("--matrix-shard", "2/2"), ("--device", "cpu"),
                          ("--inject-fault", "priority_scheduler_drop")):
        assert args[args.index(option) + 1] == value, line
    again = pytester.runpytest(*args[1:])
    again.assert_outcomes(failed=1)
    assert reproduce_lines(again) == [line]
