"""`harness report` merges shards, `harness compare` finds what is new, JUnit XML for CI test views."""
from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.results.rows import write_lines
from harness.results.compare import compare
from tests import recorded_hosts, report_rows


def shard_dir(root: Path, name: str, rows: list[dict], header: dict) -> Path:
    path = root / name
    path.mkdir(parents=True)
    write_lines(path / "results.jsonl", [{**r, "run_id": header["run_id"]} for r in rows])
    write_lines(path / "runs.jsonl", [header])
    return path


@pytest.fixture
def rows() -> list[dict]:
    return report_rows.rows(60, seed=3)


def test_report_merges_shards_into_one_report(tmp_path: Path, rows: list[dict], capsys) -> None:
    one = shard_dir(tmp_path, "s1", rows[:30], report_rows.header("r1", shard="1/2", cells_planned=30, host="gpu-a"))
    two = shard_dir(tmp_path, "s2", rows[30:], report_rows.header("r2", shard="2/2", cells_planned=30, host="gpu-b"))
    out = tmp_path / "merged"
    assert main(["report", str(one), str(two), "--out", str(out), "--junit", str(out / "junit.xml")]) == 0
    merged = (out / "results.jsonl").read_text().splitlines()
    assert len(merged) == 60 and len((out / "runs.jsonl").read_text().splitlines()) == 2
    html = (out / "index.html").read_text()
    assert "gpu-a" in html and "gpu-b" in html and "60 / 60 cells" in html
    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    failing = sum(r["status"] == "fail" for r in rows)
    assert suite.get("tests") == "60" and suite.get("failures") == str(failing)
    assert suite.get("errors") == str(sum(r["status"] == "error" for r in rows))
    case = suite.find(f"testcase[@name='{next(r for r in rows if r['status'] == 'fail')['cell_id']}']")
    assert "reproduce: python -m harness run" in case.find("failure").text


def test_report_warns_on_a_cell_in_two_shards(tmp_path: Path, rows: list[dict], capsys) -> None:
    one = shard_dir(tmp_path, "s1", rows[:3], report_rows.header("r1"))
    two = shard_dir(tmp_path, "s2", rows[2:5], report_rows.header("r2"))
    assert main(["report", str(one), str(two), "--out", str(tmp_path / "m")]) == 0
    assert f"duplicate cell {rows[2]['cell_id']}" in capsys.readouterr().err
    assert len((tmp_path / "m" / "results.jsonl").read_text().splitlines()) == 5


def test_report_requires_out_to_merge_and_names_a_missing_input(tmp_path: Path, capsys) -> None:
    assert main(["report", str(tmp_path / "nope"), str(tmp_path)]) == 2
    assert "nope" in capsys.readouterr().err


def changed(rows: list[dict]) -> tuple[list[dict], dict[str, str]]:
    """A later run: one passing cell now fails, one failing cell passes, one cell's accept length halves."""
    new = copy.deepcopy(rows)
    broken = next(r for r in new if r["status"] == "pass")
    fixed = next(r for r in new if r["status"] == "fail")
    broken["status"], broken["oracles"]["nan"]["verdict"] = "fail", "fail"
    fixed["status"] = "pass"
    for verdict in fixed["oracles"].values():
        verdict["verdict"] = "pass"
    slower = next(r for r in new if r["metrics"]["mean_accept_length"] and r is not broken and r is not fixed)
    slower["metrics"]["mean_accept_length"] /= 2
    return new, {"broken": broken["cell_id"], "fixed": fixed["cell_id"], "slower": slower["cell_id"]}


def test_compare_finds_new_fixed_still_failing_and_drift(rows: list[dict]) -> None:
    new, cells = changed(rows)
    result = compare(rows, new)
    assert result.new_failures == [cells["broken"]] and result.fixed == [cells["fixed"]]
    assert [d.cell_id for d in result.drift if d.metric == "mean_accept_length"] == [cells["slower"]]
    still = sum(r["status"] in ("fail", "error") for r in rows) - 1
    assert len(result.still_failing) == still and result.compared == 60


def test_compare_command_exits_1_on_new_failures_only_and_writes_a_page(tmp_path: Path, rows: list[dict], capsys) -> None:
    base = shard_dir(tmp_path, "base", rows, report_rows.header("b"))
    new, cells = changed(rows)
    newer = shard_dir(tmp_path, "new", new, report_rows.header("n"))
    page = tmp_path / "compare.html"
    assert main(["compare", str(base), str(newer), "--html", str(page)]) == 1
    out = capsys.readouterr().out
    assert f"NEW   {cells['broken']}" in out and f"FIXED {cells['fixed']}" in out and f"DRIFT {cells['slower']}" in out
    assert cells["broken"] in page.read_text() and (tmp_path / "compare.css").exists()
    assert main(["compare", str(newer), str(newer)]) == 0
    assert main(["compare", str(base), str(newer), "--tolerance", "mean_accept_length=0.9"]) == 1
    assert "metric drift past tolerance: 0" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["report", "compare"])
@pytest.mark.parametrize("breakage", ["step", "level"])
def test_a_wrong_shaped_row_is_named_by_file_and_line_and_the_rest_is_rendered(tmp_path: Path, rows: list[dict],
                                                                              capsys, command: str, breakage: str) -> None:
    """Valid JSON, wrong shape: a finding's step that is not a number (no window to place it in), a factor level that
    is an object. The line is named, the exit is 2, and every other row is still shown."""
    bad = copy.deepcopy(rows)
    victim = next(r for r in bad if r["oracles"].get("tokens", {}).get("verdict") == "fail")
    if breakage == "step":
        finding = victim["oracles"]["tokens"]["detail"][0]
        finding["step"] = "x"
        del finding["window_start"]
    else:
        victim["factors"]["cache"] = {"level": "device"}
    run = shard_dir(tmp_path, "run", bad, report_rows.header("r", cells_planned=60))
    args = ["report", str(run)] if command == "report" else ["compare", str(run), str(run), "--html",
                                                               str(tmp_path / "compare.html")]
    assert main(args) == 2
    err = capsys.readouterr().err
    line = bad.index(victim) + 1
    assert f"results.jsonl:{line}: " in err and "Traceback" not in err, err
    assert ("'step'" if breakage == "step" else "'cache'") in err, err
    page = (run / "index.html") if command == "report" else tmp_path / "compare.html"
    shown = page.read_text()
    other = next(r for r in bad if r is not victim and r["status"] == "fail")
    assert victim["cell_id"] not in shown and other["cell_id"] in shown


def test_compare_across_hosts_says_which_facts_differ_beside_the_differing_cell(tmp_path: Path, capsys) -> None:
    """The recorded EPYC and AMX Xeon nights (tests/recorded_hosts.py): the AMX cell went pass → xfail, and the
    line names the CPU, its AMX flags and llama.cpp's AMX kernels; the cell still failing as before says nothing."""
    epyc = recorded_hosts.nightly(tmp_path / "epyc", "epyc", "run-e", amx_fails=False)
    xeon = recorded_hosts.nightly(tmp_path / "xeon", "xeon_amx", "run-x", amx_fails=True)
    page = tmp_path / "compare.html"
    assert main(["compare", str(epyc), str(xeon), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if recorded_hosts.AMX_CELL in line)
    assert line.startswith(f"  XFAIL {recorded_hosts.AMX_CELL} (pass → xfail); hosts differ in cpu_model AMD EPYC 9B14 → "
                           "Intel(R) Xeon(R) Processor, cpu_flags +avx512_fp16 +amx_tile +amx_bf16 +amx_int8, ")
    assert "llamacpp AMX_INT8 none → 1" in line and "hosts differ in: cpu_model" in out
    assert f"STILL {recorded_hosts.CELLS[2]} (tokens → tokens)\n" in out
    assert "llamacpp AMX_INT8 none → 1" in page.read_text()
    assert main(["compare", str(xeon), str(recorded_hosts.nightly(tmp_path / "x2", "xeon_amx", "run-2", False))]) == 0
    assert "hosts differ" not in capsys.readouterr().out


def test_a_report_merging_two_hosts_lists_the_cells_whose_verdicts_differ_and_the_facts(tmp_path: Path, capsys) -> None:
    epyc = recorded_hosts.nightly(tmp_path / "epyc", "epyc", "run-e", amx_fails=False)
    xeon = recorded_hosts.nightly(tmp_path / "xeon", "xeon_amx", "run-x", amx_fails=True)
    out = tmp_path / "merged"
    assert main(["report", str(epyc), str(xeon), "--out", str(out), "--junit", str(out / "junit.xml")]) == 0
    printed = capsys.readouterr().out
    assert "cells whose verdicts differ between inputs (the latter kept): 1\n" in printed
    assert f"  {recorded_hosts.AMX_CELL}: pass → xfail (tokens); hosts differ in cpu_model AMD EPYC 9B14" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert [d["cell_id"] for d in summary["differing_cells"]] == [recorded_hosts.AMX_CELL]
    html = (out / "index.html").read_text()
    assert 'id="hosts"' in html and "run <code>run-x</code>: cpu_model AMD EPYC 9B14" in html
    assert "<mark>cpu_model AMD EPYC 9B14" in html and "AMD EPYC 9B14</td><td>Intel(R) Xeon(R) Processor" in html
    assert junit_properties(out / "junit.xml")["host.llamacpp.AMX_INT8"] == "1"  # the first row's run: the Xeon's
    assert main(["report", str(epyc), "--junit", str(tmp_path / "epyc.xml")]) == 0
    properties = junit_properties(tmp_path / "epyc.xml")
    assert properties["host.cpu_model"] == "AMD EPYC 9B14" and properties["host.llamacpp.AVX512"] == "1"
    assert "host.llamacpp.AMX_INT8" not in properties and properties["host.gpu"] == "none"


def junit_properties(path: Path) -> dict[str, str]:
    suite = ET.parse(path).getroot().find("testsuite")
    return {p.get("name"): p.get("value") for p in suite.iter("property")}
