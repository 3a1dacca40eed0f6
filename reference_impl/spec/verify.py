"""Greedy verification and accept-length accounting: the one definition every report uses.

A verify step feeds the last emitted token plus ``d`` draft tokens; greedy verification keeps
the longest draft prefix equal to the target's argmax and adds the target's next token (the
bonus), so a step emits ``accepted + 1`` tokens. Accept length = tokens emitted per verify
step, bonus included; steps with no draft are plain decodes and are not verify steps.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass


def greedy_accept(draft: Sequence[int], targets: Sequence[int]) -> int:
    """How many leading draft tokens equal the target's greedy choice at their position."""
    accepted = 0
    for proposed, target in zip(draft, targets):
        if proposed != target:
            break
        accepted += 1
    return accepted


@dataclass(frozen=True, slots=True)
class AcceptStats:
    """Verify-step statistics of one request, one pass or one cell."""

    steps: int
    emitted: int
    drafted: int
    histogram: dict[int, int]        # tokens emitted per step -> steps
    per_position: list[float]        # acceptance rate of draft position i (0-based), given it was proposed

    @property
    def mean_accept_length(self) -> float | None:
        """Tokens emitted per verify step (bonus included); None without verify steps."""
        return self.emitted / self.steps if self.steps else None

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted draft tokens / drafted tokens."""
        return (self.emitted - self.steps) / self.drafted if self.drafted else None

    def to_json(self) -> dict:
        mean = self.mean_accept_length
        rate = self.acceptance_rate
        return {"steps": self.steps, "mean_accept_length": None if mean is None else round(mean, 4),
                "acceptance_rate": None if rate is None else round(rate, 4),
                "histogram": {str(k): v for k, v in sorted(self.histogram.items())},
                "per_position": [round(p, 4) for p in self.per_position]}


def accept_stats(accepted: Sequence[int], drafted: Sequence[int]) -> AcceptStats:
    """Statistics of verify steps given, per step, accepted and drafted token counts."""
    steps = [(a, d) for a, d in zip(accepted, drafted) if d > 0]
    width = max((d for _, d in steps), default=0)
    proposed = [sum(1 for _, d in steps if d > i) for i in range(width)]
    kept = [sum(1 for a, d in steps if d > i and a > i) for i in range(width)]
    return AcceptStats(
        steps=len(steps),
        emitted=sum(a + 1 for a, _ in steps),
        drafted=sum(d for _, d in steps),
        histogram=dict(Counter(a + 1 for a, _ in steps)),
        per_position=[k / p for k, p in zip(kept, proposed)],
    )


def outputs_accept_stats(outputs: Sequence[object]) -> AcceptStats:
    """Pooled statistics of RequestOutputs (their ``accepted`` and ``drafted`` lists)."""
    accepted = [a for out in outputs for a in out.accepted]
    drafted = [d for out in outputs for d in out.drafted]
    return accept_stats(accepted, drafted)
