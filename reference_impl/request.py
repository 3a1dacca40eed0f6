"""Requests: what a client submits, what the engine tracks, and what it hands back."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """A client request: greedy decoding of exactly ``max_new_tokens`` tokens after ``prompt``."""

    rid: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    priority: int = 0  # lower runs first under the priority scheduler (vLLM's convention)


#: where a cached page can come from: L1 (device pool), L2 (host pool), L3 (storage).
TIERS = ("device", "host", "storage")


@dataclass(slots=True, kw_only=True)
class RequestOutput:
    """What the engine returns for one request, once, when it finishes or is rejected.

    Keyword-only, so that a reordered field cannot silently swap two lists of an oracle's input.
    """

    rid: str
    tokens: list[int]
    logprobs: list[float]            # logprob of each emitted token
    top_ids: list[list[int]]         # top-k token ids per step
    top_logprobs: list[list[float]]  # their logprobs
    margins: list[float]             # top-1 minus top-2 logit per step (tie detection)
    cached_tokens: int               # prompt tokens served from the prefix cache at first admission
    finish_reason: str               # "length", "rejected" or (PD) "aborted"
    error: str = ""
    preemptions: int = 0             # times the request was preempted and recomputed
    accepted: list[int] = field(default_factory=list)  # per decode step: draft tokens accepted
    drafted: list[int] = field(default_factory=list)   # per decode step: draft tokens proposed (0 = plain decode)
    cached_device: int = 0           # of cached_tokens: already in the device pool (L1)
    cached_host: int = 0             # of cached_tokens: loaded back from the host pool (L2)
    cached_storage: int = 0          # of cached_tokens: loaded back from storage (L3)

    @classmethod
    def empty(cls, rid: str, finish_reason: str, reason: str = "") -> RequestOutput:
        """An output with no token yet: a new request's (``"length"``), or one that will get none, saying why."""
        return cls(rid=rid, tokens=[], logprobs=[], top_ids=[], top_logprobs=[], margins=[], cached_tokens=0,
                   finish_reason=finish_reason, error=reason)

    def cached_by_tier(self) -> dict[str, int]:
        """cached_tokens split by the tier each page was in at admission, keyed as in ``TIERS``."""
        return {"device": self.cached_device, "host": self.cached_host, "storage": self.cached_storage}


class Phase(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Request:
    """Engine-side state of one request.

    Memory it owns while RUNNING: ``pages`` (virtual page ids, in sequence order) of which
    the first ``len(cache_pages)`` belong to the prefix cache and are only locked through
    ``cache_node``; the rest, ``state_slot`` and the ``checkpoint_slots`` are the request's
    own, freed or handed to the cache when it finishes or is preempted.
    """

    spec: RequestSpec
    arrival: int
    output: RequestOutput
    phase: Phase = Phase.WAITING
    admitted_once: bool = False
    num_computed: int = 0          # tokens whose K/V (and Mamba state) are in the pool
    pages: list[int] = field(default_factory=list)
    cache_pages: list[int] = field(default_factory=list)
    cache_node: object = None
    state_slot: int | None = None
    checkpoint_slots: dict[int, int] = field(default_factory=dict)  # position -> virtual state slot
    draft_tail: object = None      # spec=draft: the draft's hidden at the last computed position

    @property
    def rid(self) -> str:
        return self.spec.rid

    @property
    def priority(self) -> int:
        return self.spec.priority

    def all_tokens(self) -> list[int]:
        """Prompt followed by every token emitted so far: what a recompute must rebuild."""
        return [*self.spec.prompt, *self.output.tokens]

    @property
    def seq_len(self) -> int:
        return len(self.spec.prompt) + len(self.output.tokens)

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < self.seq_len - 1 or not self.output.tokens

    @property
    def done(self) -> bool:
        return len(self.output.tokens) >= self.spec.max_new_tokens


@dataclass(slots=True)
class Chunk:
    """Tokens ``start .. start+length-1`` of a request's sequence, computed in this step."""

    req: Request
    start: int
    length: int
    checkpoints: dict[int, int] = field(default_factory=dict)  # position -> virtual state slot
    draft: list[int] | None = None  # a verify chunk: the last token is followed by these draft tokens

    @property
    def samples(self) -> bool:
        """The chunk reaches the end of the known sequence, so its last logits pick the next token."""
        return self.start + self.length == self.req.seq_len
