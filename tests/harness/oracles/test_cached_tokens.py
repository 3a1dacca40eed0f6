"""cached_tokens: a hit count off the workload's expectation fails, with the expected and the served tier split."""
from __future__ import annotations

from fixtures.workloads import CachedExpectation
from harness.oracles.view import KnownFailure
from tests.harness.oracles.test_oracles import ORACLES, baseline, view


def test_cached_tokens_fails_on_wrong_count() -> None:
    outs = baseline()
    outs[0].cached_tokens = outs[0].cached_device = 4
    v = ORACLES["cached_tokens"]([view(outs, baseline())])
    assert v.status == "fail" and v.detail[0] == {
        "workload": "w", "pass": "warm", "request": "a", "past_page": 0, "pages_over": 0, "expected": "8", "got": "4", "rule": "",
        "expected_tiers": {"total": [8, 8], "host": 0, "storage": 0},
        "got_tiers": {"total": 4, "device": 4, "host": 0, "storage": 0}}


def test_a_finding_names_the_prompt_tokens_past_its_last_whole_page_so_a_declaration_can_name_a_boundary() -> None:
    """ExampleConnector's lookup misses a prompt of k pages + 1 (``past_page = 1``): a declaration whose signature
    names that boundary excuses it there and nowhere else."""
    outs = baseline()
    outs[0].cached_tokens = outs[0].cached_device = 0
    outs[1].cached_tokens = outs[1].cached_device = 0
    expected = {"a": CachedExpectation(8, 8, 4), "b": CachedExpectation(4, 4, 4)}
    prompts = {"a": tuple(range(9)), "b": tuple(range(6))}  # 2 pages + 1, 1 page + 2
    boundary = (KnownFailure(1, ("cached_tokens",), (("past_page", (1,)),)),)
    v = ORACLES["cached_tokens"]([view(outs, baseline(), prompts=prompts, expected_cached=expected, known=boundary)])
    assert v.status == "fail" and [(f["request"], f["past_page"]) for f in v.detail] == [("b", 2)]
    outs[1].cached_tokens = outs[1].cached_device = 4
    v = ORACLES["cached_tokens"]([view(outs, baseline(), prompts=prompts, expected_cached=expected, known=boundary)])
    assert v.status == "pass", v.detail


def test_a_finding_names_the_whole_pages_it_hit_above_the_rule() -> None:
    """A hit one page past what the rule allows (vLLM's ExampleConnector keeping the block the EAGLE drop takes) is
    ``pages_over = 1``; one short of the rule is 0."""
    outs = baseline()
    outs[0].cached_tokens = outs[0].cached_device = 12
    outs[1].cached_tokens = outs[1].cached_device = 0
    expected = {"a": CachedExpectation(8, 8, 4), "b": CachedExpectation(4, 4, 4)}
    v = ORACLES["cached_tokens"]([view(outs, baseline(), expected_cached=expected)])
    assert [(f["request"], f["pages_over"]) for f in v.detail] == [("a", 1), ("b", 0)]
