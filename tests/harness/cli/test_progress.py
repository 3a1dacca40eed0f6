"""The live progress line: cells done/planned, the cell and its workload/pass, elapsed, ETA; silent off a terminal."""
from __future__ import annotations

import io

from rich.console import Console

from harness.cli.progress import RunProgress


def drive(progress: RunProgress) -> None:
    with progress:
        progress.step("system_prompt/warm", cell_id="/model:dense/cache:device/")
        progress.step("burst/alone", key=1, cell_id="/model:hybrid/cache:off/")  # a second cell side by side (-j)
        progress._progress.refresh()
        progress.advance(key=1)
        progress._progress.refresh()


def test_progress_shows_counts_cell_and_pass_on_a_terminal() -> None:
    screen = io.StringIO()
    drive(RunProgress(3, enabled=True, console=Console(file=screen, force_terminal=True, width=160)))
    shown = screen.getvalue()
    assert "1/3" in shown and "/model:dense/cache:device/ · system_prompt/warm" in shown
    assert "/model:hybrid/cache:off/ · burst/alone" in shown
    assert "0:00:0" in shown and "eta" in shown


def test_progress_is_silent_when_not_a_terminal(capsys) -> None:
    drive(RunProgress(3))  # pytest's captured stdout is not a terminal
    assert capsys.readouterr().out == ""
