"""Results on disk: results.jsonl streamed one line per finished cell, runs.jsonl, summary.json and index.html.

Several processes (pytest-xdist workers, shards of one run) may write to one directory:
every write happens under an exclusive lock, a run only ever replaces the rows of the cells it
is about to run (another shard's rows stay), and summary.json and index.html are rebuilt from
the whole directory. A line that cannot be read is never dropped in silence: it is named on
stderr and moved to results.rejected.jsonl. A killed run leaves a consistent, resumable record.
"""
from __future__ import annotations

import fcntl
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from harness.results.files import INDEX, LOCK, REJECTED, RESULTS, RUNS, SUMMARY
from harness.results.header import RunHeader, changed_since
from harness.results.reader import load, planned, summarize, write_summary
from harness.results.rows import CellResult, dumps, read_rows, write_lines

#: draws the report page from a directory's rows, summary and probes (``reports.html.write_report``): the
#: entry points hand it in, so the record never depends on how it is shown.
Render = Callable[[Path, Sequence[dict], dict, Sequence[dict]], None]
#: re-render the page after a cell only when this many render-times have passed since the last:
#: the page costs at most 1/REFRESH_RATIO of the run, even at thousands of cells.
REFRESH_RATIO = 10


def _short_hashes(text: str) -> str:
    """A change as a person reads it: SHA-256 digests cut to their first 12 hex digits."""
    return re.sub(r"\b([0-9a-f]{12})[0-9a-f]{52}\b", r"\1…", text)


@dataclass(slots=True)
class RunInfo:
    """What identifies a run: the matrix, how it was generated and which faults were injected."""

    matrix: str
    mode: str
    strength: int | None
    faults: list[str]
    cells_planned: int
    started: float = field(default_factory=time.time)
    header: RunHeader | None = None
    device: str = "cpu"


class ResumeRefused(ValueError):
    """``--resume`` onto a run that changed since (matrix file, faults, strength, device, engine version)."""


def warn(message: str) -> None:
    """A warning on stderr, one line."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


class ResultsStore:
    """The report directory of one run (or of one shard of it)."""

    def __init__(self, report_dir: Path, info: RunInfo, render: Render | None = None,
                 warn: Callable[[str], None] = warn) -> None:
        self.dir = Path(report_dir)
        self.info = info
        self.render = render
        self.warn = warn
        self.results_path = self.dir / RESULTS
        self.summary_path = self.dir / SUMMARY
        self.index_path = self.dir / INDEX
        self._last_refresh = 0.0
        self._render_seconds = 0.0
        self._added: set[str] = set()
        self._accepted_identity = False  # --accept-changed kept rows of other faults or another device

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def start(self, resume: bool, planned: set[str], accept_changed: bool = False) -> set[str]:
        """Begin the run: replace the rows of the ``planned`` cells (with ``resume``, keep and return those).

        ``resume`` onto a run whose header differs in a ``RESUME_FIELDS`` field raises ``ResumeRefused`` naming
        the change, unless ``accept_changed``: then the rows are kept and this run's header records the change."""
        with self._locked():
            if resume:
                self._check_resumed(accept_changed)
            read = read_rows(self.results_path)
            if read.problems:
                self._reject(read.problems)
            kept, done, other_runs = [], set(), 0
            for row in read.rows:
                if not self._same_run(row):
                    other_runs += 1
                elif row["cell_id"] not in planned:
                    kept.append(row)  # another shard's (or another selection's) cell
                elif resume:
                    kept.append(row)
                    done.add(row["cell_id"])
            if other_runs:
                self.warn(f"{self.results_path}: {other_runs} row(s) of another run (not matrix {self.info.matrix} with "
                          f"faults {self.info.faults or 'none'} on {self.info.device}) replaced by this run")
            if read.rows or read.problems:
                write_lines(self.results_path, kept)
            if self.info.header is not None:
                self._append(self.dir / RUNS, dumps(self.info.header.to_json()) + "\n")
            self._refresh()
        return done

    def _check_resumed(self, accept_changed: bool) -> None:
        """Compare this run's header with the latest recorded one of the same matrix and shard (the run resumed)."""
        header = self.info.header
        if header is None:
            return
        recorded = [r for r in read_rows(self.dir / RUNS, lambda r: None if isinstance(r, dict) else "not an object").rows
                    if r.get("matrix") == header.matrix and r.get("shard") == header.shard]
        changes = changed_since(recorded[-1], header) if recorded else {}
        if changes and not accept_changed:
            shown = "; ".join(f"{name} {_short_hashes(change)}" for name, change in changes.items())
            raise ResumeRefused(f"--resume: the run in {self.dir} changed since: {shown}; run without --resume to start "
                                f"afresh, or add --accept-changed to keep its rows anyway")
        header.accepted_changes = changes
        if changes.keys() & {"faults", "device"}:
            self._accepted_identity = True  # the rows kept were made with the faults or on the device recorded

    def add(self, result: CellResult) -> None:
        """Append one finished cell; rebuild summary.json and index.html unless that was done very recently."""
        row = result.to_json()
        if self.info.header is not None:
            row["run_id"] = self.info.header.run_id
        row["device"] = self.info.device
        with self._locked():
            self._append(self.results_path, dumps(row) + "\n")
            self._added.add(result.cell_id)
            if time.perf_counter() - self._last_refresh >= REFRESH_RATIO * self._render_seconds:
                self._refresh()

    def finish(self, order: Sequence[str] = ()) -> dict:
        """Rebuild summary.json and index.html from the whole directory and return the summary.

        ``order``: the run's cell ids in cell order. Rows this store added in another order (cells
        run side by side end out of order) are put back in it, in the places they hold, so the file
        is what a serial run writes; every other row stays where it is.
        """
        with self._locked():
            if order and self._added:
                self._reorder(order)
            return self._refresh()

    def _reorder(self, order: Sequence[str]) -> None:
        read = read_rows(self.results_path)
        if read.problems:
            return  # never rewrite a file with lines it cannot read; start() of the next run deals with them
        rank = {cell_id: i for i, cell_id in enumerate(order)}
        ours = [i for i, row in enumerate(read.rows) if row["cell_id"] in self._added and row["cell_id"] in rank]
        ranked = sorted((read.rows[i] for i in ours), key=lambda row: rank[row["cell_id"]])
        if [read.rows[i] for i in ours] == ranked:
            return
        rows = list(read.rows)
        for place, row in zip(ours, ranked):
            rows[place] = row
        write_lines(self.results_path, rows)

    def _same_run(self, row: dict) -> bool:
        return row.get("matrix") == self.info.matrix and (self._accepted_identity or (
            sorted(row.get("faults", [])) == sorted(self.info.faults) and row.get("device", self.info.device) == self.info.device))

    def _reject(self, problems: list) -> None:
        """Name every unreadable line and move it, as it was, to results.rejected.jsonl."""
        for problem in problems:
            self.warn(str(problem) if not problem.skipped else f"{problem.path}:{problem.line}: {problem.reason}; "
                      f"moved to {self.dir / REJECTED}")
        self._append(self.dir / REJECTED, "".join(p.text + "\n" for p in problems if p.skipped))

    @staticmethod
    def _append(path: Path, text: str) -> None:
        with open(path, "a", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())

    def _refresh(self) -> dict:
        started = time.perf_counter()
        data = load([self.dir]) if self.results_path.exists() else None
        rows = data.rows if data else []
        runs = [r for r in (data.runs if data else []) if self.info.header is None or r["run_id"] != self.info.header.run_id]
        if self.info.header is not None:
            self.info.header.cells_planned = self.info.cells_planned
            runs.append(self.info.header.to_json())
        seen = {r.get("run_id") for r in rows} | ({self.info.header.run_id} if self.info.header else set())
        runs = [r for r in runs if r["run_id"] in seen]
        summary = summarize(rows, runs, planned(runs, self.info.cells_planned), self.info.started)
        summary.update(matrix=self.info.matrix, mode=self.info.mode, strength=self.info.strength, faults=self.info.faults)
        write_summary(self.dir, summary)
        if self.render is not None:
            self.render(self.dir, rows, summary, data.probes if data else [])
        self._render_seconds = time.perf_counter() - started
        self._last_refresh = time.perf_counter()
        return summary
