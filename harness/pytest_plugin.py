"""The pytest plugin: ``pytest -m matrix --matrix NAME`` makes one test item per cell.

Items are collected from the matrix file itself (``matrices/NAME.toml``), so ``-k``,
``--lf``, JUnit XML and ``-n`` (pytest-xdist) work as for any test. Every finished cell is
appended to ``--report-dir``/results.jsonl (under a lock, so xdist workers can share it).
The report directory is (re)started only when tests are about to run: ``--collect-only``
leaves a finished run's results as they are.
"""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from harness.cli import DEFAULT_REPORT_DIR, UsageError, load_spec, parse_shard, select_shard
from harness.matrix import Cell, MatrixError, MatrixSpec, generate
from harness.provenance import run_header
from harness.results import ResultsStore, RunInfo
from harness.runner import CellResult, GoldenRuns, configure_torch, run_cell
from reference_impl.faults import UnknownFaultError, check_faults

_STATE = pytest.StashKey["_MatrixRun"]()


class _MatrixRun:
    """What every item of this session shares: the matrix, its cells, the store and the golden runs."""

    def __init__(self, spec: MatrixSpec, cells: list[Cell], faults: frozenset[str], store: ResultsStore, device: str) -> None:
        self.spec = spec
        self.cells = cells
        self.faults = faults
        self.store = store
        self.goldens = GoldenRuns(device)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvmatrix", "kvmatrix combinatorial matrix")
    group.addoption("--matrix", metavar="NAME", help="run the cells of matrices/NAME.toml (or a .toml path) as tests")
    group.addoption("--strength", type=int, metavar="T", help="generate a t-wise covering array of strength T")
    group.addoption("--inject-fault", action="append", default=[], metavar="NAME", help="turn on a named fault (repeatable)")
    group.addoption("--report-dir", default=str(DEFAULT_REPORT_DIR), metavar="DIR", help="results.jsonl, summary.json, index.html go here")
    group.addoption("--matrix-shard", metavar="I/N", help="run only shard I of N of the cells (1-based)")
    group.addoption("--device", default="cpu", help="torch device of every pool and model (cuda: compiled Triton)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "matrix: one cell of a kvmatrix matrix (select with -m matrix --matrix NAME)")
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped with a reason elsewhere")
    name = config.getoption("--matrix")
    if not name:
        return
    try:
        spec = load_spec(name, config.getoption("--strength"))
        faults = check_faults(config.getoption("--inject-fault"))
        shard = config.getoption("--matrix-shard")
        cells = select_shard(generate(spec), parse_shard(shard, "--matrix-shard") if shard else None)
    except (MatrixError, UnknownFaultError, UsageError) as exc:
        raise pytest.UsageError(str(exc)) from None
    device = config.getoption("--device")
    header = run_header(spec, name, faults, device, shard, len(cells), argv=["pytest", *config.invocation_params.args])
    info = RunInfo(spec.name, spec.mode, spec.strength, sorted(faults), len(cells), header=header, device=device)
    store = ResultsStore(Path(config.getoption("--report-dir")), info)
    if hasattr(config, "workerinput"):  # a worker writes its rows under the controller's run id
        header.run_id = config.workerinput.get("kvmatrix_run_id", header.run_id)
    configure_torch()
    config.stash[_STATE] = _MatrixRun(spec, cells, faults, store, device)
    matrix_path = str(spec.path.resolve())
    if not any(matrix_path.startswith(str(Path(arg.split("::")[0]).resolve())) for arg in config.args):
        config.args.append(matrix_path)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    run = parent.config.stash.get(_STATE, None)
    if run is not None and file_path.resolve() == run.spec.path.resolve():
        return MatrixFile.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """After -k/-m/--lf deselection: the summary counts only the cells this session will run."""
    run = config.stash.get(_STATE, None)
    if run is not None:
        run.store.info.cells_planned = sum(isinstance(item, MatrixItem) for item in items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """Start the report once, when cells are about to run: never for --collect-only, never on an xdist worker."""
    config = session.config
    run = config.stash.get(_STATE, None)
    if run is None or config.option.collectonly or hasattr(config, "workerinput"):
        return
    run.store.start(resume=False, planned={c.cell_id for c in run.cells})


class MatrixFile(pytest.File):
    """The matrix file as a test module: one item per (shard-selected) cell, in generation order."""

    def collect(self):
        run = self.config.stash[_STATE]
        for cell in run.cells:
            yield MatrixItem.from_parent(self, name=cell.cell_id, cell=cell)


class CellFailed(Exception):
    """A cell whose oracles failed or that raised; carries the result for the failure report."""

    def __init__(self, result: CellResult) -> None:
        super().__init__(result.cell_id)
        self.result = result


class MatrixItem(pytest.Item):
    """One cell: runs it, records it, fails with the oracles' evidence."""

    def __init__(self, *, cell: Cell, **kwargs) -> None:
        super().__init__(**kwargs)
        self.cell = cell
        self.add_marker("matrix")

    def runtest(self) -> None:
        run = self.config.stash[_STATE]
        result = run_cell(run.spec, self.cell, faults=run.faults, goldens=run.goldens)
        run.store.add(result)
        if result.status in ("fail", "error"):
            raise CellFailed(result)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None) -> str:
        if not isinstance(excinfo.value, CellFailed):
            return super().repr_failure(excinfo)
        result = excinfo.value.result
        run = self.config.stash[_STATE]
        lines = [f"cell {result.cell_id}: {result.status}"]
        lines += [f"  {name}: {v.message}" for name, v in result.oracles.items() if v.status == "fail"]
        if result.error:
            lines += ["", result.error]
        lines += ["", f"reproduce: {reproduce_line(self.config, self.nodeid)}",
                  f"evidence:  {run.store.results_path} (cell_id {result.cell_id}), {run.store.index_path}"]
        return "\n".join(lines)

    def reportinfo(self):
        return self.path, None, f"cell {self.cell.cell_id}"


def reproduce_line(config: pytest.Config, nodeid: str) -> str:
    """The pytest command that reruns exactly this item: every kvmatrix option as given, the item by node id."""
    args = ["pytest", "-m", "matrix", "--matrix", config.getoption("--matrix")]
    for option in ("--strength", "--matrix-shard", "--device", "--report-dir"):
        value = config.getoption(option)
        if value is not None:
            args += [option, str(value)]
    for fault in config.getoption("--inject-fault"):
        args += ["--inject-fault", fault]
    return shlex.join([*args, nodeid])


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist: every worker writes its rows under the controller's run id (one header in runs.jsonl)."""
    run = node.config.stash.get(_STATE, None)
    if run is not None and run.store.info.header is not None:
        node.workerinput["kvmatrix_run_id"] = run.store.info.header.run_id


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The controller (or a plain run) rebuilds summary.json and index.html once every cell has ended."""
    config = session.config
    run = config.stash.get(_STATE, None)
    if run is not None and not hasattr(config, "workerinput") and not config.option.collectonly:
        run.store.finish()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    run = config.stash.get(_STATE, None)
    if run is not None and not hasattr(config, "workerinput") and not config.option.collectonly:
        terminalreporter.write_line(f"kvmatrix report: {run.store.index_path}")
