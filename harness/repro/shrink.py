"""Shrinking a workload while a cell's failure still shows: fewer requests, fewer rounds, fewer decoded tokens,
shorter prompts, each candidate run on the engine (C-Reduce's interestingness test: ``fails``).

Requests go first (``ddmin`` over them, rounds kept in order, an emptied round gone), then the rounds are merged
into one where that still fails, then every request's ``max_new_tokens`` is halved (all together, then each alone),
then the prompts lose token runs, each dropped whole or halved (``halve``). A run is a *segment* of the prompts'
prefix tree: tokens that the same set of prompts shares (a shared system prompt is one segment, each request's own
tail another), so a run is dropped or halved in every prompt that holds it at once and a shared prefix stays shared;
where the check needs it whole, the candidate that cut it passes and is thrown away. The four steps repeat until
none shrinks (or the budget is spent).

This shrinks the fixed workloads, whose structure (a spill's flushes, a template's heads) no strategy regenerates. A
boundary draw is never shrunk here: Hypothesis shrank it on the engine as the cell ran (``harness.run.boundary``),
and ``harness repro`` takes it as the row recorded it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from fixtures.workloads import Workload
from fixtures.workloads.expect import common_prefix
from harness.repro.ddmin import Budget, BudgetSpent, ddmin
from harness.sut.script.text import shrink_text
from reference_impl.request import RequestSpec

#: times the four steps are repeated at most (each pass after the first only finds what an earlier cut enabled).
MAX_PASSES = 3


@dataclass(frozen=True, slots=True)
class Size:
    """What a shrink makes smaller: requests, rounds, prompt tokens and decoded tokens in all."""

    requests: int
    rounds: int
    prompt_tokens: int
    decoded_tokens: int

    @classmethod
    def of(cls, workload: Workload) -> Size:
        return cls(len(workload.requests), len(workload.rounds()), sum(len(r.prompt) for r in workload.requests),
                   sum(r.max_new_tokens for r in workload.requests))

    def smaller_than(self, other: Size) -> bool:
        """No measure larger and one strictly smaller."""
        pairs = list(zip(self.as_tuple(), other.as_tuple()))
        return all(a <= b for a, b in pairs) and any(a < b for a, b in pairs)

    def as_tuple(self) -> tuple[int, int, int, int]:
        return self.requests, self.rounds, self.prompt_tokens, self.decoded_tokens


@dataclass(frozen=True, slots=True)
class Shrunk:
    """A shrink's result: the workload, its size before and after, and the runs it spent of those its budget had
    left when it began."""

    workload: Workload
    before: Size
    after: Size
    runs: int
    budget: int

    def text(self) -> str:
        """``requests 12 → 2, rounds 1 → 1, prompt tokens 480 → 23, decoded tokens 96 → 2; 37 of 58 runs``."""
        return shrink_text(self.to_json())

    def to_json(self) -> dict:
        names = ("requests", "rounds", "prompt_tokens", "decoded_tokens")
        return {"before": dict(zip(names, self.before.as_tuple())), "after": dict(zip(names, self.after.as_tuple())),
                "runs": self.runs, "budget": self.budget}


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of prompt tokens ``path[start:end]`` that every prompt beginning with ``path`` holds."""

    start: int
    end: int
    path: tuple[int, ...]

    def edit(self, sequence: tuple[int, ...], tokens: tuple[int, ...]) -> tuple[int, ...]:
        """``sequence`` with this run replaced by ``tokens`` where it holds the run, else as it is."""
        if sequence[: self.end] != self.path:
            return sequence
        return sequence[: self.start] + tokens + sequence[self.end :]


def segments(prompts: Sequence[tuple[int, ...]], head: tuple[int, ...] = ()) -> list[Segment]:
    """The prompts cut wherever the set of prompts (and ``head``) sharing a prefix changes, longest run first."""
    sequences = [*prompts, *([head] if head else [])]
    found: dict[tuple[int, int, tuple[int, ...]], Segment] = {}
    for i, prompt in enumerate(prompts):
        cuts = {0, len(prompt)} | {n for j, other in enumerate(sequences) if j != i
                                   if 0 < (n := common_prefix(prompt, other)) < len(prompt)}
        points = sorted(cuts)
        for a, b in zip(points, points[1:]):
            found.setdefault((a, b, prompt[:b]), Segment(a, b, prompt[:b]))
    order = list(found.values())
    return sorted(order, key=lambda s: (-(s.end - s.start), order.index(s)))


@dataclass(frozen=True, slots=True)
class Draft:
    """A candidate's content: the requests, the round each is served in, and the workload's shared head."""

    requests: tuple[RequestSpec, ...]
    rounds: tuple[int, ...]
    head: tuple[int, ...] = ()

    @classmethod
    def of(cls, workload: Workload) -> Draft:
        rounds = tuple(i for i, group in enumerate(workload.rounds()) for _ in group)
        return cls(workload.requests, rounds, workload.head)

    def keep(self, indices: Sequence[int]) -> Draft:
        return Draft(tuple(self.requests[i] for i in indices), tuple(self.rounds[i] for i in indices), self.head)

    def edit(self, segment: Segment, tokens: tuple[int, ...]) -> Draft:
        requests = tuple(replace(r, prompt=segment.edit(r.prompt, tokens)) for r in self.requests)
        return Draft(requests, self.rounds, segment.edit(self.head, tokens) if self.head else self.head)

    def decoded(self, lengths: Sequence[int]) -> Draft:
        requests = tuple(replace(r, max_new_tokens=n) for r, n in zip(self.requests, lengths))
        return Draft(requests, self.rounds, self.head)

    @property
    def valid(self) -> bool:
        """Something to serve: at least one request, every prompt at least one token, every request one to decode."""
        return bool(self.requests) and all(r.prompt and r.max_new_tokens >= 1 for r in self.requests)

    def workload(self, original: Workload, name: str) -> Workload:
        """The workload this draft describes, ``original``'s other settings kept (its tails and recalled requests
        narrowed to the requests left)."""
        sizes: list[int] = []
        for i, group in enumerate(self.rounds):
            if i and group == self.rounds[i - 1]:
                sizes[-1] += 1
            else:
                sizes.append(1)
        rids = {r.rid for r in self.requests}
        return replace(original, name=name, requests=self.requests, round_sizes=tuple(sizes) if len(sizes) > 1 else (),
                       head=self.head, tails=frozenset(original.tails & rids),
                       recalled=tuple((rid, n) for rid, n in original.recalled if rid in rids))


class Shrinker:
    """Shrinks ``workload`` while ``fails`` holds, each new candidate one run of the budget (a candidate already
    tried is never run again)."""

    def __init__(self, workload: Workload, fails: Callable[[Workload], bool], budget: Budget,
                 name: str | None = None) -> None:
        self.original, self.budget = workload, budget
        self.name = name or f"{workload.name}.shrunk"
        self._fails = fails
        self._tried: dict[Draft, bool] = {}
        self.current = Draft.of(workload)

    def test(self, draft: Draft) -> bool:
        """Whether ``draft`` still fails: run it unless it is empty or already tried; raises ``BudgetSpent``."""
        if not draft.valid:
            return False
        if draft not in self._tried:
            self.budget.take()
            self._tried[draft] = self._fails(draft.workload(self.original, self.name))
        return self._tried[draft]

    def run(self) -> Shrunk:
        """Shrink until no step finds a smaller failing workload, or the budget is spent."""
        spent_before, left = self.budget.spent, self.budget.left
        try:
            for _ in range(MAX_PASSES):
                start = self.current
                for step in (self._requests, self._rounds, self._decoded, self._prompts):
                    step()
                if self.current == start:
                    break
        except BudgetSpent:
            pass
        workload = self.current.workload(self.original, self.name)
        return Shrunk(workload, Size.of(self.original), Size.of(workload), self.budget.spent - spent_before, left)

    def _requests(self) -> None:
        kept = ddmin(range(len(self.current.requests)), lambda keep: self.test(self.current.keep(keep)))
        self.current = self.current.keep(kept)

    def _rounds(self) -> None:
        if len(set(self.current.rounds)) > 1:
            merged = Draft(self.current.requests, (0,) * len(self.current.requests), self.current.head)
            if self.test(merged):
                self.current = merged

    def _decoded(self) -> None:
        """Halve every request's decoded tokens together while that fails, then each request's alone (1 first)."""
        while True:
            lengths = [max(1, r.max_new_tokens // 2) for r in self.current.requests]
            halved = self.current.decoded(lengths)
            if halved == self.current or not self.test(halved):
                break
            self.current = halved
        for i in range(len(self.current.requests)):
            while (n := self.current.requests[i].max_new_tokens) > 1:
                lengths = [r.max_new_tokens for r in self.current.requests]
                tries = [self.current.decoded([*lengths[:i], m, *lengths[i + 1:]]) for m in dict.fromkeys((1, n // 2))]
                found = next((d for d in tries if self.test(d)), None)
                if found is None:
                    break
                self.current = found

    def _prompts(self) -> None:
        """Drop or halve token runs (``halve``), longest run first; after a run shrinks the runs are cut anew."""
        progress = True
        while progress:
            progress = False
            prompts = [r.prompt for r in self.current.requests]
            for segment in segments(prompts, self.current.head):
                tokens = segment.path[segment.start :]
                kept = halve(tokens, lambda t: self.test(self.current.edit(segment, t)))
                if len(kept) < len(tokens):
                    self.current = self.current.edit(segment, kept)
                    progress = True
                    break


def halve(tokens: tuple[int, ...], fails: Callable[[tuple[int, ...]], bool]) -> tuple[int, ...]:
    """The run ``tokens`` dropped whole where that still fails, else its first or its second half, and so on down:
    at most three runs per halving, where ``ddmin`` would try every token of a run that cannot go (a run the
    failure needs for its size alone, to fill a pool, say)."""
    while tokens:
        half = len(tokens) // 2
        candidates = dict.fromkeys([(), *([tokens[:half], tokens[half:]] if half else [])])
        found = next((c for c in candidates if fails(c)), None)
        if found is None:
            return tokens
        tokens = found
    return tokens
