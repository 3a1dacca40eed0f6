"""What a reproducer is of: the cell (a failing, error or xfail row of a run), the check it keeps failing, and the one
setting it toggles (the located culprit's factor, at its golden level).

The culprit comes from the run's own analysis (``harness.results.locate.analyze``, with ``harness locate``'s extra
cells where they ran): the factors of the combination located for this cell's failure class come first; then every
other factor the cell holds off its golden level, in the matrix's order. Each is tried by a run, and the first whose
golden level makes the check pass is the toggle, so the script's two runs differ in that one setting alone.
"""
from __future__ import annotations

import re
import shlex
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness import sut
from harness.matrix.model import Matrix
from harness.repro.shrink import Shrunk
from harness.results.locate import Combination, analyze
from harness.results.rows import error_type
from harness.run.plan import CellPlan
from harness.run.trial import Check, Outcome
from harness.sut.levels import LevelError
from harness.sut.script.writer import NoScript, ScriptWriter
from reference_impl.faults import FAULTS

#: the statuses a reproducer is written for.
REPRODUCIBLE = ("fail", "error", "xfail")


class ReproError(ValueError):
    """A report directory, cell or option that ``harness repro`` cannot use, or a failure that does not reproduce;
    the message names it."""


def writer_of(program: str) -> ScriptWriter:
    """The script writer of ``program`` (``Engine.program_name``: a server's is its wire format), as its engine
    declares it; ``ReproError`` naming the programs that have one."""
    try:
        return sut.script_writer(program)
    except NoScript as exc:
        raise ReproError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class Toggle:
    """The one setting a reproducer flips: ``factor`` from the cell's ``level`` to its ``golden`` level, or to the
    level ``harness repro --toggle`` asked for (``asked``: one that keeps the mechanism the finding's rule is read
    from, where the golden level turns it off and the contrast says nothing)."""

    factor: str
    level: object
    golden: object
    asked: bool = False

    def text(self) -> str:
        return f"{self.factor} {self.level} → {self.golden}"

    def to_json(self) -> dict:
        """As a finding's data keeps it (``asked`` only where it was)."""
        return {"factor": self.factor, "level": self.level, "golden": self.golden, **({"asked": True} if self.asked
                                                                                     else {})}


def asked_toggle(matrix: Matrix, levels: Mapping[str, object], asked: str) -> Toggle:
    """The toggle ``FACTOR=LEVEL`` asks for, from the cell's ``levels``: any level the engine takes for the factor (a
    probe matrix lists few), typed as a matrix file types it; ``ReproError`` naming the factors, or why the engine
    refuses the level, or that it is the cell's own."""
    factor, _, wanted = asked.partition("=")
    if factor not in levels:
        raise ReproError(f"--toggle {asked}: no factor {factor!r} (factors: {', '.join(levels)})")
    try:
        level = tomllib.loads(f"level = {wanted}")["level"]
    except tomllib.TOMLDecodeError:
        level = wanted  # a bare word: a string level
    try:
        sut.engine(matrix.engine).levels.check(factor, level)
    except LevelError as exc:
        raise ReproError(f"--toggle {asked}: {exc}") from None
    if level == levels[factor]:
        raise ReproError(f"--toggle {asked}: the cell's own level; toggle {factor} to another")
    return Toggle(factor, levels[factor], level, asked=True)


def pick_row(rows: Sequence[Mapping], cell_id: str | None) -> Mapping:
    """The row of ``cell_id``, else the run's first failing, error or xfail row."""
    if cell_id is not None:
        row = next((r for r in rows if r["cell_id"] == cell_id), None)
        if row is None:
            raise ReproError(f"--cell {cell_id}: no such cell in the run")
        if row["status"] not in REPRODUCIBLE:
            raise ReproError(f"--cell {cell_id}: its status is {row['status']}; a reproducer is written for "
                             f"{', '.join(REPRODUCIBLE)} cells")
        return row
    row = next((r for r in rows if r["status"] in REPRODUCIBLE), None)
    if row is None:
        raise ReproError(f"no {', '.join(REPRODUCIBLE)} cell in the run: nothing to reproduce")
    return row


def _declared(row: Mapping) -> tuple[list[str], str | None]:
    """An xfail row's declared failures and the ``check`` their signature names (None when none names one)."""
    expected = row.get("expected") or {}
    checks = [value for decl in expected.get("declarations", [])
              for value in decl.get("signature", {}).get("check", [])]
    return list(expected.get("fails", [])), (checks[0] if len(set(checks)) == 1 else None)


def pick_check(row: Mapping, oracle: str | None = None, check: str | None = None) -> Check:
    """The check a reproducer of ``row`` keeps failing: ``oracle`` where given; an error row's exception type; the
    oracle of the fault the run planted where it failed; else the row's first failing oracle (an xfail row's first
    declared failure). Its ``check`` is ``check`` where given (one of the oracle's findings must name it), else that
    of the oracle's first finding that names one."""
    oracles = row["oracles"]
    failing = [name for name, v in oracles.items() if v["verdict"] == "fail" or v.get("excused")]
    declared, declared_check = _declared(row) if row["status"] == "xfail" else ([], None)
    if oracle is None:
        if row["status"] == "error" or (not failing and any(d.startswith("error: ") for d in declared)):
            name = error_type(row.get("error")) or next(d for d in declared if d.startswith("error: "))[7:]
            return Check("error", name)
        planted = [FAULTS[f].oracle for f in row.get("faults", []) if f in FAULTS]
        oracle = next((o for o in planted if o in failing), None) or (failing or [d for d in declared
                                                                                    if d in oracles] or [None])[0]
    if oracle is None or oracle not in oracles:
        raise ReproError(f"cell {row['cell_id']}: no failing oracle {oracle or ''} to reproduce (failing: "
                         f"{', '.join(failing) or 'none'})")
    checks = [f["check"] for f in oracles[oracle].get("detail", []) if isinstance(f, dict) and "check" in f]
    if check is not None:
        if check not in checks:
            raise ReproError(f"cell {row['cell_id']}: no finding of {oracle} names the check {check!r} (they name: "
                             f"{', '.join(dict.fromkeys(checks)) or 'none'})")
        return Check(oracle, check)
    return Check(oracle, checks[0] if checks else declared_check)


def located(rows: Sequence[Mapping], probes: Sequence[Mapping], row: Mapping, check: Check) -> Combination | None:
    """The combination the run's analysis located for ``row``'s failure class, None where it located none."""
    for cls in analyze(rows, probes):
        if cls.name == check.failure_name():
            return next((f.combination for f in cls.findings if row["cell_id"] in f.cells), None)
    return None


def toggle_candidates(matrix: Matrix, levels: Mapping[str, object], combination: Combination | None) -> list[Toggle]:
    """The settings to try toggling, in order: the located combination's factors, then every other factor off its
    golden level (matrix order). A factor without a golden level says what is compared (the model), never toggled."""
    golden = matrix.golden
    first = [factor for factor, _ in combination.levels] if combination is not None else []
    order = [*first, *(factor for factor, _ in matrix.factors if factor not in first)]
    return [Toggle(factor, levels[factor], golden[factor]) for factor in order
            if factor in levels and factor in golden and levels[factor] != golden[factor]]


@dataclass(frozen=True, slots=True)
class Reproducer:
    """A finding ready to be written: the cell's row and run header, its plan (judged without declared failures), the
    check and the toggle, the shrunk workload and the two outcomes on it (the failing setting, then toggled)."""

    row: Mapping
    header: Mapping
    plan: CellPlan
    toggle: Toggle
    toggled_levels: dict[str, object]
    check: Check
    shrunk: Shrunk
    failing: Outcome
    toggled: Outcome
    device: str
    report_dir: Path

    @property
    def needs_cpu(self) -> list[str]:
        """The CPU flags the declarations an xfail row met need (``cpu``): the finding shows only on such a CPU."""
        declarations = (self.row.get("expected") or {}).get("declarations", [])
        return sorted({flag for decl in declarations for flag in decl.get("cpu") or []})

    @property
    def program(self) -> str:
        """What the cell runs (``Engine.program_name``): its script's writer and its folder's name go by it."""
        return sut.engine(self.plan.engine).program_name(self.plan.engine_args)

    @property
    def slug(self) -> str:
        """The finding's folder name: ``reference-completeness-scheduler-priority`` (a server's: by its ``api``)."""
        what = self.check.check if self.check.oracle == "error" else self.check.text()
        parts = [self.program, what, self.toggle.factor, str(self.toggle.level)]
        return re.sub(r"[^A-Za-z0-9]+", "-", "-".join(parts)).strip("-").lower()

    def command(self) -> str:
        """The ``harness repro`` command that wrote it (``--oracle`` where the check is an oracle's: it may not be the
        one picked unasked; ``--check`` where it names one, ``--toggle`` where the toggle was asked for)."""
        oracle = ["--oracle", self.check.oracle] if self.check.oracle != "error" else []
        check = ["--check", self.check.check] if oracle and self.check.check is not None else []
        toggle = ["--toggle", f"{self.toggle.factor}={self.toggle.golden}"] if self.toggle.asked else []
        return shlex.join(["python", "-m", "harness", "repro", str(self.report_dir), "--cell", self.row["cell_id"],
                           *oracle, *check, *toggle])
