"""Reproducer scripts, one writer per engine: the script's text for a finding, and the command that runs it.

A writer is one module here and one line in ``WRITERS``. Every script has the same shape, whatever the engine: a
header (what fails, the exact command, the environment it was written in), the shrunk workload as token ids, the
failing setting and the same with the one setting toggled, the check (``harness.repro.standalone.checks``, copied
in), the engine's serve function (copied from its module in ``harness.repro.standalone``), and a ``main`` that runs
both settings and exits 1 while the failure shows, 0 once it does not.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.repro.finding import Reproducer, ReproError
from harness.repro.scripts import reference, vllm
from harness.repro.scripts.text import Command


@dataclass(frozen=True, slots=True)
class ScriptWriter:
    """One engine's reproducer: ``script`` writes its text (the finding, the path it will have), ``command`` says how
    it runs (the path: ``python`` there is the engine's interpreter), ``environment`` gives the engine's lines of an
    environment (its version, torch's), ``python`` the interpreter ``harness repro`` runs the script with to check it
    exits 1."""

    engine: str
    script: Callable[[Reproducer, Path], str]
    command: Callable[[Path], Command]
    environment: Callable[[], list[str]]
    python: Callable[[], str] = lambda: sys.executable


#: engine → its writer; the llama-server (HTTP) writer joins here.
WRITERS: dict[str, ScriptWriter] = {
    "reference": ScriptWriter("reference", reference.script, reference.command, reference.engine_lines),
    "vllm": ScriptWriter("vllm", vllm.script, vllm.command, vllm.engine_lines, vllm.python),
}


def writer_for(engine: str) -> ScriptWriter:
    """The writer of ``engine``'s scripts; ``ReproError`` naming the engines that have one."""
    if engine not in WRITERS:
        raise ReproError(f"engine {engine!r}: no reproducer script writer yet (engines with one: {', '.join(WRITERS)})")
    return WRITERS[engine]
