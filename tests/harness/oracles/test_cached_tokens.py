"""cached_tokens: a hit count off the workload's expectation fails, with the expected and the served tier split."""
from __future__ import annotations

from tests.harness.oracles.test_oracles import ORACLES, baseline, view


def test_cached_tokens_fails_on_wrong_count() -> None:
    outs = baseline()
    outs[0].cached_tokens = outs[0].cached_device = 4
    v = ORACLES["cached_tokens"]([view(outs, baseline())])
    assert v.status == "fail" and v.detail[0] == {
        "workload": "w", "pass": "warm", "request": "a", "expected": "8", "got": "4", "rule": "",
        "expected_tiers": {"total": [8, 8], "host": 0, "storage": 0},
        "got_tiers": {"total": 4, "device": 4, "host": 0, "storage": 0}}
