"""Reproducer scripts, one writer per engine: the script's text for a finding, and the command that runs it.

A writer is one module here and one line in ``WRITERS``. Every script has the same shape, whatever the engine: a
header (what fails, the exact command, the environment it was written in), the shrunk workload as token ids, the
failing setting and the same with the one setting toggled, the check (``harness.repro.standalone.checks``, copied
in), the engine's serve function (copied from its module in ``harness.repro.standalone``), and a ``main`` that runs
both settings and exits 1 while the failure shows, 0 once it does not.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from harness import sut
from harness.repro.finding import Reproducer, ReproError
from harness.repro.scripts import llamacpp, reference, vllm
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


#: engine → its writer (a server, ``engine = "openai"``, by its wire format: ``[server] api``).
WRITERS: dict[str, ScriptWriter] = {
    "reference": ScriptWriter("reference", reference.script, reference.command, reference.engine_lines),
    "vllm": ScriptWriter("vllm", vllm.script, vllm.command, vllm.engine_lines, vllm.python),
    "llamacpp": ScriptWriter("llamacpp", llamacpp.script, llamacpp.command, llamacpp.engine_lines, llamacpp.python),
}


def writer_for(engine: str, engine_args: Mapping[str, object]) -> ScriptWriter:
    """The writer of the scripts of what ``engine``'s cells run (a server's by its wire format); ``ReproError``
    naming those that have one."""
    program = sut.engine(engine).program_name(engine_args)
    if program not in WRITERS:
        raise ReproError(f"{program} (engine {engine!r}): no reproducer script writer yet (writers: "
                         f"{', '.join(WRITERS)})")
    return WRITERS[program]
