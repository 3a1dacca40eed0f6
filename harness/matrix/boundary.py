"""``[boundary]``: the boundary family (``fixtures/workloads/boundary.py``) drawn per cell, how many and at what cost.

```toml
[boundary]
draws = 3          # workloads Hypothesis draws per cell (its max_examples); a failing one is shrunk on the engine
shrink_runs = 40   # engine runs a shrink may spend (each: the cell and its references on one candidate)
shapes = 4         # at most this many shapes (one or two requests each) per draw
max_tokens = 256   # the longest sequence a draw may hold (the model's context where lower)
when = { backend = "torch" }   # optional: only the cells at these levels draw
```
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from harness.matrix.model import BoundarySettings, matrix_error
from harness.matrix.tables import check_keys, parse_level_table, typed
from harness.sut.levels import EngineLevels

_KEYS = ("draws", "shrink_runs", "shapes", "max_tokens", "when")
#: bounds of each count: (least, most)
_BOUNDS = {"draws": (1, 1000), "shrink_runs": (0, 10_000), "shapes": (1, 16), "max_tokens": (8, 1_000_000)}


def parse_boundary(path: Path, table: Mapping[str, object], factors: dict[str, tuple[object, ...]],
                   engine: EngineLevels, has_seams: bool) -> BoundarySettings | None:
    """Validate ``[boundary]`` (None when absent); refused for an engine that cannot say its cells' seams."""
    if not table:
        return None
    check_keys(path, "[boundary]", table, _KEYS)
    if not has_seams:
        raise matrix_error(path, "[boundary]", f"engine {engine.name!r} does not say its cells' seams (page, budget, "
                           f"context): the boundary family cannot draw for it")
    counts = {}
    for key, (least, most) in _BOUNDS.items():
        if key in table:
            value = table[key]
            if isinstance(value, bool) or not isinstance(value, int):
                typed(path, f"[boundary] {key}", value, (), "an integer")
            if not least <= value <= most:
                raise matrix_error(path, f"[boundary] {key}", f"{value} is outside {least}..{most}")
            counts[key] = value
    when = parse_level_table(path, "[boundary] when", table["when"], factors, engine) if "when" in table else {}
    return BoundarySettings(**counts, when=dict(when))
