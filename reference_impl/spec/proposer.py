"""The proposer interface: the hooks the engine calls whatever the spec level (``none``, ``ngram``, ``draft``, ``mtp`` or yours).

A spec level names a class built with no arguments; the registry checks it against ``Proposer``
when a matrix file names it.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol

import torch

from reference_impl.config import EngineConfig, ModelConfig
from reference_impl.memory.pool import Pool
from reference_impl.request import Chunk, Request


class Proposer(Protocol):
    """Drafts tokens for greedy verification, and keeps whatever draft state it needs in the engine's pools.

    Ownership. The proposer allocates and frees no page itself: the engine issues and frees every
    page, and a draft pool returned by ``setup`` is issued and freed in lockstep with the target's
    (``EnginePools``), so one virtual page id names the target's and the draft's K/V of the same
    tokens. The proposer only writes the draft K/V of pages the request owns (``observe``), reads
    them (``propose``), and tells the engine where that K/V lies (``draft_kv``) so that tier copies
    and PD transfers move it with the target's. ``propose`` writes nothing: rejected drafts must
    leave no draft state behind.
    """

    speculative: ClassVar[bool]  # False: every decode step is a plain one-token step (no verify)

    def pool_model(self, model: ModelConfig) -> ModelConfig:
        """The layout of the target pool: ``model``'s own, or with extra layers the proposer keeps there (MTP)."""

    def setup(self, target: Pool, config: EngineConfig) -> Pool | None:
        """Prepare for an engine of ``config`` on ``target``; returns the proposer's own KV pool, or None."""

    def attach(self, runner: object) -> None:
        """Remember the engine's model runner (``physical_slots`` translates a request's slots in any pool)."""

    def observe(self, chunks: Sequence[Chunk], qo_indptr: Sequence[int], hidden: torch.Tensor) -> None:
        """After every target forward: catch the draft state up over the positions just computed."""

    def propose(self, req: Request, k: int) -> list[int]:
        """Up to ``k`` draft tokens continuing ``req``'s tokens (empty: a plain step); writes nothing."""

    def draft_kv(self) -> list[tuple[Pool, int]]:
        """(pool, attention layer) of every draft K/V that must move with a page's target K/V."""

    def cached(self, pages: Sequence[int]) -> None:
        """The prefix cache adopted ``pages`` (their draft K/V stays valid while the cache holds them)."""

    def full_hit(self, pages: Sequence[int]) -> bool | None:
        """Whether a hit on ``pages`` restores the draft state too; None for a proposer without draft state."""
