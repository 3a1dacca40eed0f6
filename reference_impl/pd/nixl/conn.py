"""``pd = nixl``: the prefill side's end of NIXL, writing into the decode child's registered memory.

What vLLM's NixlConnector does, on CPU memory: the decode process registers its pool tensors
with its NIXL agent once and hands over the agent metadata and region addresses; for each chunk
the prefill side builds descriptor lists of its own blocks and of the decode side's (base
address + offset, the same pairing the in-process transport copies) and posts one WRITE with a
notification, which the decode side polls for before it touches the pages.
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence

from reference_impl.memory.layout import Block
from reference_impl.pd.handoff import ChunkHeader, TransportError
from reference_impl.pd.nixl.agent import NixlEndpoint, descriptors
from reference_impl.pd.remote import ChildTransport


class NixlTransport(ChildTransport):
    """The decode server in a child process; every chunk one NIXL WRITE into its registered memory."""

    name = "nixl"
    endpoint = NixlEndpoint

    def __init__(self) -> None:
        super().__init__()
        self._tags = itertools.count()

    def write(self, pairs: Sequence[tuple[Block, Block]], header: ChunkHeader | None) -> None:
        """One WRITE of every block pair with a notification; then the child receives (or just drains) it."""
        if not pairs and header is None:
            return  # a lost chunk none of whose bytes landed: nothing moves, nothing to notify or wait for
        agent, peer = self.local_end.agent, self.local_end.peer
        tag = f"kv:{next(self._tags)};".encode()
        handle = None
        try:
            if pairs:
                local = agent.get_xfer_descs(descriptors(self.local, [s for s, _ in pairs]), "DRAM")
                remote = agent.get_xfer_descs(descriptors(self.remote, [d for _, d in pairs]), "DRAM")
                handle = agent.initialize_xfer("WRITE", local, remote, peer, tag)
                if agent.transfer(handle) == "ERR":
                    raise TransportError(f"NIXL refused the write of {len(pairs)} blocks")
            else:
                agent.send_notif(peer, tag)
        except TransportError:
            raise
        except Exception as exc:  # the bindings' own errors (remote disconnected, ...): the link is gone
            raise TransportError(f"NIXL write failed ({type(exc).__name__}: {exc}); decode process exit code "
                                 f"{self._exitcode()}") from exc
        try:
            self.call("receive", header, tag, done=(lambda: self._xfer_done(handle)) if handle is not None else None)
        finally:
            if handle is not None and self.process is not None and self.process.is_alive():
                agent.release_xfer_handle(handle)

    def _xfer_done(self, xfer: object) -> bool:
        try:
            state = self.local_end.agent.check_xfer_state(xfer)
        except Exception as exc:  # the bindings' own errors: the link is gone
            raise TransportError(f"a NIXL write failed ({type(exc).__name__}: {exc})") from exc
        if state == "ERR":
            raise TransportError("a NIXL write failed")
        return state == "DONE"
