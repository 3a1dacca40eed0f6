"""batch_invariance: with deterministic mode on, every field of every step equals the request served alone (the cold
pass) or the cold pass (a later one), to the bit; skipped with deterministic mode off."""
from __future__ import annotations

import pytest

from tests.harness.oracles.test_oracles import ORACLES, baseline, view


def test_batch_invariance_is_skipped_when_deterministic_mode_is_off() -> None:
    assert ORACLES["batch_invariance"]([view(baseline(), reference=baseline())]).status == "skip"


def test_batch_invariance_fails_on_one_bit() -> None:
    outs = baseline()
    outs[1].logprobs[3] = float.fromhex(outs[1].logprobs[3].hex()) + 2**-40  # one ulp-scale change
    v = ORACLES["batch_invariance"]([view(outs, name="cold", deterministic=True, reference=baseline())])
    assert v.status == "fail"
    assert v.detail[0] | {"got": None} == {"workload": "w", "pass": "cold", "against": "solo", "request": "b",
                                            "step": 3, "what": "logprob", "expected": -0.5, "got": None}


def test_batch_invariance_exempts_preempted_hybrid_requests_only() -> None:
    outs = baseline()
    outs[0].margins[0] += 1e-3
    outs[0].preemptions = 1
    hybrid = ORACLES["batch_invariance"]([view(outs, deterministic=True, hybrid=True, reference=baseline())])
    dense = ORACLES["batch_invariance"]([view(outs, deterministic=True, hybrid=False, reference=baseline())])
    assert hybrid.status == "pass" and "1 preempted" in hybrid.message
    assert dense.status == "fail"


@pytest.mark.parametrize("what", ["token", "logprob", "margin", "top_logprobs"])
@pytest.mark.parametrize("against", ["solo", "cold"])
def test_batch_invariance_compares_every_field_against_both_references(what: str, against: str) -> None:
    outs = baseline()
    if what == "top_logprobs":
        outs[0].top_logprobs[1] = [outs[0].top_logprobs[1][0] + 2**-30]
    else:
        field = {"token": "tokens", "logprob": "logprobs", "margin": "margins"}[what]
        getattr(outs[0], field)[1] += 1 if what == "token" else 2**-30
    name = "cold" if against == "solo" else "warm"
    v = ORACLES["batch_invariance"]([view(outs, name=name, deterministic=True, reference=baseline())])
    assert v.status == "fail" and (v.detail[0]["what"], v.detail[0]["against"], v.detail[0]["step"]) == (what, against, 1)
