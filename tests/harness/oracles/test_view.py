"""Declared known failures (``KnownFailure``, ``[[expected]]``) excuse the findings their signature names and
nothing else: judging goes on past them, another oracle's findings stay, a range bounds what it excuses."""
from __future__ import annotations

from harness.matrix.known import Bound
from harness.oracles import judge
from harness.oracles.view import KnownFailure
from tests.harness.oracles.test_oracles import ORACLES, baseline, view


#: llama.cpp's drafted tokens come back with logprob exactly 0.0 (ggml-org/llama.cpp#27972)
ZERO_LOGPROB = KnownFailure(1, ("logprobs",), (("got", (0.0,)),))


def test_a_declared_signature_is_excused_and_judging_goes_on_past_it() -> None:
    outs = baseline()
    for out in outs:
        out.logprobs[1:] = [0.0] * (len(out.logprobs) - 1)  # every token after the first: the declared damage
    v = ORACLES["logprobs"]([view(outs, baseline(), known=(ZERO_LOGPROB,))])
    assert v.status == "pass" and v.excused == {1: 6} and "excused as declared: 6 by [[expected]] #1" in v.message
    outs[1].logprobs[3] = -0.5  # back to golden's on its own is fine...
    outs[0].logprobs[0] = -9.0  # ...but a wrong logprob on a token the declaration does not cover fails
    v = ORACLES["logprobs"]([view(outs, baseline(), known=(ZERO_LOGPROB,))])
    assert v.status == "fail" and v.detail == [{"workload": "w", "pass": "warm", "request": "a", "step": 0,
                                                "expected": -0.5, "got": -9.0, "delta": 8.5, "tolerance": 1e-3}]


def test_a_signature_excuses_only_the_oracle_it_names() -> None:
    outs = baseline()
    outs[0].logprobs[2] = 0.0
    outs[1].tokens[2] = 99
    verdicts = judge([view(outs, baseline(), known=(ZERO_LOGPROB,))])
    assert verdicts["logprobs"].excused == {1: 1} and verdicts["tokens"].status == "fail"


def test_a_signature_on_drafted_tokens_excuses_them_alone() -> None:
    """Where the engine says which steps a verify step emitted, the finding says so and a declaration naming
    ``token = "drafted"`` excuses those steps' 0.0 and no sampled token's."""
    drafted = KnownFailure(1, ("logprobs",), (("got", (0.0,)), ("token", ("drafted",))))
    outs = baseline()
    outs[0].logprobs[2:] = [0.0, 0.0]
    v = ORACLES["logprobs"]([view(outs, baseline(), known=(drafted,), verified={"a": (2, 3), "b": ()})])
    assert v.status == "pass" and v.excused == {1: 2}
    outs[1].logprobs[1] = 0.0  # the same 0.0 on a token b decoded alone
    v = ORACLES["logprobs"]([view(outs, baseline(), known=(drafted,), verified={"a": (2, 3), "b": ()})])
    assert v.status == "fail" and [(f["request"], f["step"], f["token"]) for f in v.detail] == [("b", 1, "sampled")]
    # an engine that does not say which tokens were drafted: no finding carries the field, none is excused
    assert ORACLES["logprobs"]([view(outs, baseline(), known=(drafted,))]).excused == {}


def test_a_range_signature_excuses_a_divergence_inside_it_and_not_past_it() -> None:
    """A lossy level's token flips told from ties by their golden margin alone: a declaration excusing margins up to
    a bound still fails a divergence where golden's choice was clearer than that."""
    small = KnownFailure(1, ("tokens",), (("golden_margin", Bound(max=0.5)),))
    outs, golden = baseline(), baseline()
    outs[0].tokens[2] = 99
    golden[0].margins[2] = 0.3
    v = ORACLES["tokens"]([view(outs, golden, known=(small,))])
    assert v.status == "pass" and v.excused == {1: 1}
    assert [(d["excused_by"], d["request"], d["golden_margin"]) for d in v.detail] == [(1, "a", 0.3)]  # shown
    golden[0].margins[2] = 0.7
    v = ORACLES["tokens"]([view(outs, golden, known=(small,))])
    assert v.status == "fail" and v.detail[0]["golden_margin"] == 0.7
    assert 0.5 in Bound(max=0.5) and 0.2 not in Bound(min=0.25) and True not in Bound() and float("nan") not in Bound()
