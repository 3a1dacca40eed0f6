"""The parts every reproducer script shares: the standalone modules' definitions copied in, their imports, literals
laid out for reading, the shrink in words, and the environment the script was written in."""
from __future__ import annotations

import ast
import inspect
import platform
import pprint
import shlex
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType

from harness.sut import host
from harness.sut.host import kernel_flags
from harness.sut.script import checks
from harness.sut.vllm_common import nixl


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
    """What every script copies in to judge its check: ``checks`` and the rules it calls."""
    return [definitions(checks), definitions(nixl, ["nixl_bytes"]), definitions(host, ["flags_of", "_field"])]


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


def exits(needs_cpu: Sequence[str], more: Sequence[str] = ()) -> list[str]:
    """The docstring's exit statuses, wrapped: 1, 0 and ``CANNOT_JUDGE`` with the reasons every script has, the CPU
    flags the finding needs, and ``more`` (a writer's own reasons)."""
    reasons = ["a package it needs missing", *([f"a CPU without {' '.join(needs_cpu)}"] if needs_cpu else []), *more,
               "an engine that would not start or a run that raised what the finding did not record"]
    text = (f"Exit status: 1 while the bug is present, 0 once fixed, {checks.CANNOT_JUDGE} when it cannot be judged "
            f"here ({', '.join(reasons)}), with one line on stderr saying which ({checks.CANNOT_JUDGE_LINE} ...).")
    return textwrap.wrap(text, 110)


def shrink_text(shrink: Mapping) -> str:
    """A shrink as ``Shrunk.to_json`` (or a finding.json) holds it, as one line."""
    names = {"requests": "requests", "rounds": "rounds", "prompt_tokens": "prompt tokens",
             "decoded_tokens": "decoded tokens"}
    sizes = ", ".join(f"{text} {shrink['before'][key]} → {shrink['after'][key]}" for key, text in names.items())
    return f"{sizes}; {shrink['runs']} of {shrink['budget']} runs"


def docstring(finding: Mapping, engine: str, notes: Sequence[str], run: Sequence[str],
              more_exits: Sequence[str] = ()) -> str:
    """A script's docstring: what fails with which setting on ``engine``, the cell it came from and its shrink (then
    ``notes``), the environment it was verified in, how to run it (``run``), its exits (the writer's own
    ``more_exits`` among them)."""
    toggle, script = finding["toggle"], finding["script"]
    prose = [
        f"Cell {finding['cell_id']} of matrix {finding['matrix']} (run {finding['run_id']}), its workload "
        f"{finding['workload'].removesuffix('.shrunk')} shrunk while the check still failed: "
        f"{shrink_text(finding['shrink'])}.", *notes,
        f"Written by: {finding['command']}",
    ]
    lines = [
        f"Reproducer: {finding['check']} fails with {toggle['factor']}={toggle['level']}, passes with "
        f"{toggle['factor']}={toggle['golden']} ({engine}).", "",
        *(wrapped for line in prose for wrapped in textwrap.wrap(line, 110, subsequent_indent="  ")), "",
        "Environment it was verified in:", *(f"  {line}" for line in finding["environment"]), *run,
        *exits(script["needs_cpu"], more_exits),
    ]
    return '"""' + "\n".join(lines) + '\n"""'


def toggled_to(toggle: Mapping) -> str:
    """What the level a finding toggles to is: the factor's golden level, or one ``repro --toggle`` asked for."""
    return "the level asked for" if toggle.get("asked") else "its golden level"


def toggle_comment(toggle: Mapping) -> str:
    """The comment above ``TOGGLED``."""
    to = f"{toggle['golden']} ({toggled_to(toggle)})"
    return f"#: the one toggled setting: {toggle['factor']} {toggle['level']} → {to}"


def workload_and_check(script: Mapping) -> list[str]:
    """``SETTING``, ``ROUNDS`` (the shrunk workload) and ``CHECK``: the constants every script ends its own with."""
    rounds = [[(rid, tuple(prompt), n, priority) for rid, prompt, n, priority in group] for group in script["rounds"]]
    return [
        f"SETTING = {literal(script['setting'])}",
        "#: the shrunk workload, served cold then warm: rounds of (request id, prompt token ids, max_new_tokens,",
        "#: priority)",
        f"ROUNDS = {rounds_literal(rounds)}",
        "#: the check that fails, and what it needs (from the harness's own judgement of the failing run)",
        f"CHECK = {literal(script['check'], 8)}",
    ]


def _stdlib(line: str) -> bool:
    """Whether an import line imports from the standard library."""
    return line.split()[1].split(".")[0] in sys.stdlib_module_names


def assemble(doc: str, imports: set[str], constants: Sequence[str], sources: Sequence[str], main: str,
             requires: Sequence[str], install: Sequence[str], needs_cpu: Sequence[str]) -> str:
    """A script: its docstring; the standard library's imports; what it needs (``REQUIRES``: the modules beside the
    standard library its ``imports`` name, and ``requires``), how to install them, the CPU flags its finding needs;
    the checks (the standard library alone), called on those before anything else is imported, so that a missing
    package or flag exits ``CANNOT_JUDGE`` with its line (never 1); then the other imports, ``constants``, the
    copied-in ``sources``, ``main`` and its call, an exception of the script's own exiting ``CANNOT_JUDGE`` too."""
    imports = {*imports, "import sys", *(line for lines, _ in check_definitions() for line in lines)}
    engine_imports = sorted(line for line in imports if not _stdlib(line))
    modules = list(dict.fromkeys([*(line.split()[1].split(".")[0] for line in engine_imports), *requires]))
    gate = [
        "#: what this script needs beside the standard library, and the lines that install it",
        f"REQUIRES = {literal(modules)}",
        f"INSTALL = {literal(' && '.join(install), 10)}",
        "#: the CPU flags the finding needs: on a CPU without one nothing run there can show it",
        f"NEEDS_CPU = {literal(list(needs_cpu))}",
    ]
    checks_source = [source for _, source in check_definitions()]
    return "\n".join([
        "#!/usr/bin/env python3", doc, "from __future__ import annotations", "",
        import_block({line for line in imports if _stdlib(line)}), "", "", *gate, "", "",
        *(f"{source}\n\n" for source in checks_source),
        "require(REQUIRES, INSTALL, NEEDS_CPU)  # exits 2 with one line (never 1) where the bug cannot be judged",
        *([import_block(set(engine_imports))] if engine_imports else []), "", "",
        *constants, "", "", *(f"{source}\n\n" for source in sources), main, "", "",
        'if __name__ == "__main__":\n    sys.exit(judged(main))', ""])
