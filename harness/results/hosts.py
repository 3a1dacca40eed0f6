"""Which host facts lie under a verdict that differs: two rows of one cell (compare's two runs, or two merged inputs
that both held it) each point at the run header that wrote them (``run_id``), and each header records its host
(``machine``, ``harness.sut.host.Host`` as JSON; ``versions``). Where the hosts differ, the differing cell names the
facts (``cpu_flags +amx_tile +amx_int8``, ``llamacpp AMX_INT8 none → 1``); where they are the same it says nothing.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from harness.results.rows import FAILING


def machine_facts(machine: Mapping) -> dict[str, object]:
    """A host record (a header's ``machine``) flat, as ``differences`` compares it: ``cpu_flags`` a tuple in the
    record's order, an engine's facts as "ENGINE NAME", every other value a string or None (there is none: a host
    without a GPU, a driver nvidia-smi did not name); without a GPU its other facts are left out ("gpu none" says it)."""
    card = machine.get("gpu") if isinstance(machine.get("gpu"), Mapping) else None
    facts: dict[str, object] = {"cpu_model": str(machine.get("cpu_model", "")),
                                "cpu_flags": tuple(machine.get("cpu_flags", ())), "cores": str(machine.get("cores", "")),
                                "gpu": None if card is None else str(card.get("name"))}
    if card is not None:
        facts.update({name: None if card.get(key) is None else str(card[key])
                      for name, key in (("gpu_capability", "capability"), ("gpu_driver", "driver"), ("cuda", "cuda"))})
    for engine, found in (machine.get("engine") or {}).items():
        facts.update({f"{engine} {name}": str(value) for name, value in found.items()})
    return facts


def facts_of(header: Mapping) -> dict[str, object]:
    """The host facts a run header records (``machine_facts`` of its ``machine``, and its ``versions``); a header
    written before ``machine`` was recorded gives its ``cpu_flags`` alone, so nothing it lacks is compared."""
    machine = header.get("machine")
    if isinstance(machine, Mapping) and machine:
        facts = machine_facts(machine)
    else:
        flags = header.get("cpu_flags")
        facts = {"cpu_flags": tuple(flags)} if isinstance(flags, list) else {}
    facts.update({name: str(value) for name, value in (header.get("versions") or {}).items()})
    return facts


def differences(base: Mapping[str, object], new: Mapping[str, object]) -> list[str]:
    """How two hosts' facts (``facts_of``) differ, one phrase a fact: ``cpu_flags +amx_tile +amx_int8``,
    ``llamacpp AMX_INT8 none → 1``. A fact one side never recorded (an older header) is not compared; an engine
    fact one build lacks, where both recorded that engine, is ``none``."""
    engines = _engines(base) & _engines(new)
    out = []
    for name in dict.fromkeys([*base, *new]):
        engine, space, _ = name.partition(" ")
        if not (name in base and name in new or space and engine in engines) or base.get(name) == new.get(name):
            continue
        was, now = base.get(name), new.get(name)
        if isinstance(was, tuple) and isinstance(now, tuple):
            if set(was) != set(now):
                out.append(" ".join([name, *(f"+{f}" for f in now if f not in was),
                                     *(f"-{f}" for f in was if f not in now)]))
        else:
            out.append(f"{name} {'none' if was is None else was} → {'none' if now is None else now}")
    return out


def _engines(facts: Mapping[str, object]) -> set[str]:
    """The engines whose facts ``facts`` holds ("ENGINE NAME" keys)."""
    return {name.partition(" ")[0] for name in facts if " " in name}


def host_changes(base: Mapping | None, new: Mapping | None) -> list[str]:
    """The facts two run headers' hosts differ in (``differences``); none where either header is unknown."""
    return [] if base is None or new is None else differences(facts_of(base), facts_of(new))


def by_run(runs: Iterable[Mapping]) -> dict[str, Mapping]:
    """Run headers by run id."""
    return {str(run["run_id"]): run for run in runs if isinstance(run, Mapping) and "run_id" in run}


def row_changes(base_row: Mapping, new_row: Mapping, base_runs: Mapping[str, Mapping],
                new_runs: Mapping[str, Mapping]) -> list[str]:
    """The facts the hosts of two rows of one cell differ in, each row's host being its run header's."""
    return host_changes(base_runs.get(str(base_row.get("run_id"))), new_runs.get(str(new_row.get("run_id"))))


def runs_changes(runs: Sequence[Mapping]) -> list[tuple[str, list[str]]]:
    """Each run header after the first whose host differs from the first's: (its run id, the facts), for a report
    that merged runs from several hosts."""
    return [(str(run.get("run_id")), changes) for run in runs[1:]
            if (changes := host_changes(runs[0], run))]


def verdict(row: Mapping) -> str:
    """A row's verdict as a person compares two: its status, and the oracles that failed it."""
    failing = [name for name, v in row.get("oracles", {}).items() if isinstance(v, Mapping) and v.get("verdict") == "fail"]
    return f"{row['status']} ({', '.join(failing)})" if failing and row["status"] in (*FAILING, "xfail") else str(row["status"])


def differing_cells(pairs: Sequence[tuple[Mapping, Mapping]], runs: Sequence[Mapping]) -> list[dict]:
    """Of the cells two merged inputs both held (the row replaced, the row kept), those whose verdicts differ: the
    cell, both verdicts, both runs, and the host facts those runs differ in (empty: the same host facts)."""
    headers = by_run(runs)
    out = []
    for was, now in pairs:
        if verdict(was) != verdict(now):
            out.append({"cell_id": now["cell_id"], "was": verdict(was), "now": verdict(now),
                        "runs": [was.get("run_id"), now.get("run_id")], "hosts": row_changes(was, now, headers, headers)})
    return out


def differing_text(item: Mapping) -> str:
    """One differing cell as a line: ``cell X: pass → xfail (tokens); hosts differ in cpu_flags +amx_tile``."""
    hosts = f"; hosts differ in {', '.join(item['hosts'])}" if item.get("hosts") else ""
    return f"{item['cell_id']}: {item['was']} → {item['now']}{hosts}"
