"""The matrix's cells as pytest items: what ``harness.pytest_plugin`` registers when ``--matrix`` is given.

Items are collected from the matrix file itself (``matrices/NAME.toml``), so ``-k``,
``--lf``, JUnit XML and ``-n`` (pytest-xdist) work as for any test. Every finished cell is
appended to ``--report-dir``/results.jsonl (under a lock, so xdist workers can share it).
The report directory is (re)started only when tests are about to run: ``--collect-only``
leaves a finished run's results as they are.
"""
from __future__ import annotations

import shlex
from functools import partial
from pathlib import Path

import pytest

from harness import oracles
from harness.matrix.model import Cell, MatrixError, generate
from harness.matrix.selection import SelectionError, parse_shard, select_shard
from harness.results.header import OPTIONS_BY_DEST, option_arguments
from harness.results.rows import FAILING, CellResult
from harness.results.store import ResultsStore, RunInfo
from harness.run.session import MatrixRun
from harness.sut import UnknownEngineError
from reference_impl.faults import UnknownFaultError
from reports.html import write_report

_SESSION = "kvmatrix-session"


class MatrixSession:
    """The hooks of a matrix run, and what every item shares: the matrix, its cells, the store, the golden runs."""

    def __init__(self, config: pytest.Config) -> None:
        name, shard, device = config.getoption("matrix"), config.getoption("shard"), config.getoption("device")
        try:
            self.run = MatrixRun.open(name, strength=config.getoption("strength"), device=device,
                                      faults=config.getoption("inject_fault"))
            self.matrix, self.faults = self.run.matrix, self.run.faults
            self.cells = select_shard(generate(self.matrix), parse_shard(shard, "--matrix-shard") if shard else None)
        except (MatrixError, UnknownFaultError, UnknownEngineError, SelectionError) as exc:
            raise pytest.UsageError(str(exc)) from None
        header = self.run.header(name, shard, len(self.cells), argv=["pytest", *config.invocation_params.args])
        info = RunInfo(self.matrix.name, self.matrix.mode, self.matrix.strength, sorted(self.faults), len(self.cells),
                       header=header, device=device)
        self.store = ResultsStore(Path(config.getoption("report_dir")), info,
                                  render=partial(write_report, kinds=oracles.evidence_kinds()))
        self.run.examples_db = str(self.store.dir / "hypothesis")
        if hasattr(config, "workerinput"):  # a worker writes its rows under the controller's run id
            header.run_id = config.workerinput.get("kvmatrix_run_id", header.run_id)
        self.controller = not hasattr(config, "workerinput")
        matrix_path = str(self.matrix.path.resolve())
        if not any(matrix_path.startswith(str(Path(arg.split("::")[0]).resolve())) for arg in config.args):
            config.args.append(matrix_path)

    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
        if file_path.resolve() == self.matrix.path.resolve():
            return MatrixFile.from_parent(parent, path=file_path)
        return None

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """After -k/-m/--lf deselection: the summary counts only the cells this session will run."""
        self.store.info.cells_planned = sum(isinstance(item, MatrixItem) for item in items)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        """Start the report once, when cells are about to run: never for --collect-only, never on an xdist worker."""
        if self.controller and not session.config.option.collectonly:
            self.store.start(resume=False, planned={c.cell_id for c in self.cells})

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        """xdist: every worker writes its rows under the controller's run id (one header in runs.jsonl)."""
        if self.store.info.header is not None:
            node.workerinput["kvmatrix_run_id"] = self.store.info.header.run_id

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """The controller (or a plain run) rebuilds summary.json and index.html once every cell has ended."""
        if self.controller and not session.config.option.collectonly:
            self.store.finish()

    def pytest_terminal_summary(self, terminalreporter, exitstatus: int, config: pytest.Config) -> None:
        if self.controller and not config.option.collectonly:
            terminalreporter.write_line(f"kvmatrix report: {self.store.index_path}")


def _session(config: pytest.Config) -> MatrixSession:
    return config.pluginmanager.get_plugin(_SESSION)


class MatrixFile(pytest.File):
    """The matrix file as a test module: one item per (shard-selected) cell, in generation order."""

    def collect(self):
        for cell in _session(self.config).cells:
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
        session = _session(self.config)
        result = session.run.run_cell(self.cell)
        session.store.add(result)
        if result.status == "xfail":
            pytest.xfail(f"declared known failure ({', '.join(result.expected['fails'])}): {result.expected['reason']}")
        if result.status in FAILING:
            raise CellFailed(result)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None) -> str:
        if not isinstance(excinfo.value, CellFailed):
            return super().repr_failure(excinfo)
        result = excinfo.value.result
        run = _session(self.config)
        lines = [f"cell {result.cell_id}: {result.status}"]
        if result.status == "xpass":
            lines += [f"  declared to fail {', '.join(result.expected['fails'])} ({result.expected['reason']}), "
                      f"and passed: the [[expected]] entry is stale (strict)"]
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
    values = {dest: config.getoption(dest) for dest in OPTIONS_BY_DEST}
    return shlex.join(["pytest", "-m", "matrix", *option_arguments(values, pytest=True), nodeid])
