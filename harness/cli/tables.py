"""``harness oracles``, ``harness faults``, ``harness factors``: what the code registers, printed by the code, as text
or as the Markdown tables docs/reference/ holds between ``BEGIN generated`` markers (a test regenerates them)."""
from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence

from harness import oracles, sut
from harness.sut.levels import EngineLevels
from reference_impl.faults import FAULTS, Fault


def markdown(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table (a ``|`` inside a cell escaped)."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(str(cell).replace("|", "\\|") for cell in line) + " |" for line in lines)


def oracle_rows() -> list[list[str]]:
    return [[f"`{name}`", oracle.fails_when] for name, oracle in oracles.oracles().items()]


def _triggers(fault: Fault) -> str:
    return ", ".join(f"`{name}={levels[0]}`" if len(levels) == 1 else f"`{name}∈{{{','.join(map(str, levels))}}}`"
                     for name, levels in fault.triggers.items())


def fault_rows() -> list[list[str]]:
    return [[f"`{fault.name}`", fault.incident, _triggers(fault),
             f"`{fault.oracle}` ({fault.exception})" if fault.exception else f"`{fault.oracle}`"]
            for fault in FAULTS.values()]


def _default(levels: EngineLevels, factor: str) -> str:
    kept = " (kept)" if factor in levels.kept_from_cell else ""
    return f"`{levels.defaults[factor]}`{kept}"


def _levels(levels: EngineLevels, factor: str) -> str:
    """A factor's levels, and each kind of device that refuses some of them, with its reason."""
    refused = "".join(f"; refused on {r.device}: {r.reason}" for r in levels.refusals if r.factor == factor)
    return levels.describe(factor) + refused


def factor_rows(engines: Sequence[str]) -> list[list[str]]:
    """Per engine, each factor in its defaults table's order: its levels and its default (``kept``: the golden cell
    keeps the cell's level)."""
    rows = []
    for name in engines:
        levels = sut.engine(name).levels
        factors = list(levels.defaults) + [f for f in levels.factors or () if f not in levels.defaults]
        rows += [[f"`{name}`", f"`{factor}`", _levels(levels, factor), _default(levels, factor) if factor in
                  levels.defaults else "none"] for factor in factors]
        if levels.factors is None:
            rows.append([f"`{name}`", "any other name", levels.describe(""), "its `[golden]` level (required)"])
    return rows


def cmd_oracles(args: argparse.Namespace) -> int:
    if args.markdown:
        print(markdown(("name", "fails when"), oracle_rows()))
    else:
        for name, oracle in oracles.oracles().items():
            print(f"{name}\n  fails when: {oracle.fails_when}")
    return 0


def cmd_faults(args: argparse.Namespace) -> int:
    if args.markdown:
        print(markdown(("name", "incident", "triggers", "oracle"), fault_rows()))
        return 0
    for fault in FAULTS.values():
        triggers = " and ".join(f"{name} in {{{', '.join(map(str, levels))}}}" for name, levels in fault.triggers.items())
        seen = f"{fault.oracle} ({fault.exception})" if fault.exception else fault.oracle
        print(f"{fault.name}\n  incident: {fault.incident}\n  triggers: {triggers}\n  seen by:  {seen}")
    return 0


def cmd_factors(args: argparse.Namespace) -> int:
    engines = [args.engine] if args.engine else sut.known()
    rows = factor_rows(engines)
    if args.markdown:
        print(markdown(("engine", "factor", "levels", "default"), rows))
    else:
        for engine, factor, levels, default in rows:
            print(f"{engine.strip('`')}: {factor.strip('`')}: {levels.replace('`', '')}; default {default.replace('`', '')}")
    return 0


def add_table_commands(sub: argparse._SubParsersAction) -> None:
    """Add oracles, faults and factors to the ``python -m harness`` parser."""
    for name, handler, text in (("oracles", cmd_oracles, "list the oracles and what fails each"),
                                ("faults", cmd_faults, "list the injectable faults"),
                                ("factors", cmd_factors, "list each engine's factors, their levels and defaults")):
        command = sub.add_parser(name, help=text)
        command.add_argument("--markdown", action="store_true", help="as the Markdown table docs/reference/ holds")
        if name == "factors":
            command.add_argument("--engine", metavar="NAME", help="one engine only (default: every known engine)")
        command.set_defaults(handler=handler)
