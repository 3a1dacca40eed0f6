"""The decode child: a DecodeServer behind a pipe, its pool memory registered with NIXL once.

The parent (the prefill side) drives it call by call, so the two processes stay in lock step
and every run is deterministic: a chunk's bytes are written by the parent straight into this
process's pool memory, and the ``receive`` call that follows polls until that write's
notification has arrived before the server scatters or adopts anything.
"""
from __future__ import annotations

import time
import traceback
from multiprocessing.connection import Connection

import torch

from reference_impl.config import EngineConfig
from reference_impl.pd.decode import DecodeServer
from reference_impl.pd.nixl.agent import make_agent, register
from reference_impl.pd.transfer import TransportError

#: seconds a receive may wait for its write's notification
NOTIF_TIMEOUT_S = 60.0


def wait_notification(agent: object, peer: str, tag: bytes) -> None:
    """Poll until the write tagged ``tag`` has landed (no progress thread: polling is what moves it)."""
    deadline = time.monotonic() + NOTIF_TIMEOUT_S
    while not agent.check_remote_xfer_done(peer, tag):
        if time.monotonic() > deadline:
            raise TransportError(f"no NIXL notification {tag!r} from {peer} in {NOTIF_TIMEOUT_S:g} s")


def serve(conn: Connection, config: EngineConfig, name: str, peer: str) -> None:
    """Build the server, announce its memory and layout, then answer calls until ``close``."""
    try:
        torch.set_num_threads(1)
        server = DecodeServer(config)
        agent = make_agent(name)
        register(agent, server.regions.addresses())
        conn.send(("ready", agent.get_agent_metadata(), server.regions.addresses(), server.layout))
        agent.add_remote_agent(conn.recv())
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
            conn.send(("ok", _call(server, agent, peer, op, args)))
        except Exception:
            conn.send(("error", traceback.format_exc()))


def _call(server: DecodeServer, agent: object, peer: str, op: str, args: list) -> object:
    if op == "receive":
        header, tag = args
        wait_notification(agent, peer, tag)
        return server.receive(header) if header is not None else None
    if op == "step":
        outputs: list = []
        return server.step(outputs), outputs
    if op in ("bootstrap", "abort", "has_work", "audit", "engine_stats", "nan_events", "counters"):
        return getattr(server, op)(*args)
    raise ValueError(f"unknown call {op!r}")
