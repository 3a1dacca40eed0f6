"""`harness run -j N`: cells side by side in worker processes give what a serial run gives, and lose nothing."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.run import parallel
from harness.cli.main import main
from harness.matrix.model import generate
from harness.matrix.file import load_matrix
from harness.run.plan import plan_cell
from tests.components import GATE_ENV

ROOT = Path(__file__).resolve().parents[3]
SIX = """
[matrix]
name = "six"
mode = "full"
workloads = ["pair", "system_prompt"]
timeout_s = {timeout}

[factors]
model = ["dense", "hybrid"]
scheduler = {schedulers}
spec = ["none", "draft"]
page_size = [16]

[[workloads]]
when = {{ model = "hybrid", spec = "none" }}
run = ["pair"]
reason = "a cell with workloads of its own"
"""
BURST = """
[[workloads]]
when = { scheduler = "priority", model = "dense" }
run = ["burst"]
reason = "the pressure under which the priority scheduler drops requests"
"""
TIMINGS = ("wall_seconds", "engine_seconds", "golden_seconds", "harness_seconds", "tokens_per_s")


def write(tmp_path: Path, schedulers: str = '["fcfs", "priority"]', timeout: float = 120, more: str = "") -> Path:
    path = tmp_path / "six.toml"
    path.write_text(SIX.format(schedulers=schedulers, timeout=timeout) + more)
    return path


def rows(report: Path) -> list[dict]:
    """results.jsonl without what differs between any two runs: run ids and timings."""
    out = []
    for line in (report / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        row.pop("run_id")
        row["metrics"] = {k: v for k, v in row["metrics"].items() if k not in TIMINGS}
        out.append(row)
    return out


def summary(report: Path) -> dict:
    data = json.loads((report / "summary.json").read_text())
    return {k: v for k, v in data.items() if k not in ("wall_seconds", "runs")}


def test_side_by_side_writes_what_a_serial_run_writes(tmp_path: Path, capsys) -> None:
    """Same rows in the same order, same summary, same golden runs computed once each (index.html is rendered
    from rows and summary alone). With a fault injected, so failing rows are compared too."""
    path = write(tmp_path, more=BURST)
    fault = ["--inject-fault", "priority_scheduler_drop"]
    outs = {}
    for jobs in ("1", "2"):
        assert main(["run", "--matrix", str(path), "--report-dir", str(tmp_path / jobs), "-j", jobs, *fault]) == 1
        outs[jobs] = [line for line in capsys.readouterr().out.splitlines() if "golden runs" in line]
    assert rows(tmp_path / "1") == rows(tmp_path / "2")
    assert summary(tmp_path / "1") == summary(tmp_path / "2")
    assert summary(tmp_path / "2")["counts"] == {"pass": 6, "fail": 2, "error": 0, "xfail": 0, "xpass": 0, "skip": 0}
    matrix = load_matrix(str(path))
    keys = [k for cell in generate(matrix) for k in plan_cell(matrix, cell, frozenset()).golden_keys()]
    golden = [line.split("; ", 1)[1] for line in (outs["1"][0], outs["2"][0])]
    assert golden[0] == golden[1] == f"golden runs {len(set(keys))} computed, {len(keys) - len(set(keys))} reused"
    assert {r["cell_id"]: r["metrics"]["workloads"] for r in rows(tmp_path / "2")}[
        "/model:hybrid/scheduler:fcfs/spec:none/page_size:16/"] == ["pair"]


def test_a_dead_worker_and_a_deaf_cell_become_error_rows_and_the_run_goes_on(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(parallel, "KILL_GRACE_S", 1.0)
    path = tmp_path / "three.toml"
    path.write_text('[matrix]\nname = "three"\nmode = "full"\nworkloads = ["pair"]\ntimeout_s = 10\n\n[factors]\n'
                    'scheduler = ["fcfs", "tests.components:DyingQueue", "tests.components:DeafQueue", "priority"]\n'
                    'page_size = [16]\n')
    report = tmp_path / "out"
    assert main(["run", "--matrix", str(path), "--report-dir", str(report), "-j", "2"]) == 1
    got = rows(report)
    assert [r["factors"]["scheduler"].rpartition(":")[2] for r in got] == ["fcfs", "DyingQueue", "DeafQueue", "priority"]
    assert [r["status"] for r in got] == ["pass", "error", "error", "pass"]
    assert "worker process died (exit code -9) while running this cell" in got[1]["error"]
    assert "killed: still running 1 s past its timeout of 10 s" in got[2]["error"]


def test_ctrl_c_keeps_finished_cells_and_resume_runs_the_rest(tmp_path: Path) -> None:
    """Ctrl-C while gated cells hold both workers: the finished rows stay, exit 130, --resume runs the rest."""
    path, report = write(tmp_path, schedulers='["fcfs", "tests.components:GatedQueue"]'), tmp_path / "out"
    gate = tmp_path / "gate"
    gate.touch()
    command = [sys.executable, "-m", "harness", "run", "--matrix", str(path), "--report-dir", str(report), "-j", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), GATE_ENV: str(gate)}
    # started with SIGINT ignored, as a script's background job or a pytest-xdist worker's child is: it must still stop
    child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    results = report / "results.jsonl"
    deadline = time.monotonic() + 120
    while not (results.exists() and results.read_text().count("\n") >= 2) and time.monotonic() < deadline:
        time.sleep(0.2)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=180)  # shutting down two gated workers on a loaded 2-core box
    assert child.returncode == 130 and "--resume goes on from there" in err, err
    kept = rows(report)
    assert [r["factors"]["scheduler"] for r in kept] == ["fcfs", "fcfs"]
    gate.unlink()
    done = subprocess.run([*command, "--resume"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("kept from the previous run") == len(kept)
    assert len(rows(report)) == 8 and all(r in rows(report) for r in kept)
