"""The reference engine's reproducer script: ``reference_impl`` and torch alone, the engine built from an
``EngineConfig`` written out field by field (its model made from its seed inside the engine), the planted fault as the
engine bug, and the one toggled field as ``replace(FAILING, …)``."""
from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Mapping
from pathlib import Path

import torch

from harness.repro import expect
from harness.repro.finding import Reproducer
from harness.repro.scripts.text import Command, definitions, environment, import_block, literal, rounds_literal
from harness.repro.standalone import checks, reference as standalone
from harness.results.header import git_commit
from harness.sut.reference import LEVELS
from harness.sut.reference.engine import build_engine_config
from reference_impl import registry
from reference_impl.config import EngineConfig
from reference_impl.faults import FAULTS

#: the repository the script imports ``reference_impl`` from.
ROOT = Path(__file__).resolve().parents[3]


def command(path: Path) -> Command:
    """``PYTHONPATH=<the repository> python <path>``: reference_impl from this checkout."""
    return Command(("python", str(path)), {"PYTHONPATH": str(ROOT)})


def _named(levels: Mapping[str, object]) -> dict[int, str]:
    """id of each implementation the levels resolve to → the ``module:attribute`` path that names it."""
    named = {}
    for factor, level in LEVELS.full(levels).items():
        if factor in registry.COMPONENTS and isinstance(level, str):
            path = registry.COMPONENTS[factor].get(level, level)
            named[id(registry.import_path(path))] = path
    return named


def _expr(value: object, named: dict[int, str], imports: set[str]) -> str:
    """``value`` as source, its import added to ``imports``."""
    if isinstance(value, torch.dtype):
        imports.add("import torch")
        return str(value)
    if id(value) in named:
        module, _, attribute = named[id(value)].partition(":")
        imports.add(f"from {module} import {attribute}")
        return attribute
    if isinstance(value, type):
        imports.add(f"from {value.__module__} import {value.__qualname__}")
        return value.__qualname__
    return repr(value)


def _fields(config: EngineConfig, named: dict[int, str], imports: set[str]) -> list[str]:
    """``name=value`` of every field the engine needs or the cell set off its default (the faults as ``PLANTED``)."""
    out = []
    for field in dataclasses.fields(EngineConfig):
        value = getattr(config, field.name)
        required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        if field.name == "faults":
            out += ["faults=PLANTED"] if value else []
        elif required or value != field.default:
            out.append(f"{field.name}={_expr(value, named, imports)}")
    return out


def _configs(repro: Reproducer, imports: set[str]) -> tuple[str, str]:
    """The ``FAILING`` config's fields and the ``TOGGLED`` replacement's (the fields the toggle changes)."""
    workload, plan = repro.shrunk.workload, repro.plan
    failing = build_engine_config(plan.levels, workload, plan.faults, repro.device)
    toggled = build_engine_config(repro.toggled_levels, workload, plan.faults, repro.device)
    named = {**_named(plan.levels), **_named(repro.toggled_levels)}
    changed = [f.name for f in dataclasses.fields(EngineConfig) if getattr(failing, f.name) != getattr(toggled, f.name)]
    fields = ",\n    ".join(_fields(failing, named, imports))
    swaps = ", ".join(f"{name}={_expr(getattr(toggled, name), named, imports)}" for name in changed)
    return fields, swaps


def engine_lines() -> list[str]:
    """The engine's own lines of an environment: reference_impl's commit and torch."""
    return [f"reference_impl of kvmatrix {git_commit(ROOT) or 'unknown commit'}", f"torch {torch.__version__}"]


def _header(repro: Reproducer, path: Path) -> str:
    toggle, check, header = repro.toggle, repro.check, repro.header
    planted = "; ".join(f"{name}: {FAULTS[name].incident}" for name in sorted(repro.plan.faults) if name in FAULTS)
    prose = [
        f"Cell {repro.row['cell_id']} of matrix {header.get('matrix', '?')} (run {header.get('run_id', '?')}), its "
        f"workload {repro.shrunk.workload.name.removesuffix('.shrunk')} shrunk while the check still failed: "
        f"{repro.shrunk.text()}.",
        f"The engine bug: the fault planted in reference_impl ({planted or 'none'}).",
        f"Written by: {repro.command()}",
    ]
    lines = [
        f"Reproducer: {check.text()} fails with {toggle.factor}={toggle.level}, passes with {toggle.factor}="
        f"{toggle.golden} (kvmatrix's reference engine).", "",
        *(wrapped for line in prose for wrapped in textwrap.wrap(line, 110, subsequent_indent="  ")), "",
        "Environment it was written in:", *(f"  {line}" for line in environment(*engine_lines())),
        "Run it (it imports reference_impl and torch alone; kvmatrix's harness is not needed):",
        f"  {command(path).text()}",
        "Exit status: 1 while the bug is present, 0 once fixed, 2 when a run raised something the finding did not",
        "record.",
    ]
    return '"""' + "\n".join(lines) + '\n"""'


def script(repro: Reproducer, path: Path) -> str:
    """The text of ``repro``'s script, to be written at ``path``."""
    imports = {"import sys", "import torch", "from dataclasses import replace",
               "from reference_impl.config import EngineConfig", "from reference_impl.faults import FAULTS"}
    fields, swaps = _configs(repro, imports)
    check_imports, check_source = definitions(checks)
    serve_imports, serve_source = definitions(standalone)
    imports.update(check_imports + serve_imports)
    rounds = [[(r.rid, r.prompt, r.max_new_tokens, r.priority) for r in group]
              for group in repro.shrunk.workload.rounds()]
    toggle = repro.toggle
    planted = sorted(repro.plan.faults)
    parts = [
        "#!/usr/bin/env python3", _header(repro, path), "from __future__ import annotations", "",
        import_block(imports), "", "",
        "#: the engine bug: kvmatrix's reference engine carries each bug it models as a fault, planted by name; a",
        "#: reference_impl that no longer carries it (fixed) plants nothing here.",
        f"PLANTED = frozenset(name for name in {literal(planted)} if name in FAULTS)",
        f"#: the cell's levels, as the engine configuration the harness built for it ({repro.device})",
        f"FAILING = EngineConfig(\n    {fields},\n)",
        f"#: the one toggled setting: {toggle.factor} {toggle.level} → {toggle.golden} (its golden level)",
        f"TOGGLED = replace(FAILING, {swaps})",
        f"SETTING = {literal(f'{toggle.factor}={toggle.level}')}",
        "#: the shrunk workload, served cold then warm: rounds of (request id, prompt token ids, max_new_tokens,",
        "#: priority)",
        f"ROUNDS = {rounds_literal(rounds)}",
        "#: the check that fails, and what it needs (from the harness's own judgement of the failing run)",
        f"CHECK = {literal(expect.check_spec(repro), 8)}", "", "",
        check_source, "", "", serve_source, "", "",
        "def main():\n    print(f\"python {sys.version.split()[0]}, torch {torch.__version__}\")\n"
        "    return reproduce(CHECK, serve(FAILING, ROUNDS), serve(TOGGLED, ROUNDS), SETTING)",
        "", "", 'if __name__ == "__main__":\n    sys.exit(main())', "",
    ]
    return "\n".join(parts)

