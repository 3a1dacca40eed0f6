"""Proposers that keep no state: ``none`` (plain decoding) and ``ngram`` (prompt lookup).

Every proposer has the same hooks (``spec.proposer.Proposer``: the engine calls them whatever
the spec level): a stateless one has no pool of its own, needs nothing after a forward, and has
no draft state for the prefix cache to keep or lose.
"""
from __future__ import annotations

from collections.abc import Sequence

from reference_impl.config import EngineConfig, ModelConfig
from reference_impl.faults import NGRAM_PROMPT_ONLY
from reference_impl.memory.pool import Pool


class StatelessProposer:
    """The hooks of a proposer without draft state; subclasses define ``propose``."""

    speculative = False

    def pool_model(self, model: ModelConfig) -> ModelConfig:
        """The target pool's layout: the target's own."""
        return model

    def setup(self, target: Pool, config: EngineConfig) -> None:
        """Nothing to load, no draft pool."""

    def attach(self, runner: object) -> None:
        """Nothing to run on the model runner."""

    def observe(self, chunks: Sequence[object], qo_indptr: Sequence[int], hidden: object) -> None:
        """No draft state to catch up after a target forward."""

    def draft_kv(self) -> list[tuple[Pool, int]]:
        """(pool, layer) of the draft's K/V that moves with a cached page: none for a stateless proposer."""
        return []

    def cached(self, pages: Sequence[int]) -> None:
        """No draft state for the prefix cache to keep."""

    def full_hit(self, pages: Sequence[int]) -> bool | None:
        """No draft state: a hit is neither full nor partial."""
        return None

    def propose(self, req: object, k: int) -> list[int]:
        """No draft tokens."""
        return []


class NoProposer(StatelessProposer):
    """spec = none: never drafts, so every decode step is a plain one-token step."""




class NgramProposer(StatelessProposer):
    """spec = ngram: the longest suffix n-gram seen earlier in the context proposes what followed it.

    n runs from ``max_n`` down to ``min_n``; among earlier occurrences the latest wins (vLLM 0.32.0's
    prompt lookup follows the earliest: ``fixtures.spec_expect.LookupRule``), and up to ``k`` tokens that
    followed it are the draft.
    """

    speculative = True

    def __init__(self, min_n: int = 1, max_n: int = 4) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.prompt_only = False

    def setup(self, target: Pool, config: EngineConfig) -> None:
        """No draft pool; read the one fault that changes where lookup searches."""
        self.prompt_only = NGRAM_PROMPT_ONLY.name in config.faults

    def propose(self, req: object, k: int) -> list[int]:
        """Up to ``k`` draft tokens continuing the request's tokens; empty when no suffix recurs."""
        tokens = req.all_tokens()
        for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
            suffix = tokens[-n:]
            last = len(req.spec.prompt) - n if self.prompt_only else len(tokens) - n - 1
            for start in range(min(last, len(tokens) - n - 1), -1, -1):
                if tokens[start : start + n] == suffix:
                    return tokens[start + n : start + n + k]
        return []
