"""``pd = nixl``: the prefill side's end of NIXL, and its handle on the decode child.

What vLLM's NixlConnector does, on CPU memory: the decode process registers its pool tensors
with its NIXL agent once and hands over the agent metadata and region addresses; for each chunk
the prefill side builds descriptor lists of its own blocks and of the decode side's (base
address + offset, the same pairing the in-process transport copies) and posts one WRITE with a
notification, which the decode side polls for. A dead child or a silent link ends the run with
``TransportError`` within seconds, never a hang.
"""
from __future__ import annotations

import itertools
import multiprocessing
import os
import time
from collections.abc import Sequence

from reference_impl.config import EngineConfig
from reference_impl.memory.layout import Block, RegionTable
from reference_impl.pd.nixl.agent import descriptors, make_agent, register
from reference_impl.pd.nixl.worker import serve
from reference_impl.pd.transfer import ChunkHeader, TransportError
from reference_impl.request import RequestOutput

#: seconds the child may take to start (a fresh interpreter imports torch) and to answer a call
START_TIMEOUT_S = 120.0
CALL_TIMEOUT_S = 60.0
_names = itertools.count()


class RemoteDecodeError(RuntimeError):
    """The decode child raised; the message carries its traceback."""


class RemoteDecode:
    """DecodeServer's interface, each call a round trip to the child process."""

    def __init__(self, transport: NixlTransport, layout: object) -> None:
        self.transport = transport
        self.layout = layout

    def bootstrap(self, *args: object) -> object:
        return self.transport.call("bootstrap", *args)

    def abort(self, rid: str, attempt: int) -> None:
        self.transport.call("abort", rid, attempt)

    def step(self, outputs: list[RequestOutput]) -> bool:
        progressed, done = self.transport.call("step")
        outputs.extend(done)
        return progressed

    def has_work(self) -> bool:
        return self.transport.call("has_work")

    def audit(self) -> list[str]:
        return self.transport.call("audit")

    def engine_stats(self) -> object:
        return self.transport.call("engine_stats")

    def nan_events(self) -> list:
        return self.transport.call("nan_events")

    def counters(self) -> dict[str, int]:
        return self.transport.call("counters")

    def close(self) -> None:
        self.transport.close()


class NixlTransport:
    """Starts the decode child, then moves every chunk as one NIXL WRITE into its registered memory."""

    name = "nixl"

    def __init__(self) -> None:
        self.process: multiprocessing.Process | None = None
        self.conn = None
        self.agent = None
        self.local: list[int] = []
        self.remote: list[int] = []
        self._tags = itertools.count()

    def connect(self, config: EngineConfig) -> RemoteDecode:
        """Spawn the decode child, exchange agent metadata, and return the handle on it."""
        tag = f"{os.getpid()}-{next(_names)}"
        name, peer = f"prefill-{tag}", f"decode-{tag}"
        self.agent = make_agent(name)
        ctx = multiprocessing.get_context("forkserver")
        # children fork from a server that imported torch and the decode server once: ~0.3 s, not ~2 s
        ctx.set_forkserver_preload(["reference_impl.pd.nixl.worker"])
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=serve, args=(child, config, peer, name), daemon=True)
        self.process.start()
        child.close()
        status, *ready = self._answer(START_TIMEOUT_S)
        if status != "ready":
            self.close()
            raise RemoteDecodeError(f"the decode child failed to start:\n{ready[0]}")
        metadata, addresses, layout = ready
        self.peer = self.agent.add_remote_agent(metadata)
        self.conn.send(self.agent.get_agent_metadata())
        self.remote = [addr for addr, _ in addresses]
        return RemoteDecode(self, layout)

    def register(self, regions: RegionTable) -> None:
        """Register the prefill side's regions (pools, metadata row, staging send buffers) once."""
        register(self.agent, regions.addresses())
        self.local = [addr for addr, _ in regions.addresses()]

    def write(self, pairs: Sequence[tuple[Block, Block]], header: ChunkHeader | None) -> None:
        """One WRITE of every block pair with a notification; then the child receives (or just drains) it."""
        tag = f"kv:{next(self._tags)};".encode()
        handle = None
        try:
            if pairs:
                local = self.agent.get_xfer_descs(descriptors(self.local, [s for s, _ in pairs]), "DRAM")
                remote = self.agent.get_xfer_descs(descriptors(self.remote, [d for _, d in pairs]), "DRAM")
                handle = self.agent.initialize_xfer("WRITE", local, remote, self.peer, tag)
                if self.agent.transfer(handle) == "ERR":
                    raise TransportError(f"NIXL refused the write of {len(pairs)} blocks")
            else:
                self.agent.send_notif(self.peer, tag)
        except TransportError:
            raise
        except Exception as exc:  # the bindings' own errors (remote disconnected, ...): the link is gone
            raise TransportError(f"NIXL write failed ({type(exc).__name__}: {exc}); decode process exit code "
                                 f"{self._exitcode()}") from exc
        try:
            self.call("receive", header, tag, xfer=handle)
        finally:
            if handle is not None and self.process is not None and self.process.is_alive():
                self.agent.release_xfer_handle(handle)

    # -- the pipe --------------------------------------------------------------------------
    def call(self, op: str, *args: object, xfer: object = None) -> object:
        """Send one call and wait for its answer, polling ``xfer`` meanwhile; a dead child is TransportError."""
        if self.process is None or not self.process.is_alive():
            raise TransportError(f"the decode process is gone (exit code {self._exitcode()})")
        self.conn.send((op, *args))
        status, value = self._answer(CALL_TIMEOUT_S, xfer)
        if status == "error":
            raise RemoteDecodeError(f"decode child, {op}:\n{value}")
        return value

    def _answer(self, timeout: float, xfer: object = None) -> tuple:
        deadline = time.monotonic() + timeout
        while True:
            if xfer is not None and self._xfer_done(xfer):
                xfer = None
            try:
                if self.conn.poll(0.0005 if xfer is not None else 0.02):
                    answer = self.conn.recv()
                    break
            except (EOFError, OSError) as exc:
                raise TransportError(f"the decode process closed its pipe (exit code {self._exitcode()})") from exc
            if not self.process.is_alive():
                raise TransportError(f"the decode process died (exit code {self._exitcode()})")
            if time.monotonic() > deadline:
                raise TransportError(f"the decode process did not answer in {timeout:g} s")
        while xfer is not None and not self._xfer_done(xfer):
            if time.monotonic() > deadline:
                raise TransportError(f"a NIXL write did not complete in {timeout:g} s")
        return answer

    def _xfer_done(self, xfer: object) -> bool:
        try:
            state = self.agent.check_xfer_state(xfer)
        except Exception as exc:  # the bindings' own errors: the link is gone
            raise TransportError(f"a NIXL write failed ({type(exc).__name__}: {exc})") from exc
        if state == "ERR":
            raise TransportError("a NIXL write failed")
        return state == "DONE"

    def _exitcode(self) -> object:
        return self.process.exitcode if self.process is not None else None

    def close(self) -> None:
        """Ask the child to stop; kill it if it does not within seconds."""
        if self.process is None:
            return
        if self.process.is_alive():
            try:
                self.conn.send(("close",))
                self.conn.poll(5.0)
            except (EOFError, OSError, BrokenPipeError):
                pass
        self.process.join(5.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5.0)
        self.conn.close()
        self.process = None
