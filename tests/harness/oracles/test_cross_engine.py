"""cross_engine: a divergence from the other engine's golden fails, one at its tie does not; no other engine: skip."""
from __future__ import annotations

from tests.harness.oracles.test_oracles import ORACLES, baseline, view


def test_cross_engine_fails_on_a_divergence_and_not_on_a_tie() -> None:
    other = baseline()
    other[1].tokens[2] = 99  # the other engine's golden diverges at step 2 of request b
    verdict = ORACLES["cross_engine"]([view(baseline(), name="cold", cross_reference=other)])
    assert verdict.status == "fail" and verdict.detail[0]["request"] == "b" and verdict.detail[0]["step"] == 2
    other[1].margins[2] = 1e-4  # the other engine was at a tie there
    assert ORACLES["cross_engine"]([view(baseline(), name="cold", cross_reference=other)]).status == "pass"
    assert ORACLES["cross_engine"]([view(baseline(), name="cold")]).status == "skip"
