"""The parts every reproducer script shares: the standalone modules' definitions copied in, their imports, literals
laid out for reading, and the environment the script was written in."""
from __future__ import annotations

import ast
import inspect
import platform
import pprint
import shlex
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType

from harness.oracles import pd_audit
from harness.repro import expect
from harness.repro.finding import Reproducer
from harness.repro.standalone import checks
from harness.sut import host
from harness.sut.host import kernel_flags


@dataclass(frozen=True, slots=True)
class Command:
    """How a script runs: the argument vector, and what its environment needs beside the caller's."""

    argv: tuple[str, ...]
    env: Mapping[str, str]

    def text(self) -> str:
        """The shell line a person pastes."""
        return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in self.env.items()), shlex.join(self.argv)])


def _defines(node: ast.stmt) -> set[str]:
    """The names a top-level statement defines (a function's, a class's, an assignment's targets)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return {name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name)}


def definitions(module: ModuleType, names: Sequence[str] | None = None) -> tuple[list[str], str]:
    """``module``'s import lines (``from __future__`` and a sibling's, whose definitions a script copies in as well,
    left out) and the source of everything else it defines, its docstring left out: what a script copies in. With
    ``names``, those definitions alone and no import (what they need, the script imports beside them)."""
    source = inspect.getsource(module)
    tree = ast.parse(source)
    imports, body = [], []
    for node in tree.body:
        start = node.decorator_list[0].lineno if getattr(node, "decorator_list", None) else node.lineno
        text = "\n".join(source.splitlines()[start - 1 : node.end_lineno])
        if names is not None:
            if _defines(node) & set(names):
                body.append(text)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if not (isinstance(node, ast.ImportFrom) and (node.module == "__future__" or node.level)):
                imports.append(text)
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            body.append(text)
    return imports, "\n\n\n".join(body)


def check_definitions() -> list[tuple[list[str], str]]:
    """What every script copies in to judge its check: ``standalone.checks`` and the oracle rule it calls."""
    return [definitions(checks), definitions(pd_audit, ["nixl_bytes"]), definitions(host, ["flags_of", "_field"])]


def import_block(lines: set[str] | list[str]) -> str:
    """Import lines sorted, plain imports first, the names one module gives joined on one line."""
    plain = sorted({line for line in lines if line.startswith("import ")})
    names: dict[str, set[str]] = {}
    for line in lines:
        if line.startswith("from "):
            module, _, given = line[len("from "):].partition(" import ")
            names.setdefault(module, set()).update(name.strip() for name in given.split(","))
    froms = [f"from {module} import {', '.join(sorted(names[module]))}" for module in sorted(names)]
    return "\n".join([*plain, *froms])


def literal(value: object, indent: int = 0) -> str:
    """``value`` as Python source, laid out within 110 columns."""
    text = pprint.pformat(value, width=110 - indent, sort_dicts=False, compact=True)
    return text.replace("\n", "\n" + " " * indent)


def rounds_literal(rounds: list[list[tuple]]) -> str:
    """The workload's rounds, one request a line: ``(rid, prompt token ids, max_new_tokens, priority)``."""
    lines = ["["]
    for group in rounds:
        lines.append("    [")
        for request in group:
            lines.append("        " + literal(request, 8) + ",")
        lines.append("    ],")
    lines.append("]")
    return "\n".join(lines)


def environment(*engine: str) -> list[str]:
    """The lines of a header's environment: the engine's own (``engine``), python, the platform and CPU flags."""
    return [*engine, f"python {platform.python_version()}", f"platform {platform.platform()}",
            f"CPU {platform.machine()}, flags: {' '.join(kernel_flags()) or 'unknown'}"]


#: how every script ends its docstring: its exit statuses (a finding that needs CPU flags, and a writer, add theirs).
EXIT_TEXT = ("Exit status: 1 while the bug is present, 0 once fixed, 2 when a run raised something the finding did not "
             "record")


def exits(repro: Reproducer, more: Sequence[str]) -> list[str]:
    """The docstring's exit statuses, wrapped: the three every script has, ``CANNOT_SHOW`` where the finding needs
    CPU flags, then ``more`` (a writer's own)."""
    clauses = [EXIT_TEXT, *([f"{checks.CANNOT_SHOW} (and one line naming the flag) on a host whose CPU lacks "
                             f"{' '.join(repro.needs_cpu)}: nothing run there can show it"] if repro.needs_cpu else []),
               *more]
    return textwrap.wrap("; ".join(clauses) + ".", 110)


def docstring(repro: Reproducer, engine: str, notes: Sequence[str], engine_lines: Sequence[str],
              run: Sequence[str], more_exits: Sequence[str] = ()) -> str:
    """A script's docstring: what fails with which setting on ``engine``, the cell it came from and its shrink (then
    ``notes``), the environment it was written in (``engine_lines`` first), how to run it (``run``), its exits (the
    writer's own ``more_exits`` last)."""
    toggle, check, header = repro.toggle, repro.check, repro.header
    prose = [
        f"Cell {repro.row['cell_id']} of matrix {header.get('matrix', '?')} (run {header.get('run_id', '?')}), its "
        f"workload {repro.shrunk.workload.name.removesuffix('.shrunk')} shrunk while the check still failed: "
        f"{repro.shrunk.text()}.", *notes,
        f"Written by: {repro.command()}",
    ]
    lines = [
        f"Reproducer: {check.text()} fails with {toggle.factor}={toggle.level}, passes with {toggle.factor}="
        f"{toggle.golden} ({engine}).", "",
        *(wrapped for line in prose for wrapped in textwrap.wrap(line, 110, subsequent_indent="  ")), "",
        "Environment it was written in:", *(f"  {line}" for line in environment(*engine_lines)), *run,
        *exits(repro, more_exits),
    ]
    return '"""' + "\n".join(lines) + '\n"""'


def toggle_comment(repro: Reproducer) -> str:
    """The comment above ``TOGGLED``."""
    toggle = repro.toggle
    return f"#: the one toggled setting: {toggle.factor} {toggle.level} → {toggle.golden} (its golden level)"


def workload_and_check(repro: Reproducer) -> list[str]:
    """``SETTING``, ``ROUNDS`` (the shrunk workload) and ``CHECK``: the constants every script ends its own with."""
    toggle = repro.toggle
    rounds = [[(r.rid, r.prompt, r.max_new_tokens, r.priority) for r in group]
              for group in repro.shrunk.workload.rounds()]
    return [
        f"SETTING = {literal(f'{toggle.factor}={toggle.level}')}",
        "#: the shrunk workload, served cold then warm: rounds of (request id, prompt token ids, max_new_tokens,",
        "#: priority)",
        f"ROUNDS = {rounds_literal(rounds)}",
        "#: the check that fails, and what it needs (from the harness's own judgement of the failing run)",
        f"CHECK = {literal(expect.check_spec(repro), 8)}",
    ]


def assemble(doc: str, imports: set[str], constants: Sequence[str], sources: Sequence[str], main: str,
             needs_cpu: Sequence[str] = ()) -> str:
    """A script: its docstring, imports, constants, the copied-in definitions, ``main`` and the call to it; with
    ``needs_cpu`` (the CPU flags its finding needs) ``NEEDS_CPU`` too, checked before ``main`` runs anything."""
    if needs_cpu:
        constants = ["#: the CPU flags the finding needs: on a CPU without one the script exits CANNOT_SHOW, running nothing",
                     f"NEEDS_CPU = {literal(list(needs_cpu))}", *constants]
    call = "cannot_show(NEEDS_CPU) or main()" if needs_cpu else "main()"
    return "\n".join(["#!/usr/bin/env python3", doc, "from __future__ import annotations", "", import_block(imports),
                      "", "", *constants, "", "", *(f"{source}\n\n" for source in sources), main, "", "",
                      f'if __name__ == "__main__":\n    sys.exit({call})', ""])
