"""The PD transport interface (``pd = inproc``, ``nixl``, ``mooncake`` or yours), and the decode side it connects to.

A pd level names a class built with no arguments (``pd = off`` names None: one engine, no
transport); the registry checks it against ``Transport`` when a matrix file names it.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from reference_impl.config import EngineConfig
from reference_impl.memory.layout import Block, RegionTable
from reference_impl.pd.handoff import Bootstrap, ChunkHeader
from reference_impl.pd.wire import WireLayout
from reference_impl.request import RequestOutput, RequestSpec

#: the ``pd = off`` level: no transport, one engine
NO_DISAGGREGATION = None


class DecodeSide(Protocol):
    """What the prefill side drives on the decode server, in this process (DecodeServer) or another (RemoteDecode)."""

    layout: WireLayout  # the decode side's transferable memory, as geometry

    def bootstrap(self, spec: RequestSpec, attempt: int) -> Bootstrap | None:
        """Preallocate for ``spec``; its physical destination ids, or None (nothing held) while there is no room."""

    def abort(self, rid: str, attempt: int) -> tuple[int, ...]:
        """Free everything the transfer held, unread; the pages it took that are still live after (none)."""

    def step(self, outputs: list[RequestOutput]) -> bool:
        """One decode step, appending finished outputs; False when nothing could run."""

    def has_work(self) -> bool:
        """Whether a request is preallocated, running or finished but not handed back."""

    def audit(self) -> list[str]:
        """The decode side's idle audit: leaks, double ownership, slots still held."""

    def engine_stats(self) -> object:
        """The decode engine's EngineStats."""

    def nan_events(self) -> list:
        """Non-finite values the decode engine's sentinel saw."""

    def counters(self) -> dict[str, int]:
        """What the decode side tells about itself (move-gate refusals, verify scratch bytes, and the staging
        regions and metadata slots taken and given back: ``pd.ledger.DECODE_COUNTS``)."""

    def close(self) -> None:
        """Stop the decode server (a child process: end it)."""


class Transport(Protocol):
    """Moves byte blocks from the prefill side's registered regions into the decode side's, then notifies.

    Ownership. Between ``bootstrap`` and the last chunk (or ``abort``) the decode side's pages named
    in the ``Bootstrap`` are written by the prefill side only, through ``write``; the decode side
    reads them only after the chunk's header arrives (``receive``), so ``write`` must have landed
    every block before it delivers the header. A block pair ``(region, offset, length)`` indexes the
    two sides' ``RegionTable``s; the transport keeps no block across calls. ``write`` raises
    ``TransferFailed`` for a lost chunk (the engine aborts and retries) and ``TransportError`` when
    the link itself is gone (the run stops).
    """

    def connect(self, config: EngineConfig) -> DecodeSide:
        """Start the decode server (here or in a child process) and return it."""

    def register(self, regions: RegionTable) -> None:
        """The prefill side's memory that blocks are read from (registered once)."""

    def write(self, pairs: Sequence[tuple[Block, Block]], header: ChunkHeader | None) -> None:
        """Copy every (source, destination) block, then deliver ``header`` (None: the bytes only)."""

    def close(self) -> None:
        """Stop whatever ``connect`` started."""
