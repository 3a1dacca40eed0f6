"""The pytest plugin: ``pytest -m matrix --matrix NAME`` makes one test item per cell.

Loaded through the ``pytest11`` entry point in every pytest run of an environment where kvmatrix
is installed, so it stays light: it declares the options (from ``harness.results.header.RUN_OPTIONS``,
the table ``harness run`` reads too) and the markers, and registers the machinery that collects and
runs cells (``harness.cli.matrix_tests``) only when ``--matrix`` is given. A pytest run of any other
project imports neither torch nor the engine.
"""
from __future__ import annotations

import pytest

from harness.results.header import OPTIONS_BY_DEST, add_run_options


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvmatrix", "kvmatrix combinatorial matrix")
    add_run_options(group.addoption, list(OPTIONS_BY_DEST), pytest=True)  # every run option (--shard as --matrix-shard)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "matrix: one cell of a kvmatrix matrix (select with -m matrix --matrix NAME)")
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped with a reason elsewhere")
    if config.getoption("matrix"):
        from harness.cli.matrix_tests import MatrixSession

        config.pluginmanager.register(MatrixSession(config), "kvmatrix-session")
