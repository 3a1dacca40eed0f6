"""The plan stage: what running one cell needs (its levels, its references' configurations, its workloads,
timeout, declared failures and tolerances), in plain picklable values a worker process can take."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from harness import sut
from harness.matrix.model import BoundarySettings, Cell, Matrix
from harness.oracles.view import KnownFailure
from harness.results.rows import CellResult
from harness.run.golden import GoldenKey, golden_key


@dataclass(frozen=True, slots=True)
class GoldenConfig:
    """A configuration a cell's references are run on: the engine, its arguments and the levels."""

    engine: str
    levels: dict[str, object]
    engine_args: dict[str, object] = field(default_factory=dict)

    def key(self, workload: str) -> GoldenKey:
        return golden_key(self.levels, workload, self.engine, self.engine_args)

    def full(self) -> dict[str, object]:
        return sut.engine(self.engine).levels.full(self.levels)


@dataclass(frozen=True, slots=True)
class CellPlan:
    """What running one cell needs, in plain picklable values (a Matrix's mapping proxies do not pickle)."""

    cell_id: str
    matrix: str
    levels: dict[str, object]
    workloads: tuple[str, ...]
    timeout_s: float
    faults: frozenset[str]
    engine: str = "reference"
    engine_args: dict[str, object] = field(default_factory=dict)
    #: the references' configurations by ``harness.oracles.view.REFERENCES`` name: "golden", and where they apply
    #: "spec_golden" (the golden levels with the cell's proposer) and "cross_engine" (another engine, same weights)
    goldens: dict[str, GoldenConfig] = field(default_factory=dict)
    expected: dict | None = None    # the ``[[expected]]`` entries the cell matches, merged (Matrix.expected_for)
    tolerances: dict[str, float] = field(default_factory=dict)  # ``[[tolerances]]`` it matches: logprobs, tie
    known: tuple[KnownFailure, ...] = ()  # those entries as the oracles apply them (the findings each excuses)
    boundary: BoundarySettings | None = None  # ``[boundary]`` where this cell draws the boundary family, else None
    examples_db: str | None = None  # the directory of Hypothesis's example database the family's draws are kept in

    def golden_keys(self) -> list[GoldenKey]:
        """The golden runs this cell reads, in the order the golden stage reads them."""
        return [config.key(name) for name in self.workloads for config in self.goldens.values()]

    def served_as(self) -> str | None:
        """The reference whose configuration this cell is (its runs are that golden run's), or None."""
        if self.faults:
            return None
        full = GoldenConfig(self.engine, self.levels, self.engine_args).full()
        return next((name for name in ("golden", "spec_golden") if name in self.goldens
                     and self.goldens[name].engine_args == self.engine_args and self.goldens[name].full() == full), None)

    def result(self) -> CellResult:
        """The cell's row before it runs: a pass until something says otherwise."""
        return CellResult(cell_id=self.cell_id, matrix=self.matrix, factors=self.levels, status="pass",
                          faults=sorted(self.faults), expected=self.expected)


def spec_golden_levels(levels: Mapping[str, object], golden_levels: Mapping[str, object],
                       engine: str = "reference") -> dict[str, object] | None:
    """The accept_length oracle's reference: golden levels with the cell's spec algorithm; None without spec."""
    full = sut.engine(engine).levels.full(levels)
    if full.get("spec", "none") == "none":
        return None
    return {**golden_levels, "spec": full["spec"], "num_draft_tokens": full["num_draft_tokens"]}


def _tolerances(matrix: Matrix, cell: Cell) -> dict[str, float]:
    """The loosest declared ``[[tolerances]]`` of each kind the cell matches."""
    tolerances: dict[str, float] = {}
    for entry in matrix.tolerances_for(cell):
        for kind in ("logprobs", "tie"):
            value = getattr(entry, kind)
            if value is not None:
                tolerances[kind] = max(value, tolerances.get(kind, 0.0))
    return tolerances


def plan_cell(matrix: Matrix, cell: Cell, faults: frozenset[str]) -> CellPlan:
    """The plan of ``cell``: its levels, its references' configurations, its workloads (``[[workloads]]``) and
    timeout, what it is declared to fail, the tolerances it is judged with and whether it draws (``[boundary]``)."""
    levels = cell.as_dict()
    engine, args = matrix.engine, dict(matrix.engine_args)
    golden_levels = {**matrix.golden, **matrix.golden_of(cell).as_dict()}
    goldens = {"golden": GoldenConfig(engine, golden_levels, args)}
    spec_levels = spec_golden_levels(levels, golden_levels, engine)
    if spec_levels is not None:
        goldens["spec_golden"] = GoldenConfig(engine, spec_levels, args)
    cross = sut.cross_golden(engine, sut.engine(engine).levels.full(levels), args)
    if cross is not None:
        goldens["cross_engine"] = GoldenConfig(*cross)
    known = tuple(KnownFailure(entry.number, entry.fails, tuple(entry.signature.items()))
                  for entry in matrix.known_for(cell))
    boundary = matrix.boundary if matrix.boundary is not None and matrix.boundary.applies(levels) else None
    return CellPlan(cell.cell_id, matrix.name, levels, matrix.workloads_for(cell), matrix.timeout_s, frozenset(faults),
                    engine, args, goldens, matrix.expected_for(cell), _tolerances(matrix, cell), known, boundary)
