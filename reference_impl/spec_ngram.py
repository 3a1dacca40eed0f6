"""Proposers that need no model: ``none`` (plain decoding) and ``ngram`` (prompt lookup)."""
from __future__ import annotations

from collections.abc import Sequence


class NoProposer:
    """spec = none: never drafts, so every decode step is a plain one-token step."""

    name = "none"
    speculative = False

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """No draft tokens."""
        return []


class NgramProposer:
    """spec = ngram: the longest suffix n-gram seen earlier in the context proposes what followed it.

    n runs from ``max_n`` down to ``min_n``; among earlier occurrences the latest wins (vLLM's
    prompt-lookup proposer), and up to ``k`` tokens that followed it are the draft.
    """

    name = "ngram"
    speculative = True

    def __init__(self, min_n: int = 1, max_n: int = 4) -> None:
        self.min_n, self.max_n = min_n, max_n

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` draft tokens continuing ``tokens``; empty when no suffix recurs."""
        tokens = list(tokens)
        for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
            suffix = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start : start + n] == suffix:
                    return tokens[start + n : start + n + k]
        return []
