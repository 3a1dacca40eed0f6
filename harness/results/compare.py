"""Compare two runs by cell id: new failures, fixed cells, still failing, and metrics that drifted past a tolerance.

A cell is *failing* when its status is fail or error. A new failure is a cell failing in the new
run that did not fail in the base (it passed, or it did not exist there). Metric drift is the
relative change ``|new - base| / max(|base|, floor)`` of a metric on a cell present in both.
Given the runs' headers, each cell that differs and was in both runs names the host facts its two rows' runs differ
in (``harness.results.hosts``), and nothing where they are the same.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from harness.results.frame import METRIC, failed_oracles, frame
from harness.results.hosts import by_run, row_changes

#: the statuses of a cell with a declared known failure ([[expected]]).
DECLARED = ("xfail", "xpass")

#: relative change past which a metric drifted, and the floor under the base value (tiny bases
#: would turn noise into huge ratios: 0.01 s → 0.03 s is not a 200% slowdown worth a line).
TOLERANCES: dict[str, tuple[float, float]] = {
    "mean_accept_length": (0.05, 0.1),
    "cached_tokens_warm": (0.05, 16.0),
    "engine_seconds": (0.5, 1.0),
}


@dataclass(frozen=True, slots=True)
class Drift:
    """A metric of one cell that moved more than its tolerance."""

    cell_id: str
    metric: str
    base: float
    new: float
    change: float  # relative, signed


@dataclass(slots=True)
class Comparison:
    """Two runs side by side."""

    new_failures: list[str] = field(default_factory=list)
    fixed: list[str] = field(default_factory=list)
    still_failing: list[tuple[str, str, str]] = field(default_factory=list)  # cell, base oracles, new oracles
    drift: list[Drift] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    compared: int = 0
    #: cells in both whose status moved to or from a declared known failure: cell, base status, new status
    declared: list[tuple[str, str, str]] = field(default_factory=list)
    #: cells above that were in both runs, whose runs' hosts differ: cell → the facts (``cpu_flags +amx_tile``)
    hosts: dict[str, list[str]] = field(default_factory=dict)
    #: every fact the hosts of the cells in both runs differ in, in order (none: the same hosts, or unrecorded)
    host_changes: list[str] = field(default_factory=list)

    def differing(self) -> list[str]:
        """The cells in both runs that differ: new failures, fixed, failing by other oracles, declared ones that moved,
        drift."""
        cells = [*self.new_failures, *self.fixed, *(c for c, was, now in self.still_failing if was != now),
                 *(c for c, _, _ in self.declared), *(d.cell_id for d in self.drift)]
        added = set(self.added)
        return [cell for cell in dict.fromkeys(cells) if cell not in added]


def compare(base: Sequence[Mapping], new: Sequence[Mapping],
            tolerances: Mapping[str, tuple[float, float]] = TOLERANCES,
            base_runs: Sequence[Mapping] = (), new_runs: Sequence[Mapping] = ()) -> Comparison:
    """How ``new`` differs from ``base``, cell by cell, in cell-id order; with the runs' headers, the host facts
    under each cell that differs."""
    old, now = frame(base).sort_index(), frame(new).sort_index()
    was = old["failing"].reindex(now.index)  # NaN: the cell is new
    present = was.notna()
    failing_before = was.eq(True)
    out = Comparison(
        added=list(now.index[~present]),
        new_failures=list(now.index[now["failing"] & ~failing_before]),
        fixed=list(now.index[failing_before & ~now["failing"]]),
        removed=sorted(old.index.difference(now.index)),
        compared=int(present.sum()),
    )
    still = now.index[failing_before & now["failing"]]
    before, after = failed_oracles(old), failed_oracles(now)
    out.still_failing = [(cell, before[cell], after[cell]) for cell in still]
    out.drift = _drift(old, now.loc[present], tolerances)
    statuses = now[["status"]].join(old["status"].rename("before"), how="inner")
    moved = statuses[(statuses["status"] != statuses["before"])
                     & (statuses["status"].isin(DECLARED) | statuses["before"].isin(DECLARED))]
    out.declared = [(cell, before, status) for cell, status, before in moved[["status", "before"]].itertuples()]
    _hosts(out, base, new, base_runs, new_runs)
    return out


def _hosts(out: Comparison, base: Sequence[Mapping], new: Sequence[Mapping], base_runs: Sequence[Mapping],
           new_runs: Sequence[Mapping]) -> None:
    """Fill ``out.hosts`` and ``out.host_changes`` from the rows' run headers (each pair of runs compared once)."""
    was_runs, now_runs = by_run(base_runs), by_run(new_runs)
    if not was_runs or not now_runs:
        return
    was, now = {r["cell_id"]: r for r in base}, {r["cell_id"]: r for r in new}
    pairs: dict[tuple, list[str]] = {}
    for cell in (cell for cell in now if cell in was):
        key = (was[cell].get("run_id"), now[cell].get("run_id"))
        if key not in pairs:
            pairs[key] = row_changes(was[cell], now[cell], was_runs, now_runs)
    out.host_changes = list(dict.fromkeys(fact for changes in pairs.values() for fact in changes))
    for cell in out.differing():
        changes = pairs.get((was[cell].get("run_id"), now[cell].get("run_id")))
        if changes:
            out.hosts[cell] = changes


def _drift(old: pd.DataFrame, now: pd.DataFrame, tolerances: Mapping[str, tuple[float, float]]) -> list[Drift]:
    """Metrics of cells in both runs that moved more than their tolerance, by cell then in ``tolerances`` order."""
    found = []
    for order, (metric, (tolerance, floor)) in enumerate(tolerances.items()):
        column = METRIC + metric
        if column not in old or column not in now:
            continue
        a, b = old[column].reindex(now.index), now[column]
        measured = (a.notna() & b.notna()).to_numpy()  # <NA>: not measured; NaN: measured, and drifts
        av, bv = (s.to_numpy(dtype=float, na_value=np.nan) for s in (a, b))
        with np.errstate(invalid="ignore"):
            change = (bv - av) / np.maximum(np.abs(av), floor)
        drifted = measured & ~(np.abs(change) <= tolerance)
        found += [(now.index[i], order, Drift(now.index[i], metric, av[i], bv[i], float(change[i])))
                  for i in np.flatnonzero(drifted)]
    return [drift for _, _, drift in sorted(found, key=lambda item: item[:2])]


def text(c: Comparison, base_name: str, new_name: str) -> str:
    """The comparison as plain text, one finding per line; a cell whose runs' hosts differ says in what."""
    def hosts(cell: str) -> str:
        return f"; hosts differ in {', '.join(c.hosts[cell])}" if cell in c.hosts else ""

    lines = [f"compare {base_name} → {new_name}: {c.compared} cells in both, {len(c.added)} new, {len(c.removed)} gone",
             *([f"hosts differ in: {', '.join(c.host_changes)}"] if c.host_changes else []),
             f"new failures: {len(c.new_failures)}", *(f"  NEW   {cell}{hosts(cell)}" for cell in c.new_failures),
             f"fixed: {len(c.fixed)}", *(f"  FIXED {cell}{hosts(cell)}" for cell in c.fixed),
             f"still failing: {len(c.still_failing)}",
             *(f"  STILL {cell} ({was} → {now}){hosts(cell)}" for cell, was, now in c.still_failing),
             f"declared known failures that changed: {len(c.declared)}",
             *(f"  {now.upper():5} {cell} ({was} → {now}){hosts(cell)}" for cell, was, now in c.declared),
             f"metric drift past tolerance: {len(c.drift)}",
             *(f"  DRIFT {d.cell_id} {d.metric}: {d.base:g} → {d.new:g} ({d.change:+.1%}){hosts(d.cell_id)}"
               for d in c.drift)]
    return "\n".join(lines)
