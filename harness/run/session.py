"""One matrix run, opened the same way by ``harness run``, ``harness kill``, ``harness locate`` and the pytest
session: the matrix loaded and checked runnable on the device, its faults checked, torch configured, and the
golden runs every cell of the run shares."""
from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from harness import sut
from harness.matrix.file import named_matrix
from harness.matrix.model import Cell, MatrixError, Matrix, shown_path
from harness.results.header import (
    RunHeader, command_line, device_name, file_sha256, new_run_id, now, versions,
)
from harness.results.rows import CellResult
from harness.run.cell import configure_torch, run_cell
from harness.run.plan import CellPlan, plan_cell
from harness.run.golden import GoldenRuns
from harness.sut.host import cpu_flags, git_commit, kernel_flags, kernel_flags_of, record as host_record
from reference_impl.faults import check_faults


def check_runnable(matrix: Matrix, device: str, flags: frozenset[str] | None = None) -> None:
    """Raise ``MatrixError`` (one line) when ``device`` is not here, the engine's program is not, the engine
    refuses one of the matrix's levels on it, or a level's kernel path needs a CPU flag this host (whose flags are
    ``flags``, this machine's by default) lacks: a matrix that cannot run is refused when it is loaded, never run
    into error cells."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise MatrixError(f"--device {device}: this torch ({torch.__version__}) sees no CUDA device; "
                              f"run on a GPU machine, or with --device cpu")
    engine = sut.engine(matrix.engine)
    problem = engine.launch_problem(matrix.engine_args)
    if problem is not None:
        raise MatrixError(f"{shown_path(matrix.path)}: {problem}")
    for factor, level in _levels(matrix):
        reason = engine.levels.refused(device, factor, level)
        if reason is not None:
            raise MatrixError(f"{shown_path(matrix.path)}: [factors] {factor}: level {level!r} cannot run on "
                              f"--device {device}: {reason}")
    check_cpu_needs(matrix, cpu_flags() if flags is None else flags)


def _levels(matrix: Matrix) -> list[tuple[str, object]]:
    """Every (factor, level) a run of ``matrix`` may run: its factors' levels and its golden ones."""
    return [(factor, level) for factor, values in matrix.factors for level in values] + list(matrix.golden.items())


def check_cpu_needs(matrix: Matrix, flags: frozenset[str]) -> None:
    """Raise ``MatrixError`` naming the first level of ``matrix`` whose kernel path needs a CPU flag ``flags`` lacks."""
    needs = sut.engine(matrix.engine).needs_cpu(matrix.engine_args)
    for factor, level in _levels(matrix):
        missing = sorted(needs.get(factor, {}).get(str(level), frozenset()) - flags)
        if missing:
            raise MatrixError(f"{shown_path(matrix.path)}: [factors] {factor}: level {level!r} needs CPU flag(s) "
                              f"{', '.join(missing)}, which this host's CPU lacks (it has "
                              f"{' '.join(kernel_flags_of(flags)) or 'none of them'}): its kernel path "
                              f"runs only on a CPU with them")


class MatrixRun:
    """A loaded, runnable matrix on one device with its injected faults, and the golden runs its cells share."""

    def __init__(self, matrix: Matrix, device: str = "cpu", faults: frozenset[str] = frozenset()) -> None:
        self.matrix = matrix
        self.device = device
        self.faults = faults
        self.goldens = GoldenRuns(device)
        #: where the boundary family's example database lives (``--examples-db``, else the report directory's)
        self.examples_db: str | None = None

    @classmethod
    def open(cls, matrix: str, *, strength: int | None = None, device: str = "cpu",
             faults: Iterable[str] = ()) -> MatrixRun:
        """Load ``matrix`` (a name or a path), refuse it if it cannot run here, check ``faults``; raises
        ``MatrixError`` or ``UnknownFaultError`` with one line naming the input."""
        matrix = named_matrix(matrix, strength)
        check_runnable(matrix, device)
        checked = check_faults(list(faults))
        configure_torch()
        return cls(matrix, device, checked)

    @property
    def in_process(self) -> bool:
        """Whether the engine runs in the cell's process (then ``-j`` fills the cores by default)."""
        return sut.engine(self.matrix.engine).in_process

    def run_cell(self, cell: Cell, on_step: Callable[[str], None] | None = None) -> CellResult:
        """Plan, run and judge one cell of this run (or any allowed combination of its levels)."""
        return run_cell(self.matrix, cell, faults=self.faults, goldens=self.goldens, on_step=on_step,
                        examples_db=self.examples_db)

    def plan(self, cell: Cell) -> CellPlan:
        """The plan of one cell of this run, its boundary draws kept in this run's example database."""
        return dataclasses.replace(plan_cell(self.matrix, cell, self.faults), examples_db=self.examples_db)

    def header(self, matrix_arg: str, shard: str | None, cells_planned: int,
               argv: Sequence[str] | None = None) -> RunHeader:
        """The header of this run about to start (``shard`` as ``I/N`` or None): what a person needs to trust and
        repeat it."""
        matrix = self.matrix
        engine = sut.engine(matrix.engine)
        version = engine.version(matrix.engine_args)
        built = {**({"version": version} if version else {}), **engine.build(matrix.engine_args)}
        return RunHeader(
            run_id=new_run_id(), matrix=matrix.name, matrix_arg=matrix_arg, matrix_file=str(matrix.path),
            matrix_sha256=file_sha256(matrix.path), mode=matrix.mode, strength=matrix.strength,
            faults=sorted(self.faults), device=self.device, device_name=device_name(self.device), shard=shard,
            cells_planned=cells_planned, commit=git_commit(Path(__file__).resolve().parents[1]), date=now(),
            host=socket.gethostname(), versions=versions(), command=command_line(argv), engine=engine.name,
            engine_version=version, cpu_flags=kernel_flags(),
            machine=host_record(self.device, {engine.program_name(matrix.engine_args): built}).to_json(),
        )
