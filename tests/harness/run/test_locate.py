"""`harness locate` names each registered fault's trigger from a 3-wise run with it injected."""
from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.sut.reference import LEVELS
from harness.run.locate import locate, one_factor_changes
from harness.matrix.model import Cell, generate
from harness.matrix.file import load_matrix
from reference_impl.faults import FAULTS, Fault
from reference_impl.registry import COMPONENTS, SWITCH_FACTORS
from tests.reference_impl.test_faults import MATRIX_OF

#: every factor a registered fault's trigger names, 3-wise (page_size fixed: unified_no_zero_on_issue's
#: fourth trigger factor, as in the kill matrix).
ALL_TRIGGERS = """
[matrix]
name = "all_triggers"
mode = "t-wise"
strength = 3
workloads = ["pair"]

[factors]
model = ["dense", "hybrid"]
scheduler = ["fcfs", "priority"]
cache = ["off", "device", "host"]
pool = ["static", "unified"]
backend = ["torch", "triton"]
deterministic = ["off", "on"]
poison = ["off", "on"]
spec = ["none", "ngram", "draft", "mtp"]
page_size = [16]
"""


def trigger_in(fault: Fault, levels: Mapping[str, tuple]) -> dict[str, tuple]:
    """The fault's trigger as the matrix can show it: factors the matrix varies, levels the matrix has."""
    return {f: tuple(lv for lv in levels[f] if lv in admitted) for f, admitted in fault.triggers.items()
            if len(levels.get(f, ())) > 1}


def simulated(fault: Fault, cell: Cell) -> dict:
    """The row a run with ``fault`` injected writes, as the fault's registry entry says it must."""
    hit = fault.triggered_by(LEVELS.full(cell.as_dict()))
    if fault.oracle == "error":
        return {"cell_id": cell.cell_id, "factors": cell.as_dict(), "status": "error" if hit else "pass", "oracles": {},
                "error": "Traceback (most recent call last):\nIndexError: list index out of range" if hit else None}
    return {"cell_id": cell.cell_id, "factors": cell.as_dict(), "status": "fail" if hit else "pass",
            "oracles": {"tokens": {"verdict": "pass"}, fault.oracle: {"verdict": "fail" if hit else "pass"}}}


@pytest.fixture(scope="module")
def all_triggers(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("locate") / "all_triggers.toml"
    path.write_text(ALL_TRIGGERS)
    matrix = load_matrix(str(path))
    return matrix, generate(matrix)


#: value factors whose other level cannot be an integer (a probability below 1)
OTHER_LEVEL = {"pd_fail_rate": 0.0}


def other_level(factor: str, taken: tuple) -> object:
    """A level of ``factor`` outside ``taken``, from the registry (value factors: 1, else 128)."""
    if factor in OTHER_LEVEL:
        return OTHER_LEVEL[factor]
    known = [*COMPONENTS.get(factor, {}), *SWITCH_FACTORS.get(factor, {})]
    return next(level for level in [*known, 1, 128] if level not in taken and (known or isinstance(level, int)))


def fault_matrix(fault: Fault, directory: Path) -> Path:
    """A 3-wise matrix around ``fault``: up to three trigger factors varied (trigger levels and one other),
    any further trigger factor held at a trigger level (as the kill matrix holds page_size), two bystanders."""
    varied, held = list(fault.triggers.items())[:3], list(fault.triggers.items())[3:]
    lines = [f'{f} = {json.dumps([*levels[:2], other_level(f, levels)])}' for f, levels in varied]
    lines += [f"{f} = {json.dumps([levels[0]])}" for f, levels in held]
    lines += [f'{f} = {json.dumps(levels)}' for f, levels in BYSTANDERS.items() if f not in fault.triggers][:2]
    path = directory / f"{fault.name}.toml"
    path.write_text(f'[matrix]\nname = "{fault.name}"\nmode = "t-wise"\nstrength = 3\nworkloads = ["pair"]\n\n'
                    "[factors]\n" + "\n".join(lines) + "\n")
    return path


BYSTANDERS = {"scheduler": ["fcfs", "priority"], "poison": ["off", "on"], "backend": ["torch", "triton"]}


@pytest.mark.parametrize("matrix", ["around_trigger", "own_matrix"])
@pytest.mark.parametrize("name", sorted(FAULTS))
def test_locate_names_the_trigger_of_every_registered_fault(name: str, matrix: str, tmp_path: Path) -> None:
    """Each fault as its registry entry says it shows, on a 3-wise array around its trigger and on its own
    matrix's 3-wise array.

    On its own matrix this stands for the real end-to-end run: tests/reference_impl/test_faults.py proves, on the engine,
    that the fault fails exactly the trigger cells of the full product of that matrix through its oracle
    (no other cell fails), and the 3-wise array and every cell ``locate`` adds (one factor changed to
    another level of the matrix) are cells of that product, so the real rows' verdicts for the oracle are
    these simulated ones. ``test_locate_command_runs_extra_cells_and_prints_the_combination`` runs the
    command itself on the engine.
    """
    fault = FAULTS[name]
    made = fault_matrix(fault, tmp_path) if matrix == "around_trigger" else three_wise(MATRIX_OF[name], fault, tmp_path)
    matrix = load_matrix(str(made))
    rows = [simulated(fault, cell) for cell in generate(matrix)]
    assert any(r["status"] != "pass" for r in rows), "the 3-wise array has no trigger cell"
    result = locate(matrix, rows, lambda cell: simulated(fault, cell))
    (cls,) = result.classes
    assert cls.pinned, [f.combination.text() for f in cls.findings]
    (finding,) = cls.findings
    assert finding.combination.as_dict() == trigger_in(fault, dict(matrix.factors)), finding.combination.text()
    k = sum(len(levels) > 1 for _, levels in matrix.factors)
    probed = {p["probe"]["of"] for p in result.probes}
    assert len(result.probes) <= k * len(probed)


def test_one_factor_changes_go_to_golden_and_respect_constraints(all_triggers) -> None:
    matrix, cells = all_triggers
    cell = next(c for c in cells if c.level("cache") == "host" and c.level("spec") == "draft")
    changes = dict(one_factor_changes(matrix, cell))
    assert changes["cache"].level("cache") == "off" and changes["spec"].level("spec") == "none"
    assert "page_size" not in changes and len(changes) == 8


def test_locate_command_runs_extra_cells_and_prints_the_combination(tmp_path: Path, capsys) -> None:
    """A real 3-wise run with priority_scheduler_drop injected, then `harness locate` on its report."""
    path = tmp_path / "sched.toml"
    path.write_text('[matrix]\nname = "sched"\nmode = "t-wise"\nstrength = 3\nworkloads = ["burst"]\n\n'
                    '[factors]\nscheduler = ["fcfs", "priority"]\ncache = ["off", "device"]\n'
                    'prefill_budget = [64, 128]\npoison = ["off", "on"]\npage_size = [16]\n')
    report = tmp_path / "out"
    assert main(["run", "--matrix", str(path), "--report-dir", str(report), "--inject-fault", "priority_scheduler_drop"]) == 1
    capsys.readouterr()
    assert main(["locate", str(report)]) == 0
    out = capsys.readouterr().out
    assert "completeness: " in out and "pinned down" in out and "not pinned" not in out
    assert "located: scheduler=priority" in out and "extra cells run:" in out
    probes = [json.loads(line) for line in (report / "locate.jsonl").read_text().splitlines()]
    assert probes and {p["probe"]["changed"] for p in probes} <= {"scheduler", "cache", "prefill_budget", "poison"}
    assert f"extra cells run: {sum(not p['probe']['reused'] for p in probes)} " in out
    assert "scheduler=priority" in (report / "index.html").read_text()


def three_wise(text: str, fault: Fault, directory: Path) -> Path:
    """A fault's own matrix (tests/reference_impl/test_faults.py) as a 3-wise array; a fourth varied trigger factor is
    held at a trigger level, so that the array is sure to hold a trigger cell."""
    doc = tomllib.loads(text)
    varied = [f for f in fault.triggers if len(doc["factors"].get(f, [])) > 1]
    for factor in varied[3:]:
        doc["factors"][factor] = [next(lv for lv in doc["factors"][factor] if lv in fault.triggers[factor])]
    lines = ['[matrix]', 'name = "fault"', 'mode = "t-wise"', 'strength = 3', f'workloads = {json.dumps(doc["matrix"]["workloads"])}',
             "", "[factors]", *(f"{f} = {json.dumps(levels)}" for f, levels in doc["factors"].items())]
    path = directory / "fault.toml"
    path.write_text("\n".join(lines) + "\n")
    return path
