"""The n-gram proposer: it drafts what followed the latest, longest match of the request's own suffix."""
from __future__ import annotations

from reference_impl.request import Request, RequestOutput, RequestSpec
from reference_impl.spec.ngram import NgramProposer


def request(tokens: list[int]) -> Request:
    spec = RequestSpec("r", tuple(tokens), max_new_tokens=4)
    return Request(spec, 0, RequestOutput.empty("r", "length"))


def test_ngram_proposes_what_followed_the_latest_longest_suffix_match() -> None:
    proposer = NgramProposer(min_n=1, max_n=3)
    assert proposer.propose(request([5, 6, 7, 8, 9, 6, 7]), 2) == [8, 9]
    assert proposer.propose(request([1, 2, 9, 1, 3, 1]), 3) == [3, 1]  # latest single-token match wins
    assert proposer.propose(request([1, 2, 3]), 3) == []
