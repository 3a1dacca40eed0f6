"""``pd = inproc``: both engines in this process; blocks are copied byte for byte between their regions.

A transport does two things: ``connect`` starts the decode server (in this process, or in
another one) and returns it, and ``write`` moves byte blocks from the prefill side's regions
into the decode side's and then delivers the chunk's notification. The sender and the decode
server are the same code whatever the transport (SGLang keeps a "fake" backend for tests that
goes through the same sender and receiver; this is ours). The interface a transport offers is
``pd.base.Transport``.
"""
from __future__ import annotations

from collections.abc import Sequence

from reference_impl.config import EngineConfig
from reference_impl.memory.layout import Block, RegionTable
from reference_impl.pd.decode import DecodeServer
from reference_impl.pd.handoff import ChunkHeader


class InprocTransport:
    """``pd = inproc``: both engines in this process; blocks are copied byte for byte between their regions."""

    name = "inproc"

    def __init__(self) -> None:
        self.decode: DecodeServer | None = None
        self.source: RegionTable | None = None

    def connect(self, config: EngineConfig) -> DecodeServer:
        """Build the decode server here."""
        self.decode = DecodeServer(config)
        return self.decode

    def register(self, regions: RegionTable) -> None:
        """The prefill side's memory that blocks are read from."""
        self.source = regions

    def write(self, pairs: Sequence[tuple[Block, Block]], header: ChunkHeader | None) -> None:
        """Copy every (source, destination) block, then deliver ``header`` (None: the bytes only, no notification)."""
        src, dst = self.source.regions, self.decode.regions.regions
        for (s_region, s_offset, length), (d_region, d_offset, _) in pairs:
            dst[d_region][d_offset : d_offset + length].copy_(src[s_region][s_offset : s_offset + length])
        if header is not None:
            self.decode.receive(header)

    def close(self) -> None:
        """Nothing outside this process to stop."""
