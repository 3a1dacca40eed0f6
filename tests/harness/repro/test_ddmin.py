"""ddmin finds a 1-minimal failing subsequence, deterministically, and a spent budget keeps what it found."""
from __future__ import annotations

import pytest

from harness.repro.ddmin import Budget, BudgetSpent, ddmin


def needs(*wanted: int):
    """A test that fails while every one of ``wanted`` is in the input, recording each input it is given."""
    calls: list[tuple[int, ...]] = []

    def fails(candidate: tuple[int, ...]) -> bool:
        calls.append(candidate)
        return set(wanted) <= set(candidate)

    return fails, calls


def test_ddmin_keeps_exactly_the_items_the_failure_needs_in_order() -> None:
    fails, calls = needs(3, 7, 12)
    assert ddmin(range(20), fails) == (3, 7, 12)
    assert len(calls) == len(set(calls)), "an input was tried twice"


def test_ddmin_is_deterministic() -> None:
    first, first_calls = needs(5, 6)
    second, second_calls = needs(5, 6)
    assert ddmin(range(16), first) == ddmin(range(16), second) == (5, 6)
    assert first_calls == second_calls


def test_ddmin_result_is_one_minimal_for_an_interaction() -> None:
    """Fails while the input holds 2 and either 9 or 10: removing any one item of the result makes it pass."""
    def fails(candidate: tuple[int, ...]) -> bool:
        return 2 in candidate and (9 in candidate or 10 in candidate)

    found = ddmin(range(12), fails)
    assert fails(found) and all(not fails(found[:i] + found[i + 1:]) for i in range(len(found)))
    assert len(found) == 2


def test_ddmin_tries_the_empty_input_when_asked() -> None:
    assert ddmin((1, 2, 3), lambda c: True, try_empty=True) == ()
    assert len(ddmin((1, 2, 3), lambda c: True)) == 1


def test_a_spent_budget_returns_the_smallest_failing_input_so_far() -> None:
    budget = Budget(3)
    fails, calls = needs(1, 14)

    def counted(candidate: tuple[int, ...]) -> bool:
        budget.take()
        return fails(candidate)

    found = ddmin(range(16), counted)
    assert budget.spent == 3 and len(calls) == 3
    assert {1, 14} <= set(found) and fails(found)
    with pytest.raises(BudgetSpent):
        budget.take()
