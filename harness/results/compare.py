"""Compare two runs by cell id: new failures, fixed cells, still failing, and metrics that drifted past a tolerance.

A cell is *failing* when its status is fail or error. A new failure is a cell failing in the new
run that did not fail in the base (it passed, or it did not exist there). Metric drift is the
relative change ``|new - base| / max(|base|, floor)`` of a metric on a cell present in both.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from harness.results.frame import METRIC, failed_oracles, frame

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


def compare(base: Sequence[Mapping], new: Sequence[Mapping],
            tolerances: Mapping[str, tuple[float, float]] = TOLERANCES) -> Comparison:
    """How ``new`` differs from ``base``, cell by cell, in cell-id order."""
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
    return out


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
    """The comparison as plain text, one finding per line."""
    lines = [f"compare {base_name} → {new_name}: {c.compared} cells in both, {len(c.added)} new, {len(c.removed)} gone",
             f"new failures: {len(c.new_failures)}", *(f"  NEW   {cell}" for cell in c.new_failures),
             f"fixed: {len(c.fixed)}", *(f"  FIXED {cell}" for cell in c.fixed),
             f"still failing: {len(c.still_failing)}",
             *(f"  STILL {cell} ({was} → {now})" for cell, was, now in c.still_failing),
             f"declared known failures that changed: {len(c.declared)}",
             *(f"  {now.upper():5} {cell} ({was} → {now})" for cell, was, now in c.declared),
             f"metric drift past tolerance: {len(c.drift)}",
             *(f"  DRIFT {d.cell_id} {d.metric}: {d.base:g} → {d.new:g} ({d.change:+.1%})" for d in c.drift)]
    return "\n".join(lines)
