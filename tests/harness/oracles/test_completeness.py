"""completeness: a request lost, finished twice or short of its tokens fails."""
from __future__ import annotations

import copy

import pytest

from tests.harness.oracles.test_oracles import ORACLES, baseline, view


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda outs: outs.pop(), "never finished (lost)"),
        (lambda outs: outs.append(copy.deepcopy(outs[0])), "finished 2 times"),
        (lambda outs: outs[0].tokens.pop(), "with 3 of 4 tokens"),
    ],
)
def test_completeness_fails_on_lost_duplicate_or_short(mutate, problem: str) -> None:
    outs = baseline()
    mutate(outs)
    v = ORACLES["completeness"]([view(outs, baseline())])
    assert v.status == "fail" and problem in v.detail[0]["problem"]
