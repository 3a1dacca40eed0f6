"""An engine's reproducer script writer, as its package declares it (``Engine.writers``), and what it is handed.

Every script has the same shape, whatever the engine: a header (what fails, the exact command, the environment it was
written in), the shrunk workload as token ids, the failing setting and the same with the one setting toggled, the
check (``harness.sut.script.checks``, copied in), the engine's serve function (copied from its package's
``standalone`` module), and a ``main`` that runs both settings and exits 1 while the failure shows, 0 once it does not,
2 when it cannot be judged here. A writer takes its engine's part of a finding's script data from plain inputs once
(``data``: the repro layer adds the part every script has) and renders its script from that data alone (``render``).
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from fixtures.workloads import Workload
from harness.sut.script.text import Command


class NoScript(ValueError):
    """A finding no script can be written for: a program without a writer, a setting the writer cannot write (a
    checkpoint without an inline recipe, a PD pair of servers); the message names it."""


@dataclass(frozen=True, slots=True)
class ScriptInputs:
    """What a writer's ``data`` reads of a finding: the shrunk workload, the cell's full levels and the same with the
    one setting toggled, the engine's arguments (what ``Engine.parse_tables`` made of the matrix file's tables), the
    faults planted and the device."""

    workload: Workload
    levels: Mapping[str, object]
    toggled: Mapping[str, object]
    engine_args: Mapping[str, object]
    faults: frozenset[str]
    device: str


@dataclass(frozen=True, slots=True)
class ScriptWriter:
    """One program's reproducer (``engine``: ``Engine.program_name``): ``data`` takes its part of a finding's script
    data (plain values) from the inputs, ``render`` writes the script's text from a finding's data alone (so a
    committed finding renders again without a run or its engine), ``install`` gives the lines that install what the
    script needs (given None, the engine alone: a finding without a script was seen there), ``command`` how a
    maintainer runs it (the path: ``python`` there is the installed interpreter), ``environment`` the engine's lines
    of an environment (its version, torch's); ``python`` and ``here`` the interpreter and environment ``harness
    repro`` runs the script with on this machine to check it exits 1."""

    engine: str
    data: Callable[[ScriptInputs], dict]
    render: Callable[[Mapping], str]
    install: Callable[[Mapping | None], list[str]]
    command: Callable[[Path], Command]
    environment: Callable[[], list[str]]
    python: Callable[[], str] = lambda: sys.executable
    here: Callable[[], dict[str, str]] = dict
