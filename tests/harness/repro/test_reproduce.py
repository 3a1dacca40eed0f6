"""`harness repro` on real reference-engine fault cells: the workload shrinks, the script it writes runs without
kvmatrix, exits 1 with the fault planted and 0 against a stand-in engine that no longer carries it."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.repro.report import REPORT, render
from reference_impl.faults import PRIORITY_SCHEDULER_DROP, SPEC_FINISH_PAGE_LEAK, Fault

ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Case:
    """A 1-cell run: the fault, its matrix's factors and workload, the cell, the toggle and what the script prints."""

    fault: Fault
    factors: str
    workload: str
    cell: str
    toggle: dict
    shows: str


LEAK = Case(SPEC_FINISH_PAGE_LEAK, 'spec = ["none", "ngram"]', "pair", "/spec:ngram/",
            {"factor": "spec", "level": "ngram", "golden": "none"}, "pages leaked")
DROP = Case(PRIORITY_SCHEDULER_DROP, 'scheduler = ["fcfs", "priority"]', "burst", "/scheduler:priority/",
            {"factor": "scheduler", "level": "priority", "golden": "fcfs"}, "never finished (lost)")


@pytest.fixture(scope="module", params=[LEAK, pytest.param(DROP, marks=pytest.mark.slow)], ids=lambda c: c.fault.name)
def finding(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Case, Path]:
    """The cell run with its fault planted, then `harness repro` on it within 10 runs."""
    case: Case = request.param
    root = tmp_path_factory.mktemp("repro")
    matrix = root / "one.toml"
    matrix.write_text(f'[matrix]\nname = "one"\nmode = "full"\nworkloads = ["{case.workload}"]\ntimeout_s = 300\n\n'
                      f"[factors]\n{case.factors}\n")
    report, out = root / "run", root / "finding"
    assert main(["run", "--matrix", str(matrix), "--cell", case.cell, "--inject-fault", case.fault.name,
                 "--report-dir", str(report), "-j", "1"]) == 1
    assert main(["repro", str(report), "--budget", "10", "--out", str(out)]) == 0
    return case, out


def isolated(script: Path, engine: Path, cwd: Path) -> subprocess.CompletedProcess:
    """Run ``script`` with no site (no kvmatrix install), ``engine`` (holding reference_impl) and the site-packages
    (torch) alone on the path, from ``cwd``."""
    path = f"{engine}:{sysconfig.get_paths()['purelib']}"
    return subprocess.run([sys.executable, "-S", str(script)], cwd=cwd, env={"PYTHONPATH": path}, capture_output=True,
                          text=True, timeout=600)


def test_repro_writes_a_finding_folder_with_a_smaller_workload(finding: tuple[Case, Path]) -> None:
    case, folder = finding
    record = json.loads((folder / "finding.json").read_text())
    assert record["check"] == case.fault.oracle and record["toggle"] == case.toggle
    before, after = record["shrink"]["before"], record["shrink"]["after"]
    assert after != before and all(after[k] <= before[k] for k in before)
    assert record["shrink"]["runs"] <= 10 and record["measured"]["exit"] == 1 and record["measured"]["seconds"] > 0
    assert record["command"].endswith(f"--oracle {case.fault.oracle}")  # the command says which oracle it kept
    report = (folder / "REPORT.md").read_text()
    for section in ("## What", "## How to reproduce", "## Expected", "## Actual", "## Environment", "## Cause",
                    "## Upstream status"):
        assert section in report
    assert case.fault.incident in report
    assert render(folder)[REPORT] == report  # the folder renders again from its data alone


def test_the_script_runs_without_kvmatrix_and_exits_one_with_the_fault(finding: tuple[Case, Path],
                                                                       tmp_path: Path) -> None:
    case, folder = finding
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "reference_impl").symlink_to(ROOT / "reference_impl")
    done = isolated(folder / "repro.py", engine, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert case.shows in done.stdout and "BUG PRESENT" in done.stdout
    script = (folder / "repro.py").read_text()
    assert "import harness" not in script and "from harness" not in script and "from fixtures" not in script
    assert f"TOGGLED = replace(FAILING, {case.toggle['factor']}=" in script


def test_a_fixed_findings_script_exits_zero(finding: tuple[Case, Path], tmp_path: Path) -> None:
    """The stand-in engine: reference_impl without the fault (its registry entry gone, so nothing plants it)."""
    case, folder = finding
    engine = tmp_path / "engine"
    shutil.copytree(ROOT / "reference_impl", engine / "reference_impl", ignore=shutil.ignore_patterns("__pycache__"))
    faults = engine / "reference_impl" / "faults.py"
    faults.write_text(faults.read_text() + f"\ndel FAULTS[{case.fault.name!r}]  # the stand-in: fixed\n")
    done = isolated(folder / "repro.py", engine, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FIXED" in done.stdout
