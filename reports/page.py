"""The index page's view model: what fails (located), the grid, failures grouped, every cell with its metrics.

Everything here is data for ``templates/index.html``; nothing is HTML. Every field that came
from a results file stays a plain value and is escaped by the template (autoescape is on).
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from harness.results.locate import analyze, error_class
from harness.results.header import REPRO_STATUSES, repro_command, reproduce_command
from harness.results.hosts import runs_changes
from harness.results.rows import as_float, dumps, error_line
from reports import evidence
from reports.boundary import boundary_cells
from reports.grid import grid

STATUS_ORDER = {"error": 0, "fail": 1, "xpass": 2, "xfail": 3, "pass": 4, "skip": 5}
#: the statuses whose cells get an evidence box: what fails the run, and the declared failures (xfail).
SHOWN_STATUSES = ("fail", "error", "xpass", "xfail")
SHOWN_FINDINGS = 5
#: above this many cells the passing ones start folded away: a closed <details> is parsed but not laid
#: out, which keeps a 5,000-cell page quick to open (BENCHMARKS.md, bench_report.py).
OPEN_TABLE_LIMIT = 1000
HEADER_FIELDS = ("matrix", "matrix_file", "matrix_sha256", "accepted_changes", "mode", "strength", "faults", "device",
                 "device_name", "cpu_model", "cpu_flags", "cores", "gpu", "engine", "engine_version", "engine_build",
                 "shard", "cells_planned", "commit", "date", "host", "versions", "command", "run_id")


def anchors(cell_ids: Sequence[str]) -> dict[str, str]:
    """A unique, URL-safe ``id`` per cell: ``cell-`` and the cell id with anything unusual as ``_``."""
    out, used = {}, set()
    for cell_id in cell_ids:
        base = "cell-" + re.sub(r"[^A-Za-z0-9_.:+-]", "_", cell_id)
        anchor, n = base, 1
        while anchor in used:
            n += 1
            anchor = f"{base}~{n}"
        used.add(anchor)
        out[cell_id] = anchor
    return out


def failing_oracles(row: Mapping) -> list[str]:
    """The oracles that failed ``row``, in the order the row lists them (the order they are registered in)."""
    return [n for n, v in row["oracles"].items() if v["verdict"] == "fail"]


def signature(row: Mapping) -> tuple:
    """Rows with equal signatures failed identically: same oracles with the same messages, or the same error."""
    return (row["status"], tuple((n, row["oracles"][n].get("message", "")) for n in failing_oracles(row)),
            error_line(row.get("error")))


def _header_of(row: Mapping, runs: Mapping[str, Mapping]) -> Mapping:
    return runs.get(row.get("run_id", ""), {}) or {
        "matrix": row.get("matrix"), "faults": row.get("faults", []), "device": row.get("device", "cpu")}


def row_ids(cell_ids: Sequence[str]) -> dict[str, str]:
    """The table row of each cell: ``r`` and its position (short: the table is most of a 5,000-cell page)."""
    return {cell_id: f"r{i}" for i, cell_id in enumerate(cell_ids)}


def repro_line(row: Mapping, report_dir: str) -> str | None:
    """The ``harness repro`` command of a cell it writes a reproducer for (failed, raised, failed as declared)."""
    return repro_command(report_dir, row["cell_id"]) if row["status"] in REPRO_STATUSES else None


def cell_evidence(row: Mapping, header: Mapping, anchor: str, row_id: str, report_dir: str,
                  kinds: Mapping[str, str]) -> dict:
    """One failing cell: its anchor, the commands that rerun it and reproduce it standalone, each failing oracle's
    evidence view (the kind its declaration names in ``kinds``), the raw JSON."""
    return {
        "row": row, "anchor": anchor, "row_id": row_id, "reproduce": reproduce_command(header, row["cell_id"]),
        "repro": repro_line(row, report_dir),
        "oracles": [{"name": n, "message": row["oracles"][n].get("message", ""),
                     "view": evidence.views(kinds.get(n), row["oracles"][n].get("detail", []))}
                    for n in failing_oracles(row)],
        "raw": dumps(row, indent=1),
    }


def groups(rows: Sequence[Mapping], runs: Mapping[str, Mapping], ids: Mapping[str, str],
           table: Mapping[str, str], report_dir: str, kinds: Mapping[str, str]) -> list[dict]:
    """Failing cells grouped by signature, largest group first; the first cell of each shows the full evidence."""
    by_sig: dict[tuple, list[Mapping]] = {}
    for row in rows:
        if row["status"] in SHOWN_STATUSES:
            by_sig.setdefault(signature(row), []).append(row)
    out = []
    for sig, members in sorted(by_sig.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        first = members[0]
        out.append({
            "status": sig[0], "oracles": [n for n, _ in sig[1]], "error": sig[2], "size": len(members),
            "expected": first.get("expected"),
            "representative": cell_evidence(first, _header_of(first, runs), ids[first["cell_id"]], table[first["cell_id"]],
                                            report_dir, kinds),
            "members": [{"row": m, "anchor": ids[m["cell_id"]], "reproduce": reproduce_command(_header_of(m, runs), m["cell_id"]),
                         "repro": repro_line(m, report_dir)} for m in members[1:]],
        })
    return out


#: the declared known failures' classes (``[[expected]] class``), as the page heads them, engine findings first
DECLARED_CLASSES = {"engine bug": "Engine findings", "harness limitation": "Harness limitations",
                    None: "Not yet triaged"}


def declared(rows: Sequence[Mapping]) -> list[dict]:
    """The declared known failures the cells matched, per class (engine findings apart from harness limitations):
    each declaration once per matrix, with its upstream status, the cells it matched, how those ended and the
    findings it excused."""
    found: dict[tuple, dict] = {}
    for row in rows:
        for entry in (row.get("expected") or {}).get("declarations") or []:
            if not isinstance(entry, Mapping):
                continue
            number = entry.get("number")
            item = found.setdefault((str(row.get("matrix", "")), number), {
                "matrix": row.get("matrix", ""), "entry": entry, "cells": 0, "statuses": {}, "excused": 0})
            item["cells"] += 1
            item["statuses"][row["status"]] = item["statuses"].get(row["status"], 0) + 1
            item["excused"] += sum(int((v.get("excused") or {}).get(str(number), 0)) for v in row["oracles"].values()
                                   if isinstance(v, Mapping))
    kinds = {kind: [i for i in found.values() if i["entry"].get("class") == kind] for kind in DECLARED_CLASSES}
    return [{"title": DECLARED_CLASSES[kind], "kind": kind, "items": items} for kind, items in kinds.items() if items]


def _metric(row: Mapping, key: str) -> float | None:
    return as_float((row.get("metrics") or {}).get(key))


def cell_rows(rows: Sequence[Mapping], factors: Sequence[str], levels: Mapping[str, list], oracles: Sequence[str],
              ids: Mapping[str, str], table: Mapping[str, str]) -> list[dict]:
    """The cells table: every cell with its status, levels, failing oracles and metric columns; filter classes."""
    out = []
    for row in sorted(rows, key=lambda r: (STATUS_ORDER.get(r["status"], 9), r["cell_id"])):
        failing = failing_oracles(row) + ([f"error: {error_class(row)}"] if row["status"] == "error" else [])
        classes = [f"s-{row['status']}"] + [f"o{oracles.index(n)}" for n in failing if n in oracles]
        classes += [f"f{i}-{levels[f].index(row['factors'][f])}" for i, f in enumerate(factors) if f in row["factors"]]
        tiers = (row.get("metrics") or {}).get("cached_tokens_warm_by_tier") or {}
        changes = (row.get("metrics") or {}).get("applied_changes") or []
        out.append({"row": row, "anchor": ids[row["cell_id"]], "row_id": table[row["cell_id"]], "failing": failing,
                    "changes": "; ".join(map(str, changes)) if isinstance(changes, list) else "",
                    "classes": " ".join(classes),
                    "accept": _metric(row, "mean_accept_length"), "cached": _metric(row, "cached_tokens_warm"),
                    "tiers": ", ".join(f"{k} {v}" for k, v in tiers.items()) if isinstance(tiers, Mapping) else "",
                    "engine": _metric(row, "engine_seconds"), "wall": _metric(row, "wall_seconds")})
    return out


def filter_css(factors: Sequence[str], levels: Mapping[str, list], oracles: Sequence[str]) -> str:
    """CSS rules for the filter radios: a checked radio hides the rows without its class (``:has``, no script)."""
    names = [("s", s) for s in STATUS_ORDER] + [("o", str(i)) for i in range(len(oracles))]
    names += [("f", f"{i}-{j}") for i, f in enumerate(factors) for j in range(len(levels[f]))]
    rules = []
    for kind, value in names:
        css_class = f"s-{value}" if kind == "s" else f"{kind}{value}"
        rules.append(f"#cells:has(#flt-{css_class}:checked) tbody tr:not(.{css_class}){{display:none}}")
    return "\n".join(rules) + "\n"


def shown_run(header: Mapping) -> dict:
    """A run header as the Run table shows it: its host record (``machine``) spread into ``cpu_model``, ``cores``,
    ``gpu`` (name, compute capability, driver, CUDA) and ``engine_build`` (the engine's version and build facts)."""
    machine = header.get("machine") if isinstance(header.get("machine"), Mapping) else {}
    if not machine:
        return dict(header)
    card = machine.get("gpu") if isinstance(machine.get("gpu"), Mapping) else None
    gpu = None if card is None else ", ".join(
        [str(card.get("name")), *(f"{what} {card[key]}" for what, key in (("compute", "capability"), ("driver", "driver"),
                                                                           ("CUDA", "cuda")) if card.get(key))])
    engines = machine.get("engine") or {}
    build = {(name if len(engines) == 1 else f"{engine} {name}"): value
             for engine, facts in engines.items() for name, value in facts.items()}
    return {**header, "cpu_model": machine.get("cpu_model"), "cores": machine.get("cores"), "gpu": gpu,
            "engine_build": build}


def index_context(rows: Sequence[Mapping], summary: Mapping, probes: Sequence[Mapping] = (),
                  report_dir: str = "DIR", *, kinds: Mapping[str, str]) -> dict:
    """Everything the index template draws; ``report_dir`` is where the page and its results.jsonl lie (the
    directory ``harness repro`` reads), ``kinds`` the view each oracle declares for its findings (oracle name →
    a key of ``evidence.KINDS``: ``harness.oracles.evidence_kinds()``)."""
    runs = {r["run_id"]: r for r in summary.get("runs", []) if isinstance(r, Mapping) and "run_id" in r}
    factors: list[str] = list(dict.fromkeys(f for r in rows for f in r["factors"]))
    levels = {f: list(dict.fromkeys(r["factors"][f] for r in rows if f in r["factors"])) for f in factors}
    oracles = list(dict.fromkeys(n for r in rows for n in r["oracles"]))  # as the rows list them
    ids = anchors([r["cell_id"] for r in rows])
    table = row_ids([r["cell_id"] for r in rows])
    classes = analyze(rows, probes)
    return {
        "summary": summary, "runs": [shown_run(r) for r in runs.values()], "header_fields": HEADER_FIELDS,
        "host_changes": runs_changes(list(runs.values())), "differing": summary.get("differing_cells") or [],
        "classes": classes,
        "shown_findings": SHOWN_FINDINGS, "open_table_limit": OPEN_TABLE_LIMIT, "grid": grid(rows), "groups": groups(rows, runs, ids, table, report_dir, kinds), "ids": ids, "rows_ids": table,
        "probes": probes, "probes_run": sum(not (p.get("probe") or {}).get("reused") for p in probes), "factors": factors, "levels": levels, "oracles": oracles,
        "cells": cell_rows(rows, factors, levels, oracles, ids, table), "declared": declared(rows),
        "boundary": boundary_cells(rows, table),
    }
