"""Delta debugging (Zeller and Hildebrandt, TSE 2002): the smallest subsequence a test still fails on, in a budget.

``ddmin`` splits the current input into ``n`` chunks and tries each chunk alone, then each complement (the input
less one chunk); the first that still fails becomes the input, else ``n`` doubles, until the chunks are single
items. The result is 1-minimal: removing any one item makes the test pass. Every call of the test is one run of
the engine, so a ``Budget`` counts them and a spent budget ends the search with the smallest input found so far.
Deterministic: chunks are tried in order, and an input already tried is never run twice.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


class BudgetSpent(Exception):
    """The runs a shrink may spend are spent: keep the smallest failing input found so far."""


@dataclass(slots=True)
class Budget:
    """How many runs a shrink may spend, and how many it has."""

    runs: int
    spent: int = 0

    def take(self) -> None:
        """Count one run; raise ``BudgetSpent`` instead when none is left."""
        if self.spent >= self.runs:
            raise BudgetSpent(f"budget of {self.runs} runs spent")
        self.spent += 1

    @property
    def left(self) -> int:
        return self.runs - self.spent


def _chunks(items: Sequence[T], n: int) -> list[tuple[T, ...]]:
    """``items`` in ``n`` contiguous chunks whose sizes differ by at most one (the longer ones first)."""
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(tuple(items[start:end]))
        start = end
    return out


def ddmin(items: Sequence[T], fails: Callable[[tuple[T, ...]], bool], *, try_empty: bool = False) -> tuple[T, ...]:
    """A 1-minimal subsequence of ``items`` (order kept) on which ``fails`` still holds; ``fails(items)`` is assumed.

    ``try_empty`` tries the empty sequence first (a run of tokens that may go entirely). ``fails`` may raise
    ``BudgetSpent``: the search stops and returns the smallest failing subsequence found so far.
    """
    tried: dict[tuple[T, ...], bool] = {tuple(items): True}

    def test(candidate: tuple[T, ...]) -> bool:
        if candidate not in tried:
            tried[candidate] = fails(candidate)
        return tried[candidate]

    current, n = tuple(items), 2
    try:
        if try_empty and current and test(()):
            return ()
        while len(current) >= 2:
            chunks = _chunks(current, min(n, len(current)))
            subsets = chunks if len(chunks) > 2 else []  # with two chunks the complements are the subsets
            complements = [tuple(x for j, c in enumerate(chunks) if j != i for x in c) for i in range(len(chunks))]
            found = next((c for c in subsets if test(c)), None)
            if found is not None:
                current, n = found, 2
                continue
            found = next((c for c in complements if test(c)), None)
            if found is not None:
                current, n = found, max(len(chunks) - 1, 2)
                continue
            if len(chunks) >= len(current):
                break
            n = min(len(current), 2 * len(chunks))
    except BudgetSpent:
        pass
    return current
