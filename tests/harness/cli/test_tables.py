"""The tables the command line prints from what the code declares (``harness oracles``, ``faults``, ``factors``): each
fault with its incident and the levels that trigger it."""
from __future__ import annotations

from harness.cli.main import main


def test_faults_lists_incident_and_triggers(capsys) -> None:
    assert main(["faults"]) == 0
    out = capsys.readouterr().out
    assert "priority_scheduler_drop" in out and "vLLM #49206" in out and "scheduler in {priority}" in out
