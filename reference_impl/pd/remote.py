"""A decode server in a child process: the pipe protocol every out-of-process transport shares.

The parent (the prefill side) drives the child call by call, so the two processes stay in lock
step and every run is deterministic: a chunk's bytes are written by the parent straight into the
child's registered memory (by NIXL, Mooncake, ...), and the ``receive`` call that follows makes
the child wait until that write has landed before the server scatters or adopts anything. What
differs per transport is its *endpoint*: how a side registers memory, meets its peer, and knows a
write has landed. A dead child or a silent link raises ``TransportError`` within seconds.
"""
from __future__ import annotations

import itertools
import multiprocessing
import os
import time
import traceback
from multiprocessing.connection import Connection
from typing import Protocol

import torch

from reference_impl.config import EngineConfig
from reference_impl.memory.layout import RegionTable
from reference_impl.pd.decode import DecodeServer
from reference_impl.pd.handoff import TransportError
from reference_impl.request import RequestOutput

#: seconds the child may take to start (it builds its engine) and to answer a call
START_TIMEOUT_S = 120.0
CALL_TIMEOUT_S = 60.0
_names = itertools.count()


class Endpoint(Protocol):
    """One side's end of a transport's data plane."""

    def __init__(self, name: str) -> None: ...

    def register(self, addresses: list[tuple[int, int]]) -> object:
        """Register (address, bytes) regions once; returns what the peer needs to reach this side."""

    def meet(self, peer: object) -> None:
        """Learn the peer from what its ``register`` returned."""

    def wait(self, tag: object) -> None:
        """Return once the write tagged ``tag`` has landed here (the child side)."""


class RemoteDecodeError(RuntimeError):
    """The decode child raised; the message carries its traceback."""


def serve(conn: Connection, config: EngineConfig, endpoint_type: type, name: str) -> None:
    """The child: build the server and its endpoint, announce memory and layout, answer calls until ``close``."""
    try:
        torch.set_num_threads(1)
        server = DecodeServer(config)
        endpoint = endpoint_type(name)
        info = endpoint.register(server.regions.addresses())
        conn.send(("ready", info, server.regions.addresses(), server.layout))
        endpoint.meet(conn.recv())
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            op, *args = conn.recv()
        except (EOFError, OSError):  # the parent is gone: nothing left to serve
            return
        try:
            if op == "close":
                conn.send(("ok", None))
                return
            conn.send(("ok", _call(server, endpoint, op, args)))
        except Exception:
            conn.send(("error", traceback.format_exc()))


def _call(server: DecodeServer, endpoint: Endpoint, op: str, args: list) -> object:
    if op == "receive":
        header, tag = args
        endpoint.wait(tag)
        return server.receive(header) if header is not None else None
    if op == "step":
        outputs: list = []
        return server.step(outputs), outputs
    if op in ("bootstrap", "abort", "has_work", "audit", "engine_stats", "nan_events", "counters"):
        return getattr(server, op)(*args)
    raise ValueError(f"unknown call {op!r}")


class RemoteDecode:
    """DecodeServer's interface, each call a round trip to the child process."""

    def __init__(self, transport: ChildTransport, layout: object) -> None:
        self.transport = transport
        self.layout = layout

    def bootstrap(self, *args: object) -> object:
        return self.transport.call("bootstrap", *args)

    def abort(self, rid: str, attempt: int) -> tuple[int, ...]:
        return self.transport.call("abort", rid, attempt)

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


class ChildTransport:
    """A transport whose decode server runs in a child process; subclasses name their endpoint and write."""

    name = ""
    #: the endpoint class both sides build (importable by path: the child builds its own)
    endpoint: type

    def __init__(self) -> None:
        self.process: multiprocessing.Process | None = None
        self.conn: Connection | None = None
        self.local_end: Endpoint | None = None
        self.local: list[int] = []   # base address of each prefill-side region
        self.remote: list[int] = []  # base address of each decode-side region

    def connect(self, config: EngineConfig) -> RemoteDecode:
        """Start the decode child, introduce the two endpoints, and return the handle on the child."""
        tag = f"{os.getpid()}-{next(_names)}"
        self.local_end = self.endpoint(f"prefill-{tag}")
        ctx = multiprocessing.get_context("forkserver")
        # children fork from a server that imported torch and the decode server once: ~0.6 s, not ~2 s
        ctx.set_forkserver_preload(["reference_impl.pd.remote", self.endpoint.__module__])
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=serve, args=(child, config, self.endpoint, f"decode-{tag}"), daemon=True)
        self.process.start()
        child.close()
        status, *ready = self._answer(START_TIMEOUT_S)
        if status != "ready":
            self.close()
            raise RemoteDecodeError(f"the decode child failed to start:\n{ready[0]}")
        info, addresses, layout = ready
        self.remote = [addr for addr, _ in addresses]
        self._peer_info = info
        return RemoteDecode(self, layout)

    def register(self, regions: RegionTable) -> None:
        """Register the prefill side's regions once, then meet the child (which learns this side in turn)."""
        addresses = regions.addresses()
        self.local = [addr for addr, _ in addresses]
        info = self.local_end.register(addresses)
        self.local_end.meet(self._peer_info)
        self.conn.send(info)

    # -- the pipe --------------------------------------------------------------------------
    def call(self, op: str, *args: object, done: object = None) -> object:
        """Send one call and wait for its answer, polling ``done()`` meanwhile; a dead child is TransportError."""
        if self.process is None or not self.process.is_alive():
            raise TransportError(f"the decode process is gone (exit code {self._exitcode()})")
        self.conn.send((op, *args))
        status, value = self._answer(CALL_TIMEOUT_S, done)
        if status == "error":
            raise RemoteDecodeError(f"decode child, {op}:\n{value}")
        return value

    def _answer(self, timeout: float, done: object = None) -> tuple:
        """The child's next message; ``done()`` (a write's local completion) is polled until it says True."""
        deadline = time.monotonic() + timeout
        while True:
            if done is not None and done():
                done = None
            try:
                if self.conn.poll(0.0005 if done is not None else 0.02):
                    answer = self.conn.recv()
                    break
            except (EOFError, OSError) as exc:
                raise TransportError(f"the decode process closed its pipe (exit code {self._exitcode()})") from exc
            if not self.process.is_alive():
                raise TransportError(f"the decode process died (exit code {self._exitcode()})")
            if time.monotonic() > deadline:
                raise TransportError(f"the decode process did not answer in {timeout:g} s")
        while done is not None and not done():
            if time.monotonic() > deadline:
                raise TransportError(f"a write did not complete in {timeout:g} s")
        return answer

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
            except (EOFError, OSError):
                pass
        self.process.join(5.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5.0)
        self.conn.close()
        self.process = None
