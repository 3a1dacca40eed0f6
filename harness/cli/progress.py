"""A live progress line for long runs: cells done/planned, the current cell and its workload/pass, elapsed, ETA.

Drawn with rich on stdout, and only when stdout is a terminal: in CI logs and pipes nothing
but the usual one line per finished cell is printed (rich keeps those lines above the live one). The ETA is rich's estimate from the
cells finished so far (cells differ in cost, so it settles as the run goes on).
"""
from __future__ import annotations

import sys
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class RunProgress:
    """Context manager: ``step()`` as a cell starts and at each workload pass, ``advance()`` when it ends.

    Cells that run side by side (``harness run -j``) each pass their own ``key`` and get a line each.
    """

    def __init__(self, planned: int, enabled: bool | None = None, console: Console | None = None) -> None:
        self.enabled = sys.stdout.isatty() if enabled is None else enabled
        self._running: dict[object, list[str]] = {}  # key → [cell id, what it does now]
        self._progress = Progress(
            TextColumn("cells"), MofNCompleteColumn(), BarColumn(bar_width=20), TimeElapsedColumn(),
            TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.description}"),
            console=console or Console(file=sys.stdout), disable=not self.enabled, transient=True,
        )
        self._task = self._progress.add_task("", total=planned)

    def __enter__(self) -> RunProgress:
        self._progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._progress.stop()

    def step(self, what: str, key: object = 0, cell_id: str = "") -> None:
        """The cell of ``key`` (``cell_id``, shown from its first step) moves on to ``what`` (``burst/alone``)."""
        self._running.setdefault(key, [cell_id, ""])[1] = what
        self._show()

    def advance(self, key: object = 0) -> None:
        """A cell ended (run or kept from a previous run)."""
        self._running.pop(key, None)
        self._progress.advance(self._task)
        self._show()

    def _show(self) -> None:
        lines = [f"{cell} · {what}" if what else cell for cell, what in self._running.values()]
        self._progress.update(self._task, description="\n".join(lines))
