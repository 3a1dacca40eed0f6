"""A run as the reports see it: rows, run headers and locate's extra cells, read from one or many report dirs.

A report directory holds ``results.jsonl`` (one row per cell), ``runs.jsonl`` (one header per
invocation that wrote rows there: each shard, each resume) and, after ``harness locate``,
``locate.jsonl`` (the extra cells it ran). Shards merge by cell id; a cell present twice
keeps its last row, and the merge says so.
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.results.files import PROBES, RESULTS, RUNS, SUMMARY
from harness.results.rows import FAILING, STATUSES, LineProblem, as_float, dumps, read_rows, write_atomic


@dataclass(slots=True)
class RunData:
    """Everything one report shows: the rows, the headers of the runs that wrote them, locate's extra cells."""

    rows: list[dict] = field(default_factory=list)
    runs: list[dict] = field(default_factory=list)
    probes: list[dict] = field(default_factory=list)
    problems: list[LineProblem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: cells two inputs both held: (the row replaced, the row kept), in the order met
    replaced: list[tuple[dict, dict]] = field(default_factory=list)


def _header_problem(row: object) -> str | None:
    if not isinstance(row, dict) or not isinstance(row.get("run_id"), str):
        return "a run header must be an object with a string run_id"
    return None


def _results_file(path: Path) -> Path:
    return path / RESULTS if path.is_dir() else path


def load(paths: Sequence[Path]) -> RunData:
    """Read and merge report dirs (or results files, whose runs.jsonl and locate.jsonl sit beside them)."""
    data, where, kept = RunData(), {}, {}
    for path in paths:
        results = _results_file(Path(path))
        if not results.exists():
            raise FileNotFoundError(f"{path}: no {RESULTS} there" if Path(path).is_dir() else f"{path}: no such file")
        read = read_rows(results)
        data.problems += read.problems
        for row, line in zip(read.rows, read.lines):
            if row["cell_id"] in where:
                data.notes.append(f"{row['cell_id']}: in {where[row['cell_id']]} and {results}:{line}; keeping the latter")
                data.replaced.append((kept[row["cell_id"]], row))
            where[row["cell_id"]], kept[row["cell_id"]] = f"{results}:{line}", row
        data.rows = list({r["cell_id"]: r for r in [*data.rows, *read.rows]}.values())
        runs = read_rows(results.parent / RUNS, _header_problem)
        data.problems += runs.problems
        known = {r["run_id"] for r in data.runs}
        data.runs += [r for r in runs.rows if r["run_id"] not in known]
        probes = read_rows(results.parent / PROBES)
        data.problems += probes.problems
        data.probes += probes.rows
    return data


def planned(runs: Sequence[dict], fallback: int) -> int:
    """Cells planned: the latest header of each shard, summed (a resume replans, shards add up)."""
    latest = {}
    for header in runs:
        latest[header.get("shard")] = header.get("cells_planned", 0)
    return sum(latest.values()) if latest else fallback


def summarize(rows: Sequence[dict], runs: Sequence[dict], cells_planned: int, started: float | None = None) -> dict:
    """summary.json: counts per status and per failing oracle, failing cells, accept means, the run headers."""
    first = runs[0] if runs else {}
    counts = Counter(r["status"] for r in rows)
    oracle_failures = Counter(name for r in rows for name, v in r["oracles"].items() if v["verdict"] == "fail")
    return {
        "matrix": first.get("matrix") or (rows[0].get("matrix") if rows else None),
        "mode": first.get("mode"), "strength": first.get("strength"),
        "faults": sorted({f for r in rows for f in r.get("faults", [])}),
        "cells_planned": cells_planned, "cells_done": len(rows),
        "counts": {status: counts.get(status, 0) for status in STATUSES},
        "oracle_failures": dict(sorted(oracle_failures.items())),
        "failing_cells": sorted(r["cell_id"] for r in rows if r["status"] in FAILING),
        "mean_accept_length": _accept_by_spec(rows),
        "wall_seconds": round(time.time() - started, 2) if started else None,
        "runs": list(runs),
    }


def _accept_by_spec(rows: Sequence[dict]) -> dict[str, dict[str, float]]:
    """Mean accept length per spec algorithm and model, averaged over the cells that verified drafts."""
    groups: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        mean = as_float((row.get("metrics") or {}).get("mean_accept_length"))
        if mean is not None:
            spec = str(row["factors"].get("spec", "none"))
            model = str(row["factors"].get("model", "dense"))
            groups.setdefault(spec, {}).setdefault(model, []).append(mean)
    return {spec: {model: round(sum(v) / len(v), 4) for model, v in sorted(models.items())}
            for spec, models in sorted(groups.items())}


def write_summary(directory: Path, summary: dict) -> None:
    """summary.json into ``directory``, atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    write_atomic(directory / SUMMARY, dumps(summary, indent=2) + "\n")
