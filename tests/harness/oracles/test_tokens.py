"""tokens: a divergence from golden fails with its request, step and a bounded window of both sequences; one at a
near tie (golden's margin within the tie tolerance) is a tie, not a failure."""
from __future__ import annotations

import pytest

from harness.oracles.tokens import TOKEN_WINDOW
from tests.harness.oracles.test_oracles import ORACLES, baseline, output, view


def test_tokens_fails_with_request_step_expected_got() -> None:
    outs = baseline()
    outs[1].tokens[2] = 99
    v = ORACLES["tokens"]([view(outs, baseline())])
    assert v.status == "fail"
    assert v.detail[0] == {"workload": "w", "pass": "warm", "request": "b", "step": 2, "expected": 7, "got": 99,
                           "golden_margin": 1.0, "window_start": 0, "expected_tokens": [5, 6, 7, 8],
                           "got_tokens": [5, 6, 99, 8]}


def test_tokens_keeps_a_bounded_window_of_both_sequences() -> None:
    golden = [output("a", list(range(100)))]
    outs = [output("a", list(range(100)))]
    outs[0].tokens[60] = 999
    (finding,) = ORACLES["tokens"]([view(outs, golden)]).detail
    assert finding["window_start"] == 60 - TOKEN_WINDOW[0]
    assert finding["expected_tokens"] == list(range(60 - TOKEN_WINDOW[0], 60 + TOKEN_WINDOW[1]))
    assert finding["got_tokens"][TOKEN_WINDOW[0]] == 999 and len(finding["got_tokens"]) == sum(TOKEN_WINDOW)


def test_tokens_divergence_at_a_near_tie_is_a_tie_not_a_failure() -> None:
    golden = [output("a", [1, 2, 3], margin=1e-5)]
    v = ORACLES["tokens"]([view([output("a", [1, 9, 3])], golden)])
    assert v.status == "pass" and v.detail[0]["tie"] and "1 ties" in v.message


@pytest.mark.parametrize(("margin", "status"), [(0.9e-3, "pass"), (1.1e-3, "fail")])
def test_tie_tolerance_is_1e3_for_fp32(margin: float, status: str) -> None:
    golden = [output("a", [1, 2, 3], margin=margin)]
    assert ORACLES["tokens"]([view([output("a", [1, 9, 3])], golden)]).status == status
