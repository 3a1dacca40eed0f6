"""The reference engine's reproducer script: ``reference_impl`` and torch alone, the engine built from an
``EngineConfig`` written out field by field (its model made from its seed inside the engine), the planted fault as the
engine bug, and the one toggled field as ``replace(FAILING, …)``."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import torch

from harness.sut.host import git_commit
from harness.sut.reference import LEVELS, standalone
from harness.sut.reference.engine import build_engine_config
from harness.sut.script.text import Command, assemble, definitions, docstring, literal, toggle_comment, workload_and_check
from harness.sut.script.writer import ScriptInputs, ScriptWriter
from reference_impl import registry
from reference_impl.config import EngineConfig
from reference_impl.faults import FAULTS

#: the repository the script imports ``reference_impl`` from.
ROOT = Path(__file__).resolve().parents[3]


def command(path: Path) -> Command:
    """``python repro.py`` from the script's folder, reference_impl on the path (``install``)."""
    return Command(("python", path.name), {})


def here() -> dict[str, str]:
    """What the script's environment needs on this machine: this checkout on the path."""
    return {"PYTHONPATH": str(ROOT)}


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


def _configs(inputs: ScriptInputs, imports: set[str]) -> tuple[str, str]:
    """The ``FAILING`` config's fields and the ``TOGGLED`` replacement's (the fields the toggle changes)."""
    failing = build_engine_config(inputs.levels, inputs.workload, inputs.faults, inputs.device)
    toggled = build_engine_config(inputs.toggled, inputs.workload, inputs.faults, inputs.device)
    named = {**_named(inputs.levels), **_named(inputs.toggled)}
    changed = [f.name for f in dataclasses.fields(EngineConfig) if getattr(failing, f.name) != getattr(toggled, f.name)]
    fields = ",\n    ".join(_fields(failing, named, imports))
    swaps = ", ".join(f"{name}={_expr(getattr(toggled, name), named, imports)}" for name in changed)
    return fields, swaps


def engine_lines() -> list[str]:
    """The engine's own lines of an environment: reference_impl's commit and torch."""
    return [f"reference_impl of kvmatrix {git_commit(ROOT) or 'unknown commit'}", f"torch {torch.__version__}"]


def data(inputs: ScriptInputs) -> dict:
    """The engine's part of the script's data: the planted faults, and the engine configuration's source (its fields,
    the toggle's replacements, the imports they need)."""
    imports: set[str] = set()
    fields, swaps = _configs(inputs, imports)
    return {"planted": sorted(inputs.faults), "device": inputs.device, "fields": fields, "swaps": swaps,
            "imports": sorted(imports)}


def install(script: Mapping | None) -> list[str]:
    """kvmatrix's checkout on the path: the engine is its reference_impl (whatever the script, or without one)."""
    return [f"export PYTHONPATH={ROOT}"]


def render(finding: Mapping) -> str:
    """The text of a finding's script, from its data."""
    script = finding["script"]
    imports = {"import torch", "from dataclasses import replace", "from reference_impl.config import EngineConfig",
               "from reference_impl.faults import FAULTS", *script["imports"]}
    sources = [definitions(standalone)]
    imports.update(line for lines, _ in sources for line in lines)
    planted = script["planted"]
    incidents = "; ".join(f"{name}: {FAULTS[name].incident}" for name in planted if name in FAULTS)
    doc = docstring(finding, "kvmatrix's reference engine",
                    [f"The engine bug: the fault planted in reference_impl ({incidents or 'none'})."],
                    ["Run it (it imports reference_impl and torch alone; kvmatrix's harness is not needed):",
                     f"  {command(Path('repro.py')).text()}"])
    constants = [
        "#: the engine bug: kvmatrix's reference engine carries each bug it models as a fault, planted by name; a",
        "#: reference_impl that no longer carries it (fixed) plants nothing here.",
        f"PLANTED = frozenset(name for name in {literal(planted)} if name in FAULTS)",
        f"#: the cell's levels, as the engine configuration the harness built for it ({script['device']})",
        f"FAILING = EngineConfig(\n    {script['fields']},\n)",
        toggle_comment(finding["toggle"]),
        f"TOGGLED = replace(FAILING, {script['swaps']})",
        *workload_and_check(script),
    ]
    main = ("def main():\n    print(f\"python {sys.version.split()[0]}, torch {torch.__version__}\")\n"
            "    return reproduce(CHECK, serve(FAILING, ROUNDS), serve(TOGGLED, ROUNDS), SETTING)")
    return assemble(doc, imports, constants, [source for _, source in sources], main, [], install(script),
                    script["needs_cpu"])


WRITER = ScriptWriter("reference", data, render, install, command, engine_lines, here=here)
