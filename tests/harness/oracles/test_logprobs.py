"""logprobs: a logprob off golden's beyond the tolerance fails, naming the request and the step."""
from __future__ import annotations

import pytest

from tests.harness.oracles.test_oracles import ORACLES, baseline, view


def test_logprobs_fails_beyond_tolerance_only() -> None:
    outs = baseline()
    outs[0].logprobs[1] += 1e-5
    assert ORACLES["logprobs"]([view(outs, baseline())]).status == "pass"
    outs[0].logprobs[1] += 0.01
    v = ORACLES["logprobs"]([view(outs, baseline())])
    assert v.status == "fail" and v.detail[0]["request"] == "a" and v.detail[0]["step"] == 1


@pytest.mark.parametrize(("delta", "status"), [(0.9e-3, "pass"), (1.1e-3, "fail")])
def test_logprob_tolerance_is_1e3_for_fp32(delta: float, status: str) -> None:
    outs = baseline()
    outs[1].logprobs[2] += delta
    assert ORACLES["logprobs"]([view(outs, baseline())]).status == status
