"""The one defaults table: the level of every engine factor a matrix leaves out, and from it the golden levels.

The golden cell is the defaults, except for the factors that say *what* is compared rather than *how*
it is served (``KEPT_FROM_CELL``): a cell of the hybrid model is judged against the hybrid model's
golden run, a cell drafting 5 tokens against golden levels drafting 5. One table, so a golden cell can
never drift from the levels the cells it judges leave out.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

DEFAULT_LEVELS: Mapping[str, object] = MappingProxyType({
    "model": "dense",
    "scheduler": "fcfs",
    "cache": "off",
    "pool": "static",
    "backend": "torch",
    "page_size": 1,
    "prefill_budget": 128,
    "deterministic": "on",
    "poison": "off",
    "spec": "none",
    "num_draft_tokens": 3,
    "store": "file",
    "pd": "off",
    "pd_staging": "off",
    "decode_tp": 1,
    "pd_fail_rate": 0.0,
})

#: factors whose golden level is the cell's own (the model served, the draft length, the L3 store kind).
KEPT_FROM_CELL = frozenset({"model", "num_draft_tokens", "store"})

#: golden level of each factor unless the matrix file's ``[golden]`` table says otherwise.
DEFAULT_GOLDEN: Mapping[str, object] = MappingProxyType(
    {factor: level for factor, level in DEFAULT_LEVELS.items() if factor not in KEPT_FROM_CELL})


def engine_levels(levels: Mapping[str, object]) -> dict[str, object]:
    """The full level assignment: defaults overridden by ``levels``."""
    return {**DEFAULT_LEVELS, **levels}
