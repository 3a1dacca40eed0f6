"""Compare two runs by cell id: new failures, fixed cells, still failing, and metrics that drifted past a tolerance.

A cell is *failing* when its status is fail or error. A new failure is a cell failing in the new
run that did not fail in the base (it passed, or it did not exist there). Metric drift is the
relative change ``|new - base| / max(|base|, floor)`` of a metric on a cell present in both.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from harness.rows import as_float

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


def failing(row: Mapping) -> bool:
    return row["status"] in ("fail", "error")


def what_failed(row: Mapping) -> str:
    names = [n for n, v in row["oracles"].items() if v["verdict"] == "fail"]
    return ", ".join(names) or ("error" if row["status"] == "error" else "")


def compare(base: Sequence[Mapping], new: Sequence[Mapping],
            tolerances: Mapping[str, tuple[float, float]] = TOLERANCES) -> Comparison:
    """How ``new`` differs from ``base``, cell by cell, in a stable order."""
    old = {r["cell_id"]: r for r in base}
    out = Comparison()
    for row in sorted(new, key=lambda r: r["cell_id"]):
        cell, before = row["cell_id"], old.get(row["cell_id"])
        if before is None:
            out.added.append(cell)
        if failing(row) and (before is None or not failing(before)):
            out.new_failures.append(cell)
        elif before is not None and failing(before):
            (out.still_failing.append((cell, what_failed(before), what_failed(row))) if failing(row)
             else out.fixed.append(cell))
        if before is not None:
            out.compared += 1
            out.drift += _drift(cell, before, row, tolerances)
    out.removed = sorted(set(old) - {r["cell_id"] for r in new})
    return out


def _drift(cell: str, before: Mapping, after: Mapping, tolerances: Mapping[str, tuple[float, float]]) -> list[Drift]:
    found = []
    for metric, (tolerance, floor) in tolerances.items():
        a = as_float((before.get("metrics") or {}).get(metric))
        b = as_float((after.get("metrics") or {}).get(metric))
        if a is None or b is None:
            continue
        change = (b - a) / max(abs(a), floor)
        if not abs(change) <= tolerance:  # NaN on either side counts as drift
            found.append(Drift(cell, metric, a, b, change))
    return found


def text(c: Comparison, base_name: str, new_name: str) -> str:
    """The comparison as plain text, one finding per line."""
    lines = [f"compare {base_name} → {new_name}: {c.compared} cells in both, {len(c.added)} new, {len(c.removed)} gone",
             f"new failures: {len(c.new_failures)}", *(f"  NEW   {cell}" for cell in c.new_failures),
             f"fixed: {len(c.fixed)}", *(f"  FIXED {cell}" for cell in c.fixed),
             f"still failing: {len(c.still_failing)}",
             *(f"  STILL {cell} ({was} → {now})" for cell, was, now in c.still_failing),
             f"metric drift past tolerance: {len(c.drift)}",
             *(f"  DRIFT {d.cell_id} {d.metric}: {d.base:g} → {d.new:g} ({d.change:+.1%})" for d in c.drift)]
    return "\n".join(lines)
