"""The factor × factor failure-rate grid: for every two levels, the share of cells having both that failed.

Drawn as inline SVG (shapes and presentation attributes, no style and no script), so it shows
under a Content-Security-Policy that forbids inline styles, images from data: URIs and scripts.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.results.frame import FACTOR, factor_columns, frame

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
    """The grid's view model over the factors that vary, or None with fewer than two such factors.

    One indicator column per (factor, level), levels in the order the rows first show them; cells
    with both levels of a pair are ``indicators.T @ indicators``, failing ones the same over failing rows.
    """
    table = frame(rows)
    keys = {column[len(FACTOR):]: table[column].map(json.dumps, na_action="ignore") for column in factor_columns(table)}
    varying = {factor: key for factor, key in keys.items() if key.nunique() > 1}
    if len(varying) < 2:
        return None
    axes = [(factor, level_key, json.loads(level_key)) for factor, key in varying.items() for level_key in key.dropna().unique()]
    onehot = pd.concat([pd.get_dummies(pd.Categorical(key, categories=key.dropna().unique()), dtype=np.int64)
                        for key in varying.values()], axis=1).to_numpy()
    failing = table["failing"].to_numpy()
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
