"""``--cell ID`` and ``--shard I/N``: the cells a command line names, from the matrix's array or any allowed
combination of its levels, and the share of them one runner takes.

A cell id names a level of every factor in file order, so an id is read back against the
matrix itself: factor by factor, a level whose partial id is a prefix of the text. That finds
cells outside the covering array too (the one-factor-changed cells ``harness locate`` runs),
as long as the matrix's constraints allow them.
"""
from __future__ import annotations

import difflib
from collections.abc import Sequence

from harness.matrix.model import Cell, Matrix


class SelectionError(ValueError):
    """A ``--cell`` id that names no allowed cell of the matrix (the message lists the closest ids), or a
    ``--shard`` that is not ``I/N``; the message names the option as typed."""


def parse_shard(text: str, option: str = "--shard") -> tuple[int, int]:
    """``"I/N"`` (1 ≤ I ≤ N) → (I, N); errors name ``option``, the flag the user typed."""
    try:
        index, total = (int(part) for part in text.split("/"))
    except ValueError:
        raise SelectionError(f"{option} {text!r}: expected I/N, e.g. 1/4") from None
    if not 1 <= index <= total:
        raise SelectionError(f"{option} {text!r}: need 1 <= I <= N")
    return index, total


def select_shard(cells: Sequence[Cell], shard: tuple[int, int] | None) -> list[Cell]:
    """Every N-th cell starting at the I-th: shards are disjoint, cover the matrix and stay stable."""
    if shard is None:
        return list(cells)
    index, total = shard
    return [cell for i, cell in enumerate(cells) if i % total == index - 1]


def _parse(matrix: Matrix, text: str) -> list[Cell]:
    """Every cell of ``matrix``'s levels whose id is exactly ``text`` (a prefix search, factor by factor)."""
    found, stack = [], [()]
    while stack:
        prefix = stack.pop()
        if len(prefix) == len(matrix.factors):
            if Cell(prefix).cell_id == text:
                found.append(Cell(prefix))
            continue
        factor, levels = matrix.factors[len(prefix)]
        for level in levels:
            partial = (*prefix, (factor, level))
            if text.startswith(Cell(partial).cell_id):  # a partial id ends with its "/": no level is a prefix of another
                stack.append(partial)
    return found


def cell_by_id(matrix: Matrix, cell_id: str, generated: Sequence[Cell]) -> Cell:
    """The cell named ``cell_id``: from ``generated`` when it is there, else any allowed cell of the matrix's levels."""
    for cell in generated:
        if cell.cell_id == cell_id:
            return cell
    for cell in _parse(matrix, cell_id):
        if matrix.allows(cell.as_dict()):
            return cell
    close = difflib.get_close_matches(cell_id, [c.cell_id for c in generated], n=3, cutoff=0.5)
    hint = f"; closest: {', '.join(close)}" if close else ""
    raise SelectionError(f"--cell {cell_id!r}: no allowed cell of matrix {matrix.name} has this id{hint}")


def select_cells(matrix: Matrix, generated: Sequence[Cell], ids: Sequence[str]) -> list[Cell]:
    """The named cells, in the order given, each once."""
    return list(dict.fromkeys(cell_by_id(matrix, cell_id, generated) for cell_id in ids))
