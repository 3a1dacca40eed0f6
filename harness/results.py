"""Results on disk: results.jsonl streamed one line per finished cell, summary.json and index.html.

Several processes (pytest-xdist workers, shards) may append to one directory: every write
happens under an exclusive lock, and summary.json and index.html are rebuilt from the
whole results.jsonl after each cell, so a killed run leaves a consistent, resumable record.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from harness.runner import CellResult
from reports.html import write_index

STATUSES = ("pass", "fail", "error", "skip")


@dataclass(slots=True)
class RunInfo:
    """What identifies a run: the matrix, how it was generated and which faults were injected."""

    matrix: str
    mode: str
    strength: int | None
    faults: list[str]
    cells_planned: int
    started: float = field(default_factory=time.time)


def read_records(path: Path) -> list[dict]:
    """Every complete line of a results.jsonl; a torn last line (killed writer) is ignored."""
    records = []
    if not path.exists():
        return records
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def summarize(records: list[dict], info: RunInfo) -> dict:
    """summary.json: counts per status and per failing oracle, for the records of this run."""
    counts = Counter(r["status"] for r in records)
    oracle_failures = Counter(
        name for r in records for name, v in r.get("oracles", {}).items() if v["verdict"] == "fail"
    )
    return {
        "matrix": info.matrix, "mode": info.mode, "strength": info.strength, "faults": info.faults,
        "cells_planned": info.cells_planned, "cells_done": len(records),
        "counts": {status: counts.get(status, 0) for status in STATUSES},
        "oracle_failures": dict(sorted(oracle_failures.items())),
        "failing_cells": sorted(r["cell_id"] for r in records if r["status"] in ("fail", "error")),
        "mean_accept_length": _accept_by_spec(records),
        "wall_seconds": round(time.time() - info.started, 2),
    }


def _accept_by_spec(records: list[dict]) -> dict[str, dict[str, float]]:
    """Mean accept length per spec algorithm and model, averaged over the cells that verified drafts."""
    groups: dict[str, dict[str, list[float]]] = {}
    for record in records:
        mean = (record.get("metrics") or {}).get("mean_accept_length")
        if mean is not None:
            spec = str(record["factors"].get("spec", "none"))
            model = str(record["factors"].get("model", "dense"))
            groups.setdefault(spec, {}).setdefault(model, []).append(mean)
    return {spec: {model: round(sum(v) / len(v), 4) for model, v in sorted(models.items())}
            for spec, models in sorted(groups.items())}


class ResultsStore:
    """The report directory of one run."""

    def __init__(self, report_dir: Path, info: RunInfo) -> None:
        self.dir = Path(report_dir)
        self.info = info
        self.results_path = self.dir / "results.jsonl"
        self.summary_path = self.dir / "summary.json"
        self.index_path = self.dir / "index.html"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def start(self, resume: bool, planned: set[str]) -> set[str]:
        """Begin the run; with ``resume``, keep this run's finished ``planned`` cells and return their ids."""
        with self._locked():
            records = read_records(self.results_path) if resume else []
            kept = [r for r in records if self._same_run(r) and r["cell_id"] in planned]
            self._write_lines(kept)
            self._refresh(kept)
        return {r["cell_id"] for r in kept}

    def add(self, result: CellResult) -> None:
        """Append one finished cell and rebuild summary.json and index.html."""
        line = json.dumps(result.to_json(), default=str) + "\n"
        with self._locked():
            with open(self.results_path, "a", encoding="utf-8") as out:
                out.write(line)
                out.flush()
                os.fsync(out.fileno())
            self._refresh(read_records(self.results_path))

    def summary(self) -> dict:
        with self._locked():
            return summarize(read_records(self.results_path), self.info)

    def _same_run(self, record: dict) -> bool:
        return record.get("matrix") == self.info.matrix and sorted(record.get("faults", [])) == sorted(self.info.faults)

    def _write_lines(self, records: list[dict]) -> None:
        tmp = self.results_path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in records), encoding="utf-8")
        tmp.replace(self.results_path)

    def _refresh(self, records: list[dict]) -> None:
        summary = summarize(records, self.info)
        tmp = self.summary_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        tmp.replace(self.summary_path)
        write_index(self.index_path, records, summary)
