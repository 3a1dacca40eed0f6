"""One request's KV handoff: its state machine and the messages the two sides exchange.

The life cycle SGLang and vLLM share: the decode side preallocates (pages past its own prefix
hit, a Mamba slot, a metadata slot) and answers the bootstrap; the prefill side then runs the
request and sends chunk by chunk; the last chunk carries the non-KV state. A transfer is

    BOOTSTRAPPING → WAITING_FOR_INPUT → TRANSFERRING → SUCCESS
          └──────────────┴──────────────────┴──────→ FAILED

and a failed transfer is aborted on both sides: nothing it wrote is ever read (SGLang #30233).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from reference_impl.request import RequestSpec


class TransferState(Enum):
    BOOTSTRAPPING = "bootstrapping"            # waiting for the decode side to preallocate
    WAITING_FOR_INPUT = "waiting_for_input"    # decode side ready; the prefill side has sent nothing yet
    TRANSFERRING = "transferring"              # at least one chunk sent, the last one not yet
    SUCCESS = "success"
    FAILED = "failed"


_ALLOWED = {
    TransferState.BOOTSTRAPPING: {TransferState.WAITING_FOR_INPUT, TransferState.FAILED},
    TransferState.WAITING_FOR_INPUT: {TransferState.TRANSFERRING, TransferState.SUCCESS, TransferState.FAILED},
    TransferState.TRANSFERRING: {TransferState.TRANSFERRING, TransferState.SUCCESS, TransferState.FAILED},
    TransferState.SUCCESS: set(),
    TransferState.FAILED: set(),
}
#: states in which the decode side's physical ids may be in the prefill side's hands
IN_FLIGHT = frozenset({TransferState.WAITING_FOR_INPUT, TransferState.TRANSFERRING})


class TransferStateError(AssertionError):
    """A transfer moved to a state its life cycle does not allow (a PD bookkeeping bug)."""


class TransferFailed(RuntimeError):
    """A chunk did not arrive: the transport failed (injected with ``pd_fail_rate``, or real)."""


class TransportError(RuntimeError):
    """The transport itself is gone (a decode process died, a link broke): the run cannot go on."""


@dataclass(frozen=True, slots=True)
class StagingRegion:
    """The decode side's staging slots for one transfer: one per grid cell from ``first_cell``, from ``base`` on."""

    base: int        # first ring slot (ring positions wrap)
    first_cell: int  # grid cell of the first page sent: decode_prefix_pages // chunk_pages
    cells: int


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """The decode side's answer once it preallocated (SGLang: dst_kv_indices, the aux index, the prefix length).

    ``dst_pages`` are *physical* ids of the sequence's pages from ``decode_prefix_pages`` on,
    translated once, when the decode side popped them; they stay valid only because nothing
    moves a page while the transfer is in flight (the move gate).
    """

    rid: str
    attempt: int
    decode_prefix_pages: int
    dst_pages: tuple[int, ...]
    dst_state_slot: int | None
    aux_slot: int
    staging: StagingRegion | None


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    """The notification that ends a chunk: which pages of which request arrived, and whether it was the last."""

    rid: str
    attempt: int
    index: int
    start_page: int
    num_pages: int
    last: bool


@dataclass(slots=True)
class Transfer:
    """Prefill-side record of one attempt to hand a request over."""

    spec: RequestSpec
    attempt: int = 0
    state: TransferState = TransferState.BOOTSTRAPPING
    bootstrap: Bootstrap | None = None
    next_page: int = 0      # first page not sent yet
    chunks: int = 0
    bytes_sent: int = 0     # every byte written: KV, state and the metadata record
    kv_bytes: int = 0       # of which KV pages (every pool, every shard)
    pages_sent: int = 0
    error: str = ""
    history: list[TransferState] = field(default_factory=list)

    @property
    def rid(self) -> str:
        return self.spec.rid

    def advance(self, state: TransferState, error: str = "") -> None:
        """Move to ``state``; raises TransferStateError for a move the life cycle does not allow."""
        if state not in _ALLOWED[self.state]:
            raise TransferStateError(f"transfer {self.rid!r} (attempt {self.attempt}): {self.state.value} → {state.value}")
        self.history.append(self.state)
        self.state = state
        self.error = error or self.error
