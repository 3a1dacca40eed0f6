"""run_group: a program that outlives its timeout goes with everything it started."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.binaries import run_group


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, reaped by no one here, is not running)."""
    status = Path(f"/proc/{pid}/status")
    try:
        return "\nState:\tZ" not in status.read_text()
    except FileNotFoundError:
        return False


def test_a_timeout_kills_the_programs_children_too(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    with pytest.raises(subprocess.TimeoutExpired):
        run_group(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], 2)
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the script's child outlived its timeout"


def test_a_program_that_ends_returns_its_status_and_output() -> None:
    done = run_group(["sh", "-c", "echo out; echo err >&2; exit 3"], 10)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
