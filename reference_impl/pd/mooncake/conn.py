"""``pd = mooncake``: SGLang's default PD transport, Mooncake's transfer engine, over TCP on loopback.

Each side runs a TransferEngine in peer-to-peer handshake mode (no metadata server), registers its
regions once and is known to the other by its session (host:port); the prefill side moves a
chunk's block pairs with one synchronous batch write (``batch_transfer_sync_write``, what SGLang's
MooncakeKVManager calls) and then tells the decode child, which needs no notification: the write
has landed before the call that follows it. The non-CUDA wheel runs on CPU memory and needs
Debian's ``libibverbs1`` (not ``ibverbs-providers``: NIXL processes segfault at exit with it).
"""
from __future__ import annotations

import os
from collections.abc import Sequence

from reference_impl.memory.layout import Block
from reference_impl.pd.handoff import ChunkHeader, TransportError
from reference_impl.pd.remote import ChildTransport

# Mooncake logs through glog to stderr, every handshake at INFO: only errors in a run's output (one
# remains per engine at start-up, "Local segment descriptor not found", which is harmless).
os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
#: how the wheel and its one system library are installed (make and .ci/run do both)
INSTALL_HINT = ("pip install mooncake-transfer-engine-non-cuda==0.3.13.post1 and "
                "apt-get install --no-install-recommends libibverbs1")


#: blocks per batch write: the 0.3.13 engine refuses a batch of 4,096 (measured: 2,048 goes through)
MAX_BATCH = 2048


class MooncakeUnavailable(RuntimeError):
    """The Mooncake wheel is not installed, or its transfer engine did not start."""


class MooncakeEndpoint:
    """A Mooncake TransferEngine over TCP on loopback, peer-to-peer handshake, with its registered memory."""

    def __init__(self, name: str) -> None:
        try:
            from mooncake.engine import TransferEngine
        except ImportError as exc:
            raise MooncakeUnavailable(f"pd = mooncake needs {INSTALL_HINT} ({exc})") from exc
        self.engine = TransferEngine()
        if self.engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
            raise MooncakeUnavailable("Mooncake's transfer engine did not start on 127.0.0.1 over TCP")
        self.session = f"127.0.0.1:{self.engine.get_rpc_port()}"
        self.peer = ""

    def register(self, addresses: list[tuple[int, int]]) -> str:
        """Register each (address, bytes) region once; returns this side's session for the peer."""
        for addr, size in addresses:
            if size and self.engine.register_memory(addr, size) != 0:
                raise MooncakeUnavailable(f"Mooncake refused to register {size} bytes at {addr:#x}")
        return self.session

    def meet(self, session: str) -> None:
        self.peer = session

    def wait(self, tag: object) -> None:
        """Nothing to wait for: the parent's write was synchronous and completed before it called."""


class MooncakeTransport(ChildTransport):
    """The decode server in a child process; every chunk one synchronous batch write over TCP."""

    name = "mooncake"
    endpoint = MooncakeEndpoint

    def write(self, pairs: Sequence[tuple[Block, Block]], header: ChunkHeader | None) -> None:
        """Write every block pair, then let the child receive the chunk."""
        for first in range(0, len(pairs), MAX_BATCH):
            batch = pairs[first : first + MAX_BATCH]
            sources = [self.local[region] + offset for (region, offset, _), _ in batch]
            targets = [self.remote[region] + offset for _, (region, offset, _) in batch]
            lengths = [length for (_, _, length), _ in batch]
            rc = self.local_end.engine.batch_transfer_sync_write(self.local_end.peer, sources, targets, lengths)
            if rc != 0:
                raise TransportError(f"Mooncake write of {len(batch)} blocks failed (code {rc}); decode process "
                                     f"exit code {self._exitcode()}")
        self.call("receive", header, None)
