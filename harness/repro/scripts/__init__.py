"""Reproducer scripts, one writer per engine: the script's text for a finding, and the command that runs it.

A writer is one module here and one line in ``WRITERS``. Every script has the same shape, whatever the engine: a
header (what fails, the exact command, the environment it was written in), the shrunk workload as token ids, the
failing setting and the same with the one setting toggled, the check (``harness.repro.standalone.checks``, copied
in), the engine's serve function (copied from its module in ``harness.repro.standalone``), and a ``main`` that runs
both settings and exits 1 while the failure shows, 0 once it does not, 2 when it cannot be judged here. A writer
takes a finding's data from a reproducer once (``data``) and renders its script from that data alone (``render``).
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from harness import sut
from harness.repro.finding import Reproducer, ReproError
from harness.repro.scripts import llamacpp, reference, vllm
from harness.repro.scripts.text import Command


@dataclass(frozen=True, slots=True)
class ScriptWriter:
    """One engine's reproducer: ``data`` takes a finding's script data (plain values) from a reproducer, ``render``
    writes the script's text from a finding's data alone (so a committed finding renders again without a run or its
    engine), ``install`` gives the lines that install what the script needs, ``command`` how a maintainer runs it
    (the path: ``python`` there is the installed interpreter), ``environment`` the engine's lines of an environment
    (its version, torch's); ``python`` and ``here`` the interpreter and environment ``harness repro`` runs the script
    with on this machine to check it exits 1."""

    engine: str
    data: Callable[[Reproducer], dict]
    render: Callable[[Mapping], str]
    install: Callable[[Mapping], list[str]]
    command: Callable[[Path], Command]
    environment: Callable[[], list[str]]
    python: Callable[[], str] = lambda: sys.executable
    here: Callable[[], dict[str, str]] = dict


def _writer(engine: str, module: ModuleType) -> ScriptWriter:
    """The writer a module of this package defines (``data``, ``render``, ``install``, ``command``, ``engine_lines``,
    and where it has them ``python`` and ``here``)."""
    return ScriptWriter(engine, module.data, module.render, module.install, module.command, module.engine_lines,
                        **{name: getattr(module, name) for name in ("python", "here") if hasattr(module, name)})


#: engine → its writer (a server, ``engine = "openai"``, by its wire format: ``[server] api``).
WRITERS: dict[str, ScriptWriter] = {
    "reference": _writer("reference", reference),
    "vllm": _writer("vllm", vllm),
    "llamacpp": _writer("llamacpp", llamacpp),
}


def writer_for(engine: str, engine_args: Mapping[str, object]) -> ScriptWriter:
    """The writer of the scripts of what ``engine``'s cells run (a server's by its wire format); ``ReproError``
    naming those that have one."""
    program = sut.engine(engine).program_name(engine_args)
    if program not in WRITERS:
        raise ReproError(f"{program} (engine {engine!r}): no reproducer script writer yet (writers: "
                         f"{', '.join(WRITERS)})")
    return WRITERS[program]
