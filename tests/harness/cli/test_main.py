"""The command line end to end on tiny matrices: exit codes, files written, resume, errors, timeouts."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli.main import main

TINY = """
[matrix]
name = "{name}"
mode = "full"
workloads = ["system_prompt"]
timeout_s = {timeout}

[factors]
model = ["dense"]
scheduler = {schedulers}
page_size = [16]
"""


def write_matrix(tmp_path: Path, name: str = "tiny", schedulers: str = '["fcfs", "priority"]', timeout: float = 120) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(TINY.format(name=name, schedulers=schedulers, timeout=timeout))
    return path


def records(report: Path) -> list[dict]:
    return [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines()]


def test_run_passes_and_writes_the_three_files(tmp_path: Path) -> None:
    report = tmp_path / "out"
    assert main(["run", "--matrix", str(write_matrix(tmp_path)), "--report-dir", str(report)]) == 0
    rows = records(report)
    assert [r["status"] for r in rows] == ["pass", "pass"]
    assert set(rows[0]) >= {"cell_id", "factors", "status", "oracles", "metrics", "faults"}
    summary = json.loads((report / "summary.json").read_text())
    assert summary["counts"] == {"pass": 2, "fail": 0, "error": 0, "xfail": 0, "xpass": 0, "skip": 0}
    assert "/model:dense/scheduler:fcfs/page_size:16/" in (report / "index.html").read_text()


def test_fault_fails_exactly_its_trigger_cells(tmp_path: Path) -> None:
    """priority_scheduler_drop needs pool pressure: the burst workload provides it."""
    path = write_matrix(tmp_path)
    path.write_text(path.read_text().replace('["system_prompt"]', '["burst"]'))
    report = tmp_path / "out"
    assert main(["run", "--matrix", str(path), "--report-dir", str(report), "--inject-fault", "priority_scheduler_drop"]) == 1
    failing = {r["factors"]["scheduler"]: sorted(n for n, v in r["oracles"].items() if v["verdict"] == "fail") for r in records(report)}
    assert failing == {"fcfs": [], "priority": ["completeness"]}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "--matrix", "no_such_matrix"], "no_such_matrix"),
        (["run", "--matrix", "{tiny}", "--inject-fault", "no_such_fault"], "no_such_fault"),
        (["run", "--matrix", "{tiny}", "--shard", "3/2"], "--shard"),
        (["run", "--matrix", "{bad}"], "cahce"),
    ],
)
def test_bad_input_exits_2_names_it_and_writes_nothing(tmp_path: Path, capsys, args: list[str], needle: str) -> None:
    tiny = write_matrix(tmp_path)
    bad = tmp_path / "bad.toml"
    bad.write_text(tiny.read_text().replace('name = "tiny"', 'name = "bad"').replace("scheduler =", "cahce ="))
    report = tmp_path / "out"
    argv = [a.format(tiny=tiny, bad=bad) for a in args] + ["--report-dir", str(report)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1
    assert not report.exists()


def test_resume_keeps_finished_cells(tmp_path: Path, capsys) -> None:
    path, report = write_matrix(tmp_path), tmp_path / "out"
    assert main(["run", "--matrix", str(path), "--report-dir", str(report), "--shard", "1/2"]) == 0
    first = records(report)
    assert main(["run", "--matrix", str(path), "--report-dir", str(report), "--resume"]) == 0
    assert "kept from the previous run" in capsys.readouterr().out
    rows = records(report)
    assert len(rows) == 2 and rows[0] == first[0]


def test_resume_refuses_a_changed_run_unless_accepted_and_the_report_says_so(tmp_path: Path, capsys) -> None:
    path, report = write_matrix(tmp_path), tmp_path / "out"
    run = ["run", "--matrix", str(path), "--report-dir", str(report)]
    assert main([*run, "--cell", "/model:dense/scheduler:fcfs/page_size:16/"]) == 0
    first = records(report)
    path.write_text(path.read_text() + "# edited after the run\n")
    capsys.readouterr()
    for extra, changed in (([], "changed since: matrix_sha256 "),
                           (["--inject-fault", "priority_scheduler_drop"], "; faults [] → [priority_scheduler_drop];")):
        assert main([*run, "--resume", *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and changed in err and "--accept-changed" in err, err
        assert records(report) == first
    assert main([*run, "--accept-changed"]) == 2 and "only applies with --resume" in capsys.readouterr().err
    assert main([*run, "--resume", "--accept-changed"]) == 0
    assert "kept from the previous run" in capsys.readouterr().out and records(report)[0] == first[0]
    header = json.loads((report / "runs.jsonl").read_text().splitlines()[-1])
    assert list(header["accepted_changes"]) == ["matrix_sha256"] and header["engine"] == "reference"
    assert "accepted_changes" in (report / "index.html").read_text() and header["matrix_sha256"] in \
        (report / "index.html").read_text()
    assert main([*run, "--resume"]) == 0  # the accepted run is the one resumed now


def test_a_run_names_its_cpu_flags_and_a_resume_on_another_cpu_is_refused(
        tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """Engines choose kernels by the CPU's flags (vLLM's AMX attention), so rows judged on one CPU are not kept for
    a run on another without --accept-changed."""
    path, report = write_matrix(tmp_path), tmp_path / "out"
    run = ["run", "--matrix", str(path), "--report-dir", str(report), "--cell", "/model:dense/scheduler:fcfs/page_size:16/"]
    monkeypatch.setattr("harness.run.session.kernel_flags", lambda: ["avx2", "avx512f", "amx_tile"])
    assert main(run) == 0
    header = json.loads((report / "runs.jsonl").read_text().splitlines()[-1])
    assert header["cpu_flags"] == ["avx2", "avx512f", "amx_tile"] and "amx_tile" in (report / "index.html").read_text()
    monkeypatch.setattr("harness.run.session.kernel_flags", lambda: ["avx2", "avx512f"])
    capsys.readouterr()
    assert main([*run, "--resume"]) == 2
    assert "cpu_flags [avx2, avx512f, amx_tile] → [avx2, avx512f]" in capsys.readouterr().err


def test_a_runs_header_records_its_host_and_the_engines_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host record (harness.sut.host.record) with the engine's version and build facts (``Engine.build``) under
    its program's name; an engine with neither adds none."""
    from dataclasses import replace

    import harness.sut.reference
    from harness.sut.host import cpu_model_of, kernel_flags

    report = tmp_path / "out"
    run = ["run", "--matrix", str(write_matrix(tmp_path)), "--report-dir", str(report), "--cell",
           "/model:dense/scheduler:fcfs/page_size:16/"]
    assert main(run) == 0
    machine = json.loads((report / "runs.jsonl").read_text().splitlines()[-1])["machine"]
    assert machine["cpu_model"] == cpu_model_of(Path("/proc/cpuinfo").read_text()) and machine["engine"] == {}
    assert machine["cpu_flags"] == kernel_flags() and machine["cores"] >= 1
    engine = harness.sut.reference.ENGINE
    monkeypatch.setattr(harness.sut.reference, "ENGINE", replace(engine, version=lambda args: "7",
                                                                 build=lambda args: {"AMX_INT8": "1"}))
    assert main(run) == 0
    header = json.loads((report / "runs.jsonl").read_text().splitlines()[-1])
    assert header["machine"]["engine"] == {"reference": {"version": "7", "AMX_INT8": "1"}}
    assert "AMX_INT8 1" in (report / "index.html").read_text()


def test_a_crashing_cell_is_an_error_and_the_run_goes_on(tmp_path: Path) -> None:
    path = write_matrix(tmp_path, schedulers='["fcfs", "tests.components:ExplodingQueue"]')
    report = tmp_path / "out"
    assert main(["run", "--matrix", str(path), "--report-dir", str(report)]) == 1
    by_sched = {r["factors"]["scheduler"]: r for r in records(report)}
    assert by_sched["fcfs"]["status"] == "pass"
    broken = by_sched["tests.components:ExplodingQueue"]
    assert broken["status"] == "error" and "queue exploded" in broken["error"]


def test_a_slow_cell_times_out_as_an_error(tmp_path: Path) -> None:
    path = write_matrix(tmp_path, schedulers='["tests.components:SlowQueue"]', timeout=0.5)
    report = tmp_path / "out"
    assert main(["run", "--matrix", str(path), "--report-dir", str(report)]) == 1
    (row,) = records(report)
    assert row["status"] == "error" and "timeout of 0.5 s" in row["error"]


def test_list_prints_cells_bound_and_coverage(tmp_path: Path, capsys) -> None:
    assert main(["list", "--matrix", str(write_matrix(tmp_path)), "--strength", "2"]) == 0
    out = capsys.readouterr().out
    assert "/model:dense/scheduler:fcfs/page_size:16/" in out and "coverage t=2" in out and "OK" in out
    assert "lower bound: 2 cells" in out and "optimal (proven)" in out


def test_list_bound_comes_from_the_allowed_tuples(tmp_path: Path, capsys) -> None:
    """A constraint removes tuples: the bound is 3 allowed pairs, not the product 4, and 3 cells are optimal."""
    path = write_matrix(tmp_path)
    path.write_text(path.read_text().replace('page_size = [16]', 'page_size = [1, 16]\n\n[[constraints]]\n'
                                             'forbid = { scheduler = "priority", page_size = 1 }\nreason = "r"'))
    assert main(["list", "--matrix", str(path), "--strength", "2"]) == 0
    out = capsys.readouterr().out
    assert "3 cells (t-wise, t=2)" in out
    assert "lower bound: 3 cells (most allowed tuples on one set of factors: 3); optimal (proven)" in out


def test_list_certifies_a_one_factor_at_a_time_matrix_as_such(tmp_path: Path, capsys) -> None:
    """ofat promises the golden cell and each other level alone, not every pair: vllm_server_smoke's 4 cells hold it."""
    assert main(["list", "--matrix", "vllm_server_smoke"]) == 0
    out = capsys.readouterr().out
    assert "4 cells (ofat)" in out and "coverage ofat: 4/4" in out and "OK" in out and "t=2" not in out, out
    path = write_matrix(tmp_path)
    path.write_text(path.read_text().replace('mode = "full"', 'mode = "ofat"').replace("[16]", "[1, 16]") +
                    '[golden]\nscheduler = "fcfs"\npage_size = 16\n')
    assert main(["list", "--matrix", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:3] == ["/model:dense/scheduler:fcfs/page_size:16/", "/model:dense/scheduler:priority/page_size:16/",
                                    "/model:dense/scheduler:fcfs/page_size:1/"], out
    assert "coverage ofat: 3/3 (the golden cell, and each other level with every other factor golden) covered: OK" in out


#: the input holes of issue 10: (what to change in TINY, what the one error line must name).
HOLES = [
    ({'page_size = [16]': 'page_size = [16]\n[cost]\nscheduler = { priority = 1e308 }'}, "[cost] scheduler.priority"),
    ({'["fcfs", "priority"]': '["fcfs", "no.such.module:Queue"]'}, "no.such.module"),
    ({'page_size = [16]': 'page_size = [16]\n[golden]\npool = "static"'}, "[golden] pool"),
    ({'mode = "full"': 'mode = "t-wise"\nstrength = "2"'}, "[matrix] strength: must be an integer"),
    ({'mode = "full"': 'mode = "t-wise"\nstrength = 2.0'}, "[matrix] strength: must be an integer"),
    ({'mode = "full"': 'mode = "t-wise"\nstrength = true'}, "[matrix] strength: must be an integer"),
    ({'page_size = [16]': 'page_size = [16]\n[[constraints]]\nforbid = { scheduler = "priority" }\nreason = "r"'},
     "[factors] scheduler: level 'priority' is in no allowed row"),
]


@pytest.mark.parametrize(("changes", "needle"), HOLES, ids=[h[1].split(":")[0] + str(i) for i, h in enumerate(HOLES)])
@pytest.mark.parametrize("command", ["list", "run"])
def test_an_input_hole_is_one_line_exit_2_and_nothing_written(
    tmp_path: Path, capsys, changes: dict[str, str], needle: str, command: str
) -> None:
    path = write_matrix(tmp_path)
    text = path.read_text()
    for old, new in changes.items():
        assert old in text
        text = text.replace(old, new)
    path.write_text(text)
    report = tmp_path / "out"
    argv = [command, "--matrix", str(path)] + (["--report-dir", str(report)] if command == "run" else [])
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert len(captured.err.strip().splitlines()) == 1 and needle in captured.err and "tiny.toml" in captured.err
    assert not report.exists()


def test_kill_reports_an_exact_fault(tmp_path: Path, capsys) -> None:
    path = write_matrix(tmp_path)
    path.write_text(path.read_text().replace('["system_prompt"]', '["burst"]'))
    assert main(["kill", "--matrix", str(path), "--fault", "priority_scheduler_drop"]) == 0
    out = capsys.readouterr().out
    assert "priority_scheduler_drop: exact; 1 trigger cells of 2, 1 failed, 1 seen by completeness" in out


def test_kill_says_when_no_cell_triggers_the_fault(tmp_path: Path, capsys) -> None:
    """The torch backend never runs the unified extend kernel: this matrix cannot exercise the fault."""
    path = write_matrix(tmp_path, schedulers='["fcfs"]')
    path.write_text(path.read_text().replace("page_size = [16]", 'page_size = [16]\npool = ["unified"]\nbackend = ["torch"]'))
    assert main(["kill", "--matrix", str(path), "--fault", "unified_extend_virtual_loc"]) == 0
    assert "not exercised" in capsys.readouterr().out


def test_kill_exits_1_and_names_the_missed_cell(tmp_path: Path, capsys, monkeypatch) -> None:
    import harness.cli.main as cli
    from harness.run.faultcheck import FaultCheck

    missed = FaultCheck("priority_scheduler_drop", 2, frozenset({"a"}), frozenset(), frozenset(), 0.1)
    monkeypatch.setattr(cli, "check_fault", lambda matrix, name, goldens: missed)
    assert main(["kill", "--matrix", str(write_matrix(tmp_path)), "--fault", "priority_scheduler_drop"]) == 1
    assert "missed: a" in capsys.readouterr().out
