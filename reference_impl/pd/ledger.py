"""PD's own bookkeeping, attempt by attempt and pass by pass: the facts the ``pd_audit`` oracle judges.

Each side writes down what it did, in its own terms, and judges nothing: the prefill side the hit
it matched when it admitted a request and the pages it sent, the decode side the hit it answered the
bootstrap with, the staging regions and metadata slots it took and gave back, its verify scratch, and
what an aborted attempt left live in its pool. The oracle compares these records with each other, with
the prompts and with what the client saw (``harness/oracles/pd_audit.py``), so a slip in one side's
accounting cannot hide behind the same slip in the check.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

#: the decode side's counters a pass's ledger reports as differences (what the pass took and gave back)
DECODE_COUNTS = ("staging_reserved", "staging_released", "aux_taken", "aux_returned")


@dataclass(slots=True)
class AttemptRecord:
    """One attempt to hand a request over, as both sides recorded it."""

    rid: str
    attempt: int
    prompt_tokens: int
    decode_hit_pages: int                 # the decode side's own prefix hit, from its bootstrap answer
    pages_sent: int = 0                   # whole pages the sender wrote (every chunk that left)
    outcome: str = "in_flight"            # "success" | "failed" once the attempt ended
    prefill_hit: tuple[int, int, int] | None = None  # (total, host, storage) the prefill side matched at admission
    prefill_held_after: bool = False      # failed: the prefill side still held the request after its abort
    decode_live_after: tuple[int, ...] = ()  # failed: pages the attempt took that were still live after its abort

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(slots=True)
class PassLedger:
    """What a PD engine recorded over one pass: every attempt, the decode side's takes and returns, scratch."""

    attempts: list[AttemptRecord] = field(default_factory=list)
    decode: dict[str, int] = field(default_factory=dict)       # DECODE_COUNTS over the pass
    verify_scratch_bytes: dict[str, int] = field(default_factory=dict)  # per side, as allocated

    def to_json(self) -> dict[str, object]:
        return {"attempts": [a.to_json() for a in self.attempts], "decode": dict(self.decode),
                "verify_scratch_bytes": dict(self.verify_scratch_bytes)}
