"""The factor × factor failure-rate grid: for every two levels, the share of cells having both that failed.

Drawn as inline SVG (shapes and presentation attributes, no style and no script), so it shows
under a Content-Security-Policy that forbids inline styles, images from data: URIs and scripts.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

CELL = 16
LABEL = 170
NO_CELLS = "#f1f1f1"


@dataclass(frozen=True, slots=True)
class Square:
    """One square of the grid: position, colour and the tooltip text."""

    x: int
    y: int
    fill: str
    title: str


def rate_colour(rate: float) -> str:
    """Pale green for 0, from pale red to deep red as the failure rate goes to 1."""
    if rate <= 0:
        return "#e3f2e1"
    low, high = (253, 224, 220), (183, 28, 28)
    r, g, b = (round(lo + (hi - lo) * rate) for lo, hi in zip(low, high))
    return f"#{r:02x}{g:02x}{b:02x}"


def grid(rows: Sequence[Mapping]) -> dict | None:
    """The grid's view model over the factors that vary, or None with fewer than two such factors."""
    levels: dict[str, dict[str, object]] = {}
    for row in rows:
        for factor, level in row["factors"].items():
            levels.setdefault(factor, {}).setdefault(json.dumps(level), level)
    axes = [(f, key, level) for f, ls in levels.items() if len(ls) > 1 for key, level in ls.items()]
    if len({f for f, _, _ in axes}) < 2:
        return None
    onehot = np.array([[json.dumps(r["factors"].get(f)) == key for f, key, _ in axes] for r in rows], dtype=np.int64)
    failing = np.array([r["status"] in ("fail", "error") for r in rows], dtype=bool)
    totals, fails = onehot.T @ onehot, onehot[failing].T @ onehot[failing]
    squares = []
    for i, (fi, _, li) in enumerate(axes):
        for j, (fj, _, lj) in enumerate(axes):
            if fi == fj and i != j:
                continue
            n, bad = int(totals[i, j]), int(fails[i, j])
            fill = rate_colour(bad / n) if n else NO_CELLS
            pair = f"{fi}={li}" if i == j else f"{fi}={li} × {fj}={lj}"
            squares.append(Square(LABEL + j * CELL, LABEL + i * CELL, fill, f"{pair}: {bad}/{n} cells fail"))
    labels = [{"pos": LABEL + k * CELL + CELL // 2 + 4, "text": f"{f}={lv}"} for k, (f, _, lv) in enumerate(axes)]
    breaks = [LABEL + k * CELL for k in range(1, len(axes)) if axes[k][0] != axes[k - 1][0]]
    end = LABEL + len(axes) * CELL
    return {"width": end + LABEL // 2, "height": end + 2, "cell": CELL, "label": LABEL, "squares": squares, "labels": labels, "breaks": breaks,
            "end": end}
